"""`mldiag demo`: the pipeline end to end on one machine.

Starts the embedded runtime, profiles a JAX workload with a planted bottleneck, drops the
xplane into the bucket the way a user would, waits for the report and prints the verdict.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mldiag.bootstrap import bootstrap
from mldiag.cli.up import describe_transition
from mldiag.errors import MldiagError
from mldiag.model import FAILED, REPORTED, SessionRecord
from mldiag.settings import Settings

WORKLOADS = Path(__file__).resolve().parents[3] / "scripts" / "workloads"


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="profile a planted-bottleneck JAX workload through the "
                       "local pipeline and print the verdict")
    p.add_argument("--workload", default="host_bound",
                   help="a workload of scripts/workloads (default: host_bound)")
    p.add_argument("--home", help="runtime home (default: $MLDIAG_HOME or .mldiag)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the report")


def run(args: argparse.Namespace) -> int:
    script = WORKLOADS / f"{args.workload}.py"
    if not script.is_file():
        names = sorted(p.stem for p in WORKLOADS.glob("[!_]*.py"))
        raise MldiagError(f"unknown workload {args.workload!r} (choose from {', '.join(names)})")
    settings = Settings.from_env(home=args.home)
    runtime = bootstrap(settings, listener=lambda s: print("  " + describe_transition(s),
                                                           flush=True))
    runtime.start()
    try:
        print(f"mldiag demo: runtime up on {settings.home} (bucket {runtime.storage.root})")
        with tempfile.TemporaryDirectory(prefix="mldiag-demo-") as tmp:
            print(f"mldiag demo: profiling scripts/workloads/{script.name} ...", flush=True)
            subprocess.run([sys.executable, str(script), "--logdir", tmp], check=True)
            (xplane,) = Path(tmp).glob("plugins/profile/*/*.xplane.pb")
            session = f"{args.workload}-{time.strftime('%Y%m%d-%H%M%S')}"
            target = runtime.storage.root / "demo" / "plugins" / "profile" / session
            target.mkdir(parents=True, exist_ok=True)
            print(f"mldiag demo: dropping {xplane.name} into {target}", flush=True)
            shutil.copy(xplane, target / xplane.name)
        final = _wait(runtime.state.get_session, "demo", session, args.timeout)
    finally:
        runtime.stop()
    if final.state == FAILED:
        raise MldiagError(f"session demo/{session} FAILED: {final.reason}")
    analysis_path = Path(final.report_path.removeprefix("file://")).with_name("analysis.json")
    analysis = json.loads(analysis_path.read_text())
    print()
    print(f"{analysis['status']}  demo/{session}")
    for f in analysis["findings"]:
        print(f"  {f['priority']} {f['category']:<16} {f['title']}")
    print(f"summary: {final.report_path.removeprefix('file://')}")
    return 0


def _wait(get: Callable[[str, str], SessionRecord | None], run: str, session: str,
          timeout: float) -> SessionRecord:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = get(run, session)
        if s is not None and s.state in (REPORTED, FAILED):
            return s
        time.sleep(0.1)
    raise MldiagError(f"no report for demo/{session} after {timeout:g} s")
