"""Benchmark: one host's share of a fanned-out session, as one instance runs it.

    python bench/collect_host.py XPLANE [--memory-budget 8G] [--cli] [--json OUT]

On Google Cloud each host of a fanned-out session runs in a `collect_host` function instance
of its own (or a task of the collect job): its op_stats (whole, or in time windows combined
as one host), passes, per-host tools and memory copy (`collection.hosts.share.collect_host`). The
local runtime runs several at once in one process tree, so `bench/fanout.py`'s tree peak is
not an instance's. This runs one host's share alone, in a child process, and measures its
wall time, CPU seconds and the peak resident memory of its process tree (sampled every
50 ms), with each job's time and its worker's peak. `--cli` runs xprof's CLI tools on the
same file in turn, in the same run, as the anchor (it does what the combine step and the
host's share do together, for that one host).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _proc import write_results  # noqa: E402 - bench/_proc.py
from scale import measure, run_cli_measured, warm  # noqa: E402 - bench/scale.py


def _child(xplane: Path, out: Path, budget: str | None, result: Path) -> int:
    from mldiag.analysis.collection.hosts.share import collect_host
    from mldiag.analysis.collection.workers import parse_bytes

    parts = collect_host(xplane, xplane.stem.removesuffix(".xplane"), out,
                         memory_budget_bytes=parse_bytes(budget) if budget else None)
    result.write_text(json.dumps(parts, default=str))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("xplane", type=Path)
    parser.add_argument("--memory-budget", help="the workers' budget (MLDIAG_MEMORY_BUDGET)")
    parser.add_argument("--cli", action="store_true", help="run the xprof CLI beside it")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args.xplane, Path(args.child[0]), args.memory_budget, Path(args.child[1]))
    warm(args.xplane)
    row: dict[str, Any] = {"mb": round(args.xplane.stat().st_size / 2**20, 1)}
    with tempfile.TemporaryDirectory(prefix="mldiag-host-bench-") as tmp:
        out, result = Path(tmp) / "out", Path(tmp) / "parts.json"
        cmd = [sys.executable, __file__, str(args.xplane), "--child", str(out), str(result),
               *(["--memory-budget", args.memory_budget] if args.memory_budget else [])]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "shared")}
        done: dict[str, int] = {}

        def call() -> None:
            done["rc"] = subprocess.run(cmd, env=env, timeout=3600).returncode

        row["mldiag_host_share"] = measure(call)
        parts = json.loads(result.read_text()) if done["rc"] == 0 else {}
        row["rc"] = done["rc"]
        row["op_stats"] = parts.get("parts", {}).get("op_stats")
        row["jobs"] = parts.get("jobs")
        row["parts"] = {k: v.get("status") for k, v in parts.get("parts", {}).items()
                        if isinstance(v, dict) and "status" in v}
        row["files_mb"] = {p.name: round(p.stat().st_size / 2**20, 1) for p in out.glob("*")}
    if args.cli:
        row["xprof_cli"] = run_cli_measured(args.xplane)
    print(json.dumps(row, indent=1))
    write_results(args.json, [row])
    return 0 if row["rc"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
