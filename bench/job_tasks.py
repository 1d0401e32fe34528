"""The collect job's tasks on one large host: each task measured on its own, as Cloud Run
runs them (one machine each), and the whole job's wall time from them.

Tasks 1..N-1 convert their share of the host's time windows (`window_tasks.convert_windows`)
and publish them; task 0 runs the collection (`collect(exchange=...)`) and combines them.
On one bench machine they cannot run side by side without sharing its cores, so:

1. each window task runs alone, in its own process tree, and the time at which it published
   each window (from its start) is recorded;
2. task 0 then runs alone, and sees each window only once the recorded time has passed since
   its own start: the tasks' publications are replayed as if all had started together.

So task 0's wall time is the job's (downloads from the bucket excluded: each task reads the
local file), and every task's peak memory is its own machine's. Beside them, in the same run:
the same host collected by one task (`--single`) and the sequential xprof CLI (`--cli`).

    python bench/job_tasks.py --xplane FILE --tasks 4 --budget 8G --single --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "shared"))

from _proc import write_results  # noqa: E402
from scale import measure, run_cli_measured, warm  # noqa: E402

from mldiag.analysis.collection import plan  # noqa: E402
from mldiag.analysis.collection.workers import parse_bytes  # noqa: E402

PREFIX = "bench/analysis/v1/windows"
CLAIMS = "window:bench/job#v1"


def _services(home: Path) -> Any:
    from mldiag.bootstrap import bootstrap
    from mldiag.settings import Settings

    return bootstrap(Settings(home=home, in_job=True)).services


class _Replayed:
    """Task 0's exchange with each published window hidden until the time (since this task
    started) at which its task published it."""

    def __init__(self, inner: Any, at: dict[int, float]) -> None:
        self._inner, self._at, self._t0 = inner, at, time.monotonic()
        self.task = inner.task

    def published(self) -> dict[int, dict[str, Any]]:
        now = time.monotonic() - self._t0
        return {k: m for k, m in self._inner.published().items()
                if self._at.get(k, 0.0) <= now}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _child(args: argparse.Namespace) -> int:
    """One task, in this process (the parent measures it)."""
    from mldiag.analysis.collection.collect import collect
    from mldiag.analysis.collection.hosts.window_tasks import convert_windows, task_windows
    from mldiag.stages.window_shards import StoredWindows

    budget = parse_bytes(args.budget)
    windows = plan.window_count(args.xplane.stat().st_size, budget)
    services = _services(args.home)
    exchange = StoredWindows(services, prefix=PREFIX, claim_base=CLAIMS, windows=windows,
                             task=args.as_task)
    out: dict[str, Any] = {"task": args.as_task, "windows": windows}
    if args.as_task == 0:
        at = {int(k): v for k, v in json.loads(args.replay.read_text()).items()}
        snapshot = collect(args.xplane, memory_budget_bytes=budget,
                           exchange=_Replayed(exchange, at) if args.tasks > 1 else None)
        c = snapshot["collection"]
        out |= {"elapsed_s": round(snapshot["elapsed_ms"] / 1000, 2),
                "windows_by_task": c.get("windows_by_task"),
                "tools": {n: t["status"] for n, t in snapshot["tools"].items()},
                "skipped": c["skipped"], "killed": c["killed"],
                "worker_peak_mb": round((c.get("worker_peak_rss_bytes") or 0) / 2**20),
                "jobs_s": {n: round(j["elapsed_ms"] / 1000, 2) for n, j in sorted(
                    c["jobs"].items(), key=lambda kv: -kv[1]["elapsed_ms"])[:12]}}
    else:
        held = [k for k in task_windows(windows, args.as_task, args.tasks) if exchange.take(k)]
        start = time.monotonic()
        publish = exchange.publish
        published_at: dict[int, float] = {}

        def timed(window: int, meta: Any, op_stats: Any) -> None:
            publish(window, meta, op_stats)
            published_at[window] = round(time.monotonic() - start, 2)

        exchange.publish = timed  # type: ignore[method-assign]
        done = convert_windows(args.xplane, exchange, windows, held,
                               memory_budget_bytes=budget)
        exchange.close()
        out |= {"held": held, "done": done["done"], "published_at_s": published_at,
                "worker_peak_mb": round((done["worker_peak_rss_bytes"] or 0) / 2**20)}
    args.result.write_text(json.dumps(out))
    return 0


def _run_task(args: argparse.Namespace, home: Path, task: int, replay: Path) -> dict[str, Any]:
    result = home / f"task{task}.json"
    cmd = [sys.executable, __file__, "--xplane", str(args.xplane), "--tasks", str(args.tasks),
           "--budget", args.budget, "--as-task", str(task), "--home", str(home),
           "--replay", str(replay), "--result", str(result)]
    proc: dict[str, Any] = {}

    def call() -> None:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        proc["rc"], proc["stderr"] = done.returncode, done.stderr[-2000:]

    figures = measure(call)
    row = {**figures, "rc": proc["rc"]}
    if proc["rc"] != 0:
        return {**row, "stderr": proc["stderr"]}
    return {**row, **json.loads(result.read_text())}


def _single(args: argparse.Namespace) -> dict[str, Any]:
    code = ("import sys; from mldiag.analysis.collection.collect import collect; "
            "collect(sys.argv[1], memory_budget_bytes=int(sys.argv[2]))")
    out: dict[str, Any] = {}

    def call() -> None:
        done = subprocess.run([sys.executable, "-c", code, str(args.xplane),
                               str(parse_bytes(args.budget))], capture_output=True, text=True,
                              timeout=3600, env={**os.environ, "PYTHONPATH": str(
                                  Path(__file__).resolve().parents[1] / "shared")})
        out["rc"] = done.returncode
        out["stderr"] = done.stderr[-2000:] if done.returncode else ""

    return {**measure(call), **out}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--xplane", type=Path, required=True)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--budget", default="8G", help="each task's workers' memory budget")
    parser.add_argument("--single", action="store_true",
                        help="also the same host collected by one task, in the same run")
    parser.add_argument("--cli", action="store_true",
                        help="also the sequential xprof CLI (fails over about 500 MB)")
    parser.add_argument("--json")
    parser.add_argument("--as-task", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--home", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--replay", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.as_task >= 0:
        return _child(args)
    warm(args.xplane)
    size = args.xplane.stat().st_size
    windows = plan.window_count(size, parse_bytes(args.budget))
    print(f"{args.xplane.name}: {size / 1e6:,.1f} MB, {windows} windows, {args.tasks} tasks, "
          f"budget {args.budget} per task", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mldiag-job-tasks-") as tmp:
        home = Path(tmp)
        replay = home / "replay.json"
        at: dict[int, float] = {}
        for task in range(1, args.tasks):
            row = _run_task(args, home, task, replay)
            rows.append(row)
            at |= {int(k): v for k, v in (row.get("published_at_s") or {}).items()}
            print(f"task {task}: {row['wall_s']} s, tree peak {row['peak_rss_tree_mb']} MiB, "
                  f"windows {row.get('done')}", flush=True)
        replay.write_text(json.dumps(at))
        row = _run_task(args, home, 0, replay)
        rows.append(row)
        print(f"task 0 (the job's wall time): {row['wall_s']} s, tree peak "
              f"{row['peak_rss_tree_mb']} MiB, windows by task {row.get('windows_by_task')}",
              flush=True)
    if args.single:
        single = {"task": "single", **_single(args)}
        rows.append(single)
        print(f"one task: {single['wall_s']} s, tree peak {single['peak_rss_tree_mb']} MiB",
              flush=True)
    if args.cli:
        cli = {"task": "xprof CLI", **run_cli_measured(args.xplane)}
        rows.append(cli)
        print(f"xprof CLI: {cli['wall_s']} s, tree peak {cli['peak_rss_tree_mb']} MiB",
              flush=True)
    write_results(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
