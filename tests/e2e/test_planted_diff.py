"""`mldiag diff` on real JAX profiles that change in known ways between two captures
(`scripts/workloads/regression.py`): each diff ranks the planted change first."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mldiag.bootstrap import bootstrap
from mldiag.cli.main import main
from mldiag.model import REPORTED, SessionRecord
from mldiag.settings import Settings
from tests.e2e.conftest import WORKLOADS

pytestmark = pytest.mark.slow

# The planted change and the kind of change the explanation must rank first.
PLANTED = {"stall": "host_wait", "layout": "layout_change", "batch": "shape_change",
           "collective": "new_collective"}
# One change in one line that recompiles the program, XLA renaming its fusions: the kind the
# explanation must rank first, and the fused opcodes it must name.
RECOMPILED = {"transpose": ("layout_change", "transpose"), "dtype": ("dtype_change", "f16"),
              "fusion": ("fusion_change", "exponential")}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """change -> the session directories of its two captures. Every pair is profiled in one
    process on first use (JAX starts once)."""
    logdir = tmp_path_factory.mktemp("pairs")
    done: list[bool] = []

    def make(change: str) -> tuple[Path, Path]:
        if not done:
            subprocess.run([sys.executable, str(WORKLOADS / "regression.py"), "--logdir",
                            str(logdir), "--change", ",".join([*PLANTED, *RECOMPILED]),
                            # 16 steps a side: a burst of load on a shared machine then
                            # slows only some steps of one capture, not all of them.
                            "--steps", "16"],
                           check=True,
                           timeout=300, capture_output=True,
                           env={**os.environ, "JAX_PLATFORMS": "cpu"})
            done.append(True)
        dirs = []
        for side in ("before", "after"):
            (session,) = (logdir / change / side / "plugins" / "profile").iterdir()
            dirs.append(session)
        return dirs[0], dirs[1]

    return make


def diff_paths(a: Path, b: Path, out: Path, capsys: pytest.CaptureFixture[str]
               ) -> tuple[dict[str, Any], str]:
    """`mldiag diff A B` on two profile paths (each analysed first), as a user runs it."""
    code = main(["diff", str(a), str(b), "--out", str(out), "-q"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    return json.loads((out / "diff.json").read_text()), printed


@pytest.mark.parametrize("change", sorted(PLANTED))
def test_the_planted_change_is_ranked_first(change: str, pair: Any, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    before, after = pair(change)
    doc, printed = diff_paths(before, after, tmp_path, capsys)
    top = doc["explanation"][0]
    assert top["kind"] == PLANTED[change], json.dumps(doc["explanation"], indent=1)
    assert top["evidence"], top
    step = next(k for k in doc["kpis"] if k["name"] == "step time")
    if step["significant"]:
        # Slower beyond run-to-run variation (on a loaded machine a doubled batch may not
        # be): the planted change is what made it slower.
        assert step["delta"] > 0 and top["delta_ms"] > 0, (step, top)
    assert doc["comparability"]["level"] == "full", doc["comparability"]
    # The printed explanation leads with the same change; both sides were analysed here.
    first = next(line for line in printed.splitlines() if line.lstrip().startswith("1."))
    assert PLANTED[change] in first, printed
    assert (tmp_path / "a" / "analysis.json").is_file() and (tmp_path / "diff.html").is_file()
    changed = [m for m in doc["hlo"]["modules"] if m["status"] == "changed"]
    if change == "stall":
        assert changed == [] and "host" in top["change"]
        assert "load_batch" in top["change"] or "sleep" in top["change"]
    elif change == "layout":
        assert "wrapped_copy" in top["change"] and "{0,1}" in top["change"]
        assert [p["change"] for p in changed[0]["parameters"]] == ["layout"]
    elif change == "batch":
        assert "×2 along one dimension" in top["change"]
        assert changed[0]["ops_added"] == {} and changed[0]["ops_removed"] == {}
    else:
        assert top["signature"] == "all-reduce"
        assert "all-reduce" in changed[0]["ops_added"]


@pytest.mark.parametrize("change", ["dtype", "fusion", "transpose"])
def test_a_change_that_recompiles_the_program_is_ranked_first_with_its_ms(
        change: str, pair: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: fusions renamed by the recompile must not split the change into a
    "new fusion" and "the other ops" that cancel out; ops pair by what they compute."""
    before, after = pair(change)
    doc, printed = diff_paths(before, after, tmp_path, capsys)
    kind, named = RECOMPILED[change]
    step = next(k for k in doc["kpis"] if k["name"] == "step time")
    if change in ("fusion", "dtype") and not step["significant"]:
        # Writing the intermediate out and back (fusion) or halving a dtype costs XLA:CPU a
        # fraction of a millisecond, sometimes less than the run's own variation (seen:
        # +0.16 ms in all, 0.09 of it host wait; a dtype pair whose -0.14 ms of host wait
        # outranked it on a loaded CI machine). Then the honest answer is "within run-to-run
        # variation", by the stated test, and the change is still found and paired, whatever
        # its rank.
        assert "within run-to-run variation" in doc["headline"], doc["headline"]
        assert any(i["kind"] == kind for i in doc["explanation"]), doc["explanation"]
        return
    top = doc["explanation"][0]
    assert top["kind"] == kind, json.dumps(doc["explanation"], indent=1)
    assert named in top["change"] and "regression.py:" in top["change"], top["change"]
    test = step["variation"]
    assert test["test"].startswith("Mann-Whitney U") and "median_shift_ms" in test["effect"]
    if change != "dtype":
        # Not "within run-to-run variation": the rank test on the step times says so.
        assert step["significant"] is True and test["p_value"] < 0.05, test
        assert "within run-to-run variation" not in doc["headline"]
        assert step["delta"] > 0, step
    # float16 on XLA:CPU is sometimes slower than float32 and sometimes faster on a loaded
    # machine (seen +40 and -28 ms): whichever way the step moved, the dtype change is what
    # moved it. Its milliseconds: the time of the ops it regrouped on each side, most of the
    # step's change (the rest is the host wait and the other ops, which moved little).
    # When the step itself moved less than its run-to-run variation (seen once on a loaded
    # clean clone: +0.21 ms, the dtype ops +0.37 ms), there is no step change for the ops'
    # milliseconds to be most of; the dtype change is still found and ranked first.
    if step["significant"]:
        assert top["delta_ms"] == pytest.approx(step["delta"], rel=0.5), (top, step)
    # The other op changes moved little: the recompile was not split into a "new fusion" and
    # "the other ops". The host wait is the machine's, not the program's: on a loaded clean
    # clone it once moved +0.78 ms (0.18 → 0.96 ms), more than half the fusion change.
    others = [i for i in doc["explanation"][1:] if i["kind"] != "host_wait"]
    assert all(abs(i["delta_ms"]) < abs(top["delta_ms"]) / 2 for i in others), others
    module = next(m for m in doc["hlo"]["modules"] if m["status"] == "changed")
    (group,) = module["pairing"]["groups"]
    assert set(top["ops_a"]) == set(group["a"]) and set(top["ops_b"]) == set(group["b"])
    assert top["evidence"] and any(e["tool"] == "hlo_digests" for e in top["evidence"])
    first = next(line for line in printed.splitlines() if line.lstrip().startswith("1."))
    assert kind in first, printed


