"""Benchmark: the cross-host pass (`collection/hosts/pod.py`) on a TPU-shaped pod of N hosts.

    python bench/pod.py HOSTS [--steps S] [--devices D] [--workdir DIR] [--json OUT]

The pod is written as real XSpace files (`tests/helpers/pod_xplanes.py`: D devices a host,
one async all-reduce a step, one host's compute stretched 1.3×, the hosts' clocks offset),
each host's timeline pass is run, then the cross-host pass alone, timed with
`time.perf_counter` and its Python allocations traced (tracemalloc's peak).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "shared"))

from mldiag.analysis.collection.hosts.pod import cross_host  # noqa: E402
from mldiag.analysis.collection.xspace.timeline import analyze_host  # noqa: E402
from tests.helpers.pod_xplanes import PodShape, write_pod  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("hosts", type=int)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mldiag-bench-pod"))
    parser.add_argument("--json")
    args = parser.parse_args()
    session = args.workdir / f"{args.hosts}x{args.steps}x{args.devices}"
    if not session.exists():
        write_pod(session, PodShape(hosts=args.hosts, devices=args.devices, steps=args.steps,
                                    stretch={args.hosts // 3: 1.3}))
    files = sorted(session.glob("*.xplane.pb"))
    t0 = time.perf_counter()
    hosts = [analyze_host(p, p.name.split(".")[0]) for p in files]
    t1 = time.perf_counter()
    tracemalloc.start()
    pod = cross_host(hosts)
    t2 = time.perf_counter()
    peak = tracemalloc.get_traced_memory()[1]
    assert pod is not None
    row = {"hosts": args.hosts, "steps": args.steps, "devices": args.devices,
           "xplane_mb": round(sum(p.stat().st_size for p in files) / 1e6, 1),
           "timeline_s": round(t1 - t0, 2), "cross_host_s": round(t2 - t1, 2),
           "traced_peak_mb": round(peak / 1e6, 1),
           "stragglers": [s["host"] for s in pod["stragglers"]],
           "instances_per_host": len(hosts[0].collective_instances)}
    print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
