"""Benchmark: the memory of each of our own passes over one host, alone.

    python bench/pass_memory.py XPLANE [--passes cut,copy,overlap,timeline,peaks]
                                       [--windows 4] [--json OUT]

Each pass runs in a child process of its own, as a job runs in a worker: the window cut
(`op_stats_shards.write_windows`), the memory copy (`hosts.copies.memory_copy`'s first pass),
the async-overlap share (`async_overlap.host_partial`), our timeline pass
(`timeline.analyze_scan`) and the allocators' peak events (`memory_peaks.write_peaks`, on the
memory copy it writes first). The child samples its own `/proc/self/status` every 20 ms and
reports its wall time and its peak anonymous memory and mapped file pages apart: the pages of
a memory-mapped file are the page cache's, shared, and what a pass keeps of them is what it
could let go. `bench/collect_host.py` and `bench/scale.py` give the jobs' peaks inside the
collection and the anchor; this says where a job's memory goes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _proc import write_results  # noqa: E402 - bench/_proc.py

PASSES = ("cut", "copy", "overlap", "timeline", "peaks")


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "VmRSS"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _child(xplane: Path, name: str, windows: int, work: Path) -> dict[str, Any]:
    from mldiag.analysis.collection.hosts import copies, memory_peaks
    from mldiag.analysis.collection.hosts import op_stats_shards as shards
    from mldiag.analysis.collection.xspace import async_overlap, timeline
    from mldiag.analysis.collection.xspace.scan import XSpaceScan
    from mldiag.analysis.collection.xspace.write import write_filtered

    peak = {"RssAnon": 0, "RssFile": 0, "VmRSS": 0}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for k, v in _status().items():
                peak[k] = max(peak[k], v)
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    started = time.perf_counter()
    with XSpaceScan(xplane) as scan:
        if name == "cut":
            cuts = shards.module_cuts(scan, windows)
            host = timeline.HostSpans(scan)
            shards.write_windows(scan, cuts, [work / f"w{k}.pb" for k in range(len(cuts) + 1)],
                                 each_line=host.add)
            host.host_steps()
        elif name == "copy":
            write_filtered(scan, work / "copy.pb", copies._memory_events)
        elif name == "overlap":
            async_overlap.host_partial(scan, 10)
        elif name == "timeline":
            timeline.analyze_scan(scan, "host")
    if name == "peaks":
        with XSpaceScan(xplane) as scan:
            write_filtered(scan, work / "copy.pb", copies._memory_events)
        time.sleep(0.05)
        for k in peak:  # the peaks' pass alone, over the copy
            peak[k] = 0
        started = time.perf_counter()
        memory_peaks.write_peaks(work / "copy.pb", work / "peaks.pb")
    wall = time.perf_counter() - started
    stop.set()
    return {"pass": name, "wall_s": round(wall, 2),
            "peak_anon_mb": round(peak["RssAnon"] / 2**20),
            "peak_file_pages_mb": round(peak["RssFile"] / 2**20),
            "peak_rss_mb": round(peak["VmRSS"] / 2**20)}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("xplane", type=Path)
    parser.add_argument("--passes", default=",".join(PASSES))
    parser.add_argument("--windows", type=int, default=4, help="windows the cut makes")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        with tempfile.TemporaryDirectory(prefix="mldiag-pass-") as tmp:
            print(json.dumps(_child(args.xplane, args.child, args.windows, Path(tmp))))
        return 0
    rows = []
    for name in args.passes.split(","):
        if name not in PASSES:
            parser.error(f"unknown pass {name!r} (one of {', '.join(PASSES)})")
        proc = subprocess.run([sys.executable, __file__, str(args.xplane), "--child", name,
                               "--windows", str(args.windows)],
                              capture_output=True, text=True, check=False)
        if proc.returncode:
            rows.append({"pass": name, "error": proc.stderr.strip()[-500:]})
        else:
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        rows[-1]["mb"] = round(args.xplane.stat().st_size / 2**20, 1)
        print(json.dumps(rows[-1]), flush=True)
    write_results(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
