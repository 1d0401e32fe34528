"""xprof's own `diff_sessions` on two raw profiles, in a worker process with a deadline.

`diff_sessions` (xprof's CLI tool) converts both profiles again for their kernel statistics,
KPIs and HLO stats and compares kernel totals. mldiag's diff reads neither raw profile (it
works on stored snapshots); where kernel statistics exist (GPU profiles) it asks xprof for
this kernel diff too. Like every xprof call here it runs in a private workspace (both sessions
symlinked under one run directory, xprof's cache pointed inside it) in a killable worker.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mldiag.analysis.collection.profile_input import ProfileSession
from mldiag.analysis.collection.workers import DATA, Job, default_budget_bytes, reason_of, run_jobs
from mldiag.analysis.collection.xprof_tools import _new_root

DEFAULT_TIMEOUT_S = 300.0
_SIDES = ("baseline", "candidate")


def _root(a: ProfileSession, b: ProfileSession) -> Path:
    root = _new_root()
    for name, session in zip(_SIDES, (a, b), strict=True):
        run_dir = root / "plugins" / "profile" / name
        run_dir.mkdir(parents=True)
        for xplane in session.xplanes:
            (run_dir / xplane.name).symlink_to(xplane.resolve())
    (root / "xprof_cache").mkdir()
    return root


def attach(args: Mapping[str, Any], worker: Mapping[str, Any]) -> Path:
    """Worker setup: xprof's result cache inside the private workspace."""
    from xprof.cli.internal import decorators

    root = Path(args["root"])
    cache_dir = root / "xprof_cache"
    decorators.get_cache_dir = lambda: cache_dir
    decorators._GLOBAL_CACHE = decorators.Cache(cache_dir / "results-diff")
    return root


def diff(root: Path, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The job: xprof's diff_sessions of the two run directories, parsed."""
    from xprof.cli.tools.oss import diff_sessions_tool

    runs = [str(root / "plugins" / "profile" / name) for name in _SIDES]
    out = json.loads(diff_sessions_tool.diff_sessions(baseline_session_id=runs[0],
                                                      optimized_session_id=runs[1]))
    if not isinstance(out, dict):
        raise ValueError("diff_sessions answered no JSON object")
    # Its markdown repeats the table, and the ids are the private workspace's paths.
    for key in ("markdown_summary", "baseline_session_id", "optimized_session_id"):
        out.pop(key, None)
    return out


def xprof_diff(a: ProfileSession, b: ProfileSession, *,
               timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[dict[str, Any] | None, str]:
    """(xprof's diff_sessions output, "") or (None, why it is missing)."""
    root = _root(a, b)
    try:
        job = Job(name="diff_sessions", group="xprof-diff",
                  runner="mldiag.analysis.diff.xprof:diff", timeout_s=timeout_s)
        outcome = run_jobs([job], setup="mldiag.analysis.diff.xprof:attach",
                           setup_args={"root": str(root)}, budget_bytes=default_budget_bytes(),
                           default_timeout_s=timeout_s)["diff_sessions"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if outcome.status != DATA or not isinstance(outcome.value, dict):
        return None, f"xprof diff_sessions: {reason_of(outcome)}"
    return outcome.value, ""