def test_an_alert_triggered_session_reports_what_changed_since_the_baseline(
        pair: Any, tmp_path: Path) -> None:
    """The pipeline end to end: the healthy capture is reported, then the degraded one
    arrives for a session the alert created, and its report explains it."""
    before, after = pair("stall")
    settings = Settings(home=tmp_path / "home", settle_s=0.3, stability_s=0.1, poll_s=0.02)
    rt = bootstrap(settings)
    rt.start()
    try:
        bucket = rt.storage.root / "train" / "plugins" / "profile"
        host = next(before.glob("*.xplane.pb")).name
        (bucket / "healthy").mkdir(parents=True)
        shutil.copy(next(before.glob("*.xplane.pb")), bucket / "healthy" / host)
        rt_wait(rt, "healthy")
        rt.state.set_baseline("train", "healthy")
        # What the capture stage creates for an alert: the session, expecting its host.
        rt.state.create_session(SessionRecord(
            run="train", session="auto-1", state="CAPTURING", trigger="alert",
            expected_hosts=[host.removesuffix(".xplane.pb")], created_at=time.time(),
            note="sdk alert: step time 50% above the baseline"))
        (bucket / "auto-1").mkdir()
        shutil.copy(next(after.glob("*.xplane.pb")), bucket / "auto-1" / host)
        s = rt_wait(rt, "auto-1")
    finally:
        rt.stop()
    folder = Path(s.report_path.removeprefix("file://")).parent
    a = json.loads((folder / "analysis.json").read_text())
    assert a["regression"]["baseline"]["session"] == "healthy"
    assert a["regression"]["explanation"][0]["kind"] == "host_wait"
    assert a["summary"].startswith("Since train/healthy, step time rose")
    page = (folder / "summary.html").read_text()
    assert page.index('id="what-changed"') < page.index('id="summary"')
    assert (folder / "diff.html").is_file() and (folder / "v1" / "diff.json").is_file()


def rt_wait(rt: Any, session: str, timeout: float = 120.0) -> SessionRecord:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = rt.state.get_session("train", session)
        if s is not None and s.state in (REPORTED, "FAILED"):
            assert s.state == REPORTED, s.reason
            return s  # type: ignore[no-any-return]
        time.sleep(0.05)
    raise AssertionError(f"no report for train/{session} after {timeout:g} s")
