"""Benchmark: collection cost against profile size, mldiag beside the sequential xprof CLI.

    python bench/scale.py [--shape host|tpu] [--sizes 1,10,100,500] [--workdir DIR] [--json OUT]
                          [--no-cli-above MB] [--memory-budget 3G] [--repeat N]
                          [--cli-with-workers-malloc]

For each size it generates a profile of the chosen shape, then measures on the same file, in
one run:
  (a) the xprof-backed collection tools as sequential `xprof` CLI subprocesses, cold (fresh
      TMPDIR, fresh copy), as bench/collect.py runs them;
  (b) `mldiag analyze` in a fresh process (cold: its worker processes start with it), which
      runs all the collection tools, triage, investigation and the report.
Wall time, CPU time (the process and all its descendants) and peak RSS: the largest single
process, and the sum over the process tree (sampled every 50 ms). The file is read once before
each side, so both start with it in the page cache.

Two shapes:
- `tpu`, the product's own input: the team's real TPU v6 Lite capture repeated in time
  (bench/tpu_shape.py), device planes of XLA ops, modules and steps, as continuous profiling
  and snapshots produce up to 2 GB per host;
- `host` (the default, the curve of earlier benchmarks): a CPU loop under the Python tracer.

The host workload: a jitted 64x64 MLP step on the JAX CPU backend, one
`StepTraceAnnotation` per step, host tracer level 3 and the Python tracer on (40 Python calls
per step), so the file grows with the step count at about 2.3 KB per step, the mix of events
a Python-traced training loop gives. The step count for a size comes from a calibration run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from _proc import PeakTreeRss, tree_cpu_s, write_results
from _workdir import workdir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collect import run_cli  # noqa: E402 - bench/collect.py, beside this file
from tpu_shape import generate as generate_tpu  # noqa: E402 - bench/tpu_shape.py

from mldiag.analysis.collection.profile_input import resolve_session  # noqa: E402
from mldiag.analysis.collection.workers import worker_allocator  # noqa: E402

WORKLOAD = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp
    logdir, steps = sys.argv[1], int(sys.argv[2])
    def step(x, w):
        for _ in range(4):
            x = jnp.tanh(x @ w) + 0.1 * x
        return x, (x * x).sum()
    f = jax.jit(step)
    x = jnp.ones((64, 64)); w = jnp.eye(64) * 0.5
    jax.block_until_ready(f(x, w))
    def sq(j):
        return j * j
    def host(i):
        return [sq(j) for j in range(40)]
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = 3
    options.python_tracer_level = 1
    with jax.profiler.trace(logdir, profiler_options=options):
        for i in range(steps):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                host(i)
                x, loss = f(x, w)
                jax.block_until_ready(loss)
""")


