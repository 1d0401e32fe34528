"""Benchmark: a multi-host session through the pipeline's fan-out, drop to REPORTED.

    python bench/fanout.py SESSION_DIR [--json OUT] [--workdir DIR] [--memory-budget 8G]
                           [--job-tasks N] [--tool-timeout S] [--cli]
                           [--cli-rss-limit 20G]

SESSION_DIR holds one `<host>.xplane.pb` per host (bench/tpu_shape.py makes TPU-shaped ones:
`python bench/tpu_shape.py 250 DIR --host tpu_host_0`, then copies under other host names).
A fresh `mldiag up --no-console` runs on an empty home; every host is hard-linked (or copied)
into its bucket at once, as a capture's uploads land. The session fans out (one collect_host
per host, in the local process pool, then the combine step), as on Google Cloud it runs one
function instance per host. Measured: wall time from the drop to REPORTED, CPU seconds and
peak resident memory of `mldiag up`'s whole process tree (sampled every 50 ms), and the
session's own record of its collection (per-host jobs, skipped, degraded).

`--job-tasks N` sends the session to the collect job instead (`MLDIAG_COLLECT_JOB=local`,
every host over the collect function's limit): the local job runner starts N task processes
(`python -m mldiag.job`, with Cloud Run's task index and count), task 0 collects and the others
convert their share of the hosts' time windows, as the Cloud Run job's tasks do, here on one
machine's cores instead of one machine each. Their processes are in the measured tree.

`--cli` then runs the anchor in the same run: xprof's CLI tools one after another on the
same session directory (every host), as a user of raw xprof would, each tool killed if its
process tree passes `--cli-rss-limit` (what failed, and why, is recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _proc import PeakTreeRss, tree_cpu_s, write_results  # noqa: E402 - bench/_proc.py
from _workdir import workdir  # noqa: E402 - bench/_workdir.py
from scale import run_cli_measured  # noqa: E402 - bench/scale.py

from mldiag.adapters.local.state import SqliteStateStore  # noqa: E402
from mldiag.analysis.collection.workers import parse_bytes  # noqa: E402

RUN = "fanout"
SESSION = "s1"


def _place(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("session_dir", type=Path)
    parser.add_argument("--workdir",
                        help="the runtime's home (default: a temp dir, removed at exit)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--memory-budget", help="MLDIAG_MEMORY_BUDGET for the runtime")
    parser.add_argument("--job-tasks", type=int, default=0,
                        help="collect the session in the collect job, with this many tasks")
    parser.add_argument("--tool-timeout", type=float,
                        help="MLDIAG_TOOL_TIMEOUT_S (default 300): with --job-tasks on one "
                             "machine the tasks share its cores, where Cloud Run gives each "
                             "its own")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--cli", action="store_true", help="run the xprof CLI after it")
    parser.add_argument("--cli-rss-limit", default="20G",
                        help="kill a CLI tool whose process tree passes this")
    args = parser.parse_args()
    hosts = sorted(args.session_dir.glob("*.xplane.pb"))
    if not hosts:
        parser.error(f"no *.xplane.pb in {args.session_dir}")
    home = workdir(args.workdir, "mldiag-fanout-")
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLDIAG_")}
    env.update(MLDIAG_HOME=str(home), JAX_PLATFORMS="cpu")
    if args.memory_budget:
        env["MLDIAG_MEMORY_BUDGET"] = args.memory_budget
    if args.tool_timeout:
        env["MLDIAG_TOOL_TIMEOUT_S"] = str(args.tool_timeout)
    if args.job_tasks:
        env.update(MLDIAG_COLLECT_JOB="local", MLDIAG_COLLECT_JOB_TASKS=str(args.job_tasks),
                   MLDIAG_FUNCTION_MAX_HOST_BYTES="1")
    up = subprocess.Popen([str(Path(sys.executable).with_name("mldiag")), "up", "--no-console",
                           "--settle", "2"], env=env, cwd=home, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert up.stdout is not None
    for line in up.stdout:  # the runtime is watching once it says so
        if line.startswith("mldiag up: watching"):
            break
    dest = home / "bucket" / RUN / "plugins" / "profile" / SESSION
    dest.mkdir(parents=True)
    state = SqliteStateStore(home / "state.db")
    cpu0 = tree_cpu_s(up.pid)
    row: dict[str, Any] = {"hosts": len(hosts), "job_tasks": args.job_tasks,
                           "mb_per_host": round(hosts[0].stat().st_size / 2**20, 1),
                           "total_mb": round(sum(h.stat().st_size for h in hosts) / 2**20, 1)}
    with PeakTreeRss(up.pid) as rss:
        start = time.perf_counter()
        for h in hosts:
            _place(h, dest / h.name)
        s = None
        while time.perf_counter() - start < args.timeout:
            s = state.get_session(RUN, SESSION)
            if s is not None and s.state in ("REPORTED", "FAILED"):
                break
            time.sleep(0.5)
        wall = time.perf_counter() - start
        cpu = tree_cpu_s(up.pid) - cpu0
    os.killpg(up.pid, signal.SIGTERM)
    up.wait(timeout=60)
    row.update(wall_s=round(wall, 1), cpu_s=round(cpu, 1),
               peak_rss_tree_mb=round(rss.peak / 2**20), peak_rss_process_mb=round(
                   rss.peak_single / 2**20), state=s.state if s else None,
               reason=s.reason if s else None, verdict=s.verdict if s else None,
               version=s.version if s else None)
    snapshot = dest / "analysis" / "health_snapshot.json"
    if snapshot.is_file():
        collection = json.loads(snapshot.read_text()).get("collection", {})
        row["collection"] = {k: collection.get(k) for k in (
            "elapsed_ms", "fanned_out", "collect_job", "skipped", "degraded", "killed",
            "worker_peak_rss_bytes")}
    if args.cli:
        row["xprof_cli"] = run_cli_measured(hosts[0], rss_limit=parse_bytes(args.cli_rss_limit))
    print(json.dumps(row, indent=1))
    write_results(args.json, [row])
    return 0 if row["state"] == "REPORTED" else 1


if __name__ == "__main__":
    raise SystemExit(main())
