"""Benchmark: what `metrics.record` costs a training loop, and what reaches the state store.

    python bench/metrics.py [--records 100000] [--json OUT]

Registers a run in a temporary local home (the SQLite state store), then times `--records`
calls of `metrics.record(MetricType.STEP_TIME, ..., step=i)` back to back: the CPU time the
training thread pays per record (`time.thread_time`, so other load on the machine does not
count) (the value checked, a tuple appended to the buffer, the step time
given to the degradation monitor), while the background writer stores the batches
concurrently in the same interpreter. It then waits for the writer and reports the batches it
wrote, its CPU time per stored point, and the time from the last record to the last point stored.

Prints a table, then as the last line: record_us=<..> write_us_per_point=<..>.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _workdir import workdir  # bench/_workdir.py, beside this file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    home = workdir(None, "mldiag-bench-metrics-")
    os.environ["MLDIAG_HOME"] = str(home)
    os.environ.setdefault("MLDIAG_HOST_NAME", "bench")
    from mldiag.adapters.local.state import SqliteStateStore
    from mldiag.sdk import machinelearning_run, metrics
    from mldiag.sdk.metric_types import MetricType

    state = SqliteStateStore(home / "state.db")
    writes: list[int] = []
    original = state.record_metrics
    run = machinelearning_run(name="bench-metrics")  # with the degradation monitor, as by default

    write_s: list[float] = []

    def counting(run_name: str, points: Any) -> None:
        t = time.thread_time()
        original(run_name, points)
        write_s.append(time.thread_time() - t)
        writes.append(len(points))

    run.plane.state.record_metrics = counting  # type: ignore[method-assign]

    # 1. The cost of one record call, back to back.
    t0, w0 = time.thread_time(), time.perf_counter()
    for i in range(args.records):
        metrics.record(MetricType.STEP_TIME, 0.01 + (i % 7) * 1e-4, step=i)
    record_us = (time.thread_time() - t0) / args.records * 1e6
    wall_us = (time.perf_counter() - w0) / args.records * 1e6

    last = time.perf_counter()
    expected = args.records
    while sum(writes) < expected:  # counted as written, without reading them back
        if time.perf_counter() - last > 60:
            print("the background writer did not store every point", file=sys.stderr)
            return 1
        time.sleep(0.01)
    drained_s = time.perf_counter() - last
    if len(state.list_metrics("bench-metrics")) != expected:
        print("the store does not hold every point", file=sys.stderr)
        return 1
    run.close()

    result = {
        "record_us": round(record_us, 2), "record_wall_us": round(wall_us, 2),
        "write_us_per_point": round(sum(write_s) / max(sum(writes), 1) * 1e6, 2),
        "points": expected,
        "batches": len(writes), "batch_median": statistics.median(writes) if writes else 0,
        "batch_max": max(writes, default=0), "drained_s": round(drained_s, 2),
    }
    print(f"{'record (back to back)':<34} {record_us:8.2f} µs CPU of the training thread "
          f"per call ({wall_us:.2f} µs wall, sharing the interpreter with the writer)")
    print(f"{'store (writer thread)':<34} {result['write_us_per_point']:8.2f} µs per point")
    print(f"{'stored':<34} {expected} points in {len(writes)} batches (median "
          f"{result['batch_median']}, max {result['batch_max']}), {drained_s:.2f} s after "
          "the last record")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(f"record_us={record_us:.2f} write_us_per_point={result['write_us_per_point']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
