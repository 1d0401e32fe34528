"""The jobs of one host's share of a fanned-out collection (`share.collect_host`).

Each host of a fanned-out session builds, in its own `collect_host`:
- its op_stats, whole (`host_op_stats`) or, over the window size, time window by time window
  and combined as one host (`host_windows`, after `jobs.split_windows` and
  `jobs.op_stats_window`), so that no process holds a large host's whole op_stats build;
- its passes and per-host tools (`host_parts`): our timeline pass (from the windows' shares
  when the host was cut), the async-overlap share, the memory profile and utilization, and
  the memory copy (`copies.memory_copy`) that the combine step's converters read beside the
  combined op_stats.

The combine step then combines the hosts' op_stats as xprof combines hosts
(`op_stats_hosts`), so its converters never build op_stats from the hosts' traces.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mldiag.analysis.collection.hosts.copies import (
    MEMORY_DIR,
    memory_copy,
    peaks_memory_profile,
    reduce_one,
)
from mldiag.analysis.collection.jobs import (
    Context,
    async_overlap_part,
    has_memory_events,
    host_python_events,
    utilization_viewer,
)
from mldiag.analysis.collection.xprof_tools import OP_STATS_FILE, NoData
from mldiag.analysis.collection.xspace import timeline
from mldiag.analysis.collection.xspace.scan import XSpaceScan


def _part(parts: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    """parts[name] = {"status", "value"}, so a host's NO_DATA or failure travels to the
    combine step, which says which host and why."""
    try:
        parts[name] = {"status": "DATA", "value": fn()}
    except NoData as e:
        parts[name] = {"status": "NO_DATA", "value": {"reason": str(e)}}
    except Exception as e:  # noqa: BLE001 - recorded per part; the combine says which
        parts[name] = {"status": "ERROR", "value": f"{type(e).__name__}: {e}"[:500]}


def host_parts(ctx: Context, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """One host's passes and per-host tools, in one job (see the module's notes).

    `inputs["windowed"]`: the host's timeline comes from its windows (`host_windows`), not
    from this pass. `inputs["reduce"]`: the op_stats build reads a copy without the
    Python-tracer events, written over the run directory's link first."""
    (xplane,) = ctx.session.xplanes
    host = ctx.session.hosts[0]
    parts: dict[str, Any] = {}
    with XSpaceScan(xplane) as scan:
        if not inputs.get("windowed"):
            _part(parts, "timeline", lambda: timeline.analyze_scan(scan, host).to_json())
        _part(parts, "async_overlap", lambda: async_overlap_part(scan))
        # The host's own Python frames, for naming a straggler's slow function.
        _part(parts, "python_events", lambda: _python_rows(scan))
        _part(parts, "reduce", lambda: {
            **(reduce_one(ctx.ws, scan, xplane) if inputs.get("reduce") else {}),
            **memory_copy(ctx.ws, scan, xplane)})
    copy = ctx.ws.side_run_dir(MEMORY_DIR) / xplane.name
    _part(parts, "memory_profile", lambda: peaks_memory_profile(ctx.ws, copy, None)
          if has_memory_events(xplane) else None)
    _part(parts, "utilization_viewer", lambda: utilization_viewer(ctx, inputs))
    if parts["reduce"]["status"] == "DATA":
        parts["converter_input"] = str(copy)
    return parts


def _python_rows(scan: XSpaceScan) -> list[dict[str, Any]] | None:
    events = host_python_events(scan)
    return events["data"]["aggregates"] if events is not None else None


def host_op_stats(ctx: Context, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """xprof's op_stats of one whole host, copied to `inputs["out"]`."""
    ctx.ws.build_op_stats()
    return _publish(ctx.ws.run_dir / OP_STATS_FILE, Path(inputs["out"]))


def host_windows(ctx: Context, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """One large host's op_stats from its time windows' (`jobs.op_stats_window`), combined
    as one host (`op_stats_shards.combine`) and written to `inputs["out"]`, and its timeline
    from the windows' shares (`timeline.combine_windows`)."""
    from mldiag.analysis.collection.hosts import op_stats_shards as shards

    parts = inputs["parts"]
    if not parts:
        raise NoData("no time window was converted")
    combined = shards.combine([shards.read(p["op_stats"]) for p in parts], inputs.get("seams"))
    out = Path(inputs["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(combined.SerializeToString())
    shares = [p["timeline"] for p in parts if p.get("timeline") is not None]
    line = (timeline.combine_windows([timeline.HostTimeline.from_json(t) for t in shares])
            .to_json() if len(shares) == len(parts) else None)
    return {"op_stats": str(out), "bytes": out.stat().st_size, "windows": len(parts),
            "timeline": line}


def _publish(src: Path, out: Path) -> dict[str, Any]:
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, out)
    return {"op_stats": str(out), "bytes": out.stat().st_size, "windows": 1}