def generate(logdir: Path, steps: int) -> Path:
    """Write a profile of `steps` steps under `logdir` (emptied first); returns its xplane."""
    shutil.rmtree(logdir, ignore_errors=True)
    subprocess.run([sys.executable, "-c", WORKLOAD, str(logdir), str(steps)], check=True,
                   env={**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"},
                   capture_output=True)
    (xplane,) = logdir.glob("plugins/profile/*/*.xplane.pb")
    for extra in xplane.parent.glob("*.trace.json.gz"):
        extra.unlink()  # jax writes a trace.json.gz beside it; neither side reads it
    (logdir / "steps.txt").write_text(str(steps))
    return xplane


def warm(path: Path) -> None:
    """Read the file once, so that neither side pays the first read from disk (measured here:
    the same collection took 31 s with the file cold and 24 s warm)."""
    with open(path, "rb") as f:
        while f.read(64 * 1024**2):
            pass


def measure(fn: Any) -> dict[str, float]:
    """Wall, CPU (this process and descendants) and peak RSS of fn(), which starts processes."""
    cpu0 = tree_cpu_s()
    children0 = os.times()
    with PeakTreeRss() as rss:
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
    children1 = os.times()
    reaped = (children1.children_user + children1.children_system
              - children0.children_user - children0.children_system)
    return {"wall_s": round(wall, 2), "cpu_s": round(reaped + tree_cpu_s() - cpu0, 2),
            "peak_rss_tree_mb": round(rss.peak / 1024**2), "peak_rss_process_mb":
            round(rss.peak_single / 1024**2)}


def run_mldiag(xplane: Path, out: Path, budget: str | None = None) -> dict[str, Any]:
    mldiag = Path(sys.executable).with_name("mldiag")
    warm(xplane)
    result: dict[str, Any] = {}
    extra = ["--memory-budget", budget] if budget else []

    def call() -> None:
        proc = subprocess.run([str(mldiag), "analyze", str(xplane.parent), "--out", str(out),
                               "-q", *extra], capture_output=True, text=True, timeout=3600)
        result["rc"] = proc.returncode
        result["stderr"] = proc.stderr[-2000:]

    figures = measure(call)
    analysis = json.loads((out / "analysis.json").read_text()) if result["rc"] == 0 else {}
    tools = analysis.get("tools", [])
    collection = analysis.get("collection", {})
    snapshot_path = out / "health_snapshot.json"
    snap_collection = (json.loads(snapshot_path.read_text()).get("collection", {})
                       if result["rc"] == 0 and snapshot_path.is_file() else {})
    malloc = snap_collection.get("worker_malloc")
    # Where the time goes: each collection job (in its worker), and each follow-up after
    # collection (a precomputed one costs nothing here: it was computed during collection).
    jobs_s = {name: round(j.get("elapsed_ms", 0) / 1000, 2)
              for name, j in sorted((snap_collection.get("jobs") or {}).items(),
                                    key=lambda kv: -(kv[1].get("elapsed_ms") or 0))}
    follow_ups = [{"tool": f.get("tool"), "s": round((f.get("elapsed_ms") or 0) / 1000, 2),
                   "status": f.get("status"), **({"precomputed": True}
                                                  if f.get("precomputed") else {})}
                  for f in analysis.get("follow_ups", [])]
    return {**figures, "rc": result["rc"],
            "status": analysis.get("status"),
            "tools_error": [t["name"] for t in tools if t["status"] == "ERROR"],
            "tools_data": sum(t["status"] == "DATA" for t in tools),
            "collection_s": round(collection.get("elapsed_ms", 0) / 1000, 2),
            "skipped": collection.get("skipped", []), "killed": collection.get("killed", []),
            "degraded": collection.get("degraded", []), "worker_malloc": malloc,
            "worker_peak_mb": round((collection.get("worker_peak_rss_bytes") or 0) / 2**20),
            "jobs_s": jobs_s, "follow_ups": follow_ups,
            **({"stderr": result["stderr"]} if result["rc"] else {})}


def run_cli_measured(xplane: Path, preload: str | None = None,
                     rss_limit: int | None = None) -> dict[str, Any]:
    """The sequential CLI on `xplane`'s session (every host in its directory); with
    `preload`, its processes run with that malloc (LD_PRELOAD), as mldiag's workers do, to
    show how much of the difference is the allocator's. With `rss_limit`, a tool past it is
    killed, and the tools that failed are listed with why."""
    warm(xplane)
    session = resolve_session(xplane.parent)
    per_tool: dict[str, float] = {}
    failures: dict[str, str] = {}
    saved = os.environ.get("LD_PRELOAD")

    def call() -> None:
        _, tools = run_cli(session, rss_limit, failures)
        per_tool.update(tools)

    if preload:
        os.environ["LD_PRELOAD"] = preload  # read by each CLI process at its start only
    try:
        figures = measure(call)
    finally:
        if preload:
            if saved is None:
                os.environ.pop("LD_PRELOAD", None)
            else:
                os.environ["LD_PRELOAD"] = saved
    return {**figures, "per_tool_s": {k: round(v, 2) for k, v in per_tool.items()},
            **({"failed": failures} if failures else {}),
            **({"preload": os.path.basename(preload)} if preload else {})}


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("host", "tpu"), default="host",
                        help="host: a Python-traced CPU loop; tpu: the TPU fixture repeated "
                             "in time (the product's own shape)")
    parser.add_argument("--sizes", default="1,10,100,500", help="profile sizes in MB")
    parser.add_argument("--workdir", help="where profiles are generated (default: a temp dir, "
                        "removed at exit; give one to keep and reuse the generated profiles)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--no-cli-above", type=float, default=1e9,
                        help="skip the CLI side above this many MB")
    parser.add_argument("--memory-budget", help="also run mldiag with this budget (e.g. 3G)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of each side per size, alternated; medians are kept")
    parser.add_argument("--cli-with-workers-malloc", action="store_true",
                        help="also run the CLI once per size with the malloc mldiag's "
                             "workers use (workers.worker_allocator)")
    args = parser.parse_args()
    work = workdir(args.workdir, "mldiag-scale-")
    work.mkdir(parents=True, exist_ok=True)
    sizes = [float(s) for s in args.sizes.split(",")]

    bytes_per_step = 0.0
    if args.shape == "host":
        calib = generate(work / "calibration", 1000)
        bytes_per_step = calib.stat().st_size / 1000
    rows = []
    for mb in sizes:
        logdir = work / f"{args.shape}{mb:g}MB"
        row: dict[str, Any] = {"shape": args.shape, "target_mb": mb}
        if args.shape == "tpu":
            if not (logdir / "shape.json").is_file():
                shutil.rmtree(logdir, ignore_errors=True)
                generate_tpu(logdir, mb)
            row["copies"] = json.loads((logdir / "shape.json").read_text())["copies"]
        else:
            steps = max(10, int(mb * 1024**2 / bytes_per_step))
            if not any(logdir.glob("plugins/profile/*/*.xplane.pb")):
                shutil.rmtree(logdir, ignore_errors=True)
                generate(logdir, steps)
            if (logdir / "steps.txt").is_file():  # a profile generated by an earlier run
                steps = int((logdir / "steps.txt").read_text())
            row["steps"] = steps
        (xplane,) = logdir.glob("plugins/profile/*/*.xplane.pb")
        row["file_mb"] = round(xplane.stat().st_size / 1024**2, 1)
        print(f"== {args.shape} {row['file_mb']} MB, "
              f"{row.get('steps', row.get('copies'))} {'steps' if 'steps' in row else 'copies'}",
              flush=True)
        # Alternate the sides, so drift in the machine's speed hits both alike; keep the run
        # of median wall time of each side and the median of the pairwise ratios.
        ours, theirs = [], []
        for _ in range(args.repeat):
            ours.append(run_mldiag(xplane, work / f"out{mb:g}"))
            print(f"   mldiag: {json.dumps(ours[-1])}", flush=True)
            if mb <= args.no_cli_above:
                theirs.append(run_cli_measured(xplane))
                print(f"   cli:    {json.dumps(theirs[-1])}", flush=True)
        row["mldiag"] = _median_run(ours)
        if args.memory_budget:
            row["mldiag_budget"] = run_mldiag(xplane, work / f"out{mb:g}-budget",
                                              args.memory_budget)
            print(f"   mldiag --memory-budget {args.memory_budget}: "
                  f"{json.dumps(row['mldiag_budget'])}", flush=True)
        allocator = worker_allocator()
        if args.cli_with_workers_malloc and allocator and mb <= args.no_cli_above:
            row["cli_with_workers_malloc"] = run_cli_measured(xplane, allocator)
            print(f"   cli with {os.path.basename(allocator)}: "
                  f"{json.dumps(row['cli_with_workers_malloc'])}", flush=True)
        if theirs:
            row["cli"] = _median_run(theirs)
            row["speedup_vs_cli"] = statistics.median(
                c["wall_s"] / m["wall_s"] for m, c in zip(ours, theirs, strict=True))
            row["collection_speedup_vs_cli"] = statistics.median(
                c["wall_s"] / m["collection_s"] for m, c in zip(ours, theirs, strict=True))
            row["speedup_vs_cli"] = round(row["speedup_vs_cli"], 2)
            row["collection_speedup_vs_cli"] = round(row["collection_speedup_vs_cli"], 2)
        if args.repeat > 1:
            row["runs"] = {"mldiag": ours, "cli": theirs}
        rows.append(row)

    print(f"\n{'file MB':>8} {'mldiag s':>9} {'cpu s':>7} {'RSS tree MB':>12} "
          f"{'RSS proc MB':>12} {'CLI s':>8} {'cpu s':>7} {'RSS MB':>8} {'speedup':>8}")
    for r in rows:
        m, c = r["mldiag"], r.get("cli", {})
        print(f"{r['file_mb']:>8} {m['wall_s']:>9} {m['cpu_s']:>7} {m['peak_rss_tree_mb']:>12} "
              f"{m['peak_rss_process_mb']:>12} {c.get('wall_s', '-'):>8} "
              f"{c.get('cpu_s', '-'):>7} {c.get('peak_rss_process_mb', '-'):>8} "
              f"{r.get('speedup_vs_cli', '-'):>8}")
    write_results(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
