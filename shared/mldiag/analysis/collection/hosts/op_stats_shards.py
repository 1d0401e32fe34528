"""One host's op_stats from time-window shards of its XSpace, combined as one host.

xprof builds op_stats from a whole XSpace in memory; its peak grows with the host's size
(1.5 GB at 94 MB TPU-shaped, 17.6 GB reported at 950 MB). A host cut into time windows on
module boundaries converts window by window, and the windows' op_stats combine into the
host's. xprof's own combiner (`CombineAllOpStats`) treats every input as a host: it keeps
the steps common to all inputs and adds up core and host counts, so windows of one host need
a combine of their own. What it does, as measured on the TPU fixture repeated in time:

- op-metrics databases add up op by op (occurrences, times, FLOPs, bytes, memory breakdown;
  the minimum time is the least; a fusion's children add their times, not occurrences), and
  so do their totals of op time;
- a database's `total_time_ps` runs from the capture's start to the last event, so a later
  window's is the host's: the combine keeps the largest, and the `IDLE` op is what remains
  of it, `total_time_ps - total_op_time_ps`, as xprof computes it;
- the device database's `idle_time_ps` counts, per device, from its first event to its last:
  the windows' add up, plus the time between one window's last event and the next one's
  first on each device plane (`idle_between`), which the device duty cycle reads;
- step databases concatenate in window order;
- the run and performance environments, core details and program names are the host's,
  the same in every window.

- the host database's `total_time_ps` runs, per host line, from its first TF activity to
  its last (1511e12 whole, 520e12 in each of two windows on that trace): the cut reads it
  once over every window (`host_activity`), and the host `IDLE` op is what remains of it.

The cut's `seams` carry what the windows cannot tell: the idle time between them, the host
database's total, and why the host database would not add up when it would not (an
activity spanning a cut, infeed enqueues: `HostActivity.inexact`).

`XprofWorkspace.adopt_op_stats` hands the result to xprof's tools through the file its
converters read op_stats from (`ALL_HOSTS.op_stats_v2.pb` in the run directory, with the
owner record xprof's client checks), so the overview, op profile, roofline and KPI tools read
whole-host numbers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mldiag.analysis.collection.xspace.host_activity import HostActivity
from mldiag.analysis.collection.xspace.scan import Line, Plane, XSpaceScan
from mldiag.analysis.collection.xspace.write import write_split

IDLE_OP = "IDLE"
# OpMetrics fields that add up over windows (op_metrics.proto).
_SUMMED = ("occurrences", "time_ps", "normalized_time_ps", "self_time_ps", "flops",
           "model_flops", "flops_v2", "model_flops_v2", "vdd_energy_j", "bytes_accessed",
           "dma_stall_ps", "estimated_flops", "estimated_bytes_accessed")
_DB_SUMMED = ("total_host_infeed_enq_duration_ps",
              "total_host_infeed_enq_start_timestamp_ps_diff", "total_op_time_ps",
              "normalized_total_op_time_ps", "busy_time_ps", "busy_time_high_confidence_ps")
# OpStats fields that hold one op-metrics database each.
_DBS = ("host_op_metrics_db", "device_op_metrics_db", "hlo_metrics_db_complete_steps_only")


def module_cuts(scan: XSpaceScan, shards: int) -> list[int]:
    """Absolute times (ps) that cut the capture into `shards` windows of about as many
    device-module executions each, each cut inside a gap of every device plane's `XLA Modules`
    line (no module execution spans it). Fewer cuts when there are fewer gaps."""
    lo_parts, hi_parts = [], []
    for plane in scan.planes:
        if not plane.name.startswith("/device:"):
            continue
        for line in plane.lines:
            if line.name != "XLA Modules" or not len(line.events):
                continue
            start = line.timestamp_ns * 1000 + line.events.offset_ps
            lo_parts.append(start)
            hi_parts.append(start + line.events.duration_ps)
    if shards < 2 or not lo_parts:
        return []
    lo, hi = np.concatenate(lo_parts), np.concatenate(hi_parts)
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(hi)
    # A gap follows module i when the next one starts after every earlier one has ended.
    gaps = np.flatnonzero(lo[1:] > reach[:-1])
    cuts: list[int] = []
    for k in range(1, shards):
        target = len(lo) * k / shards
        if not len(gaps):
            break
        g = int(gaps[np.argmin(np.abs(gaps + 1 - target))])
        cut = int(reach[g] + (lo[g + 1] - reach[g]) // 2)
        if not cuts or cut > cuts[-1]:
            cuts.append(cut)
    return cuts


def write_windows(scan: XSpaceScan, cuts: Sequence[int], out: Sequence[str | os.PathLike[str]],
                  keep: Sequence[int] | None = None,
                  each_line: Callable[[Plane, Line], None] | None = None,
                  stub: str | os.PathLike[str] | None = None
                  ) -> list[dict[str, tuple[int, int]]]:
    """Write one copy of the XSpace per window between `cuts` (len(cuts) + 1 paths), each
    with the events that start inside it; metadata and everything else copied whole. One pass
    over the trace, one line decoded at a time (`XSpaceScan.write_split`).
    With `keep`, only those windows are written, to `out` in that order (another task of the
    collect job writes the others).
    `each_line(plane, line)` sees every line with its events decoded, once (what another
    pass over the trace would have decoded again).
    `stub`: also write there a copy with every plane, line and metadata table but no event
    (in the same pass), what xprof reads to list a run's tools and hosts.
    Returns each window's device planes' extents, every window's: plane → (first start,
    last end), in ps."""
    cut_at = np.asarray(cuts, dtype=np.int64)
    extents: list[dict[str, tuple[int, int]]] = [{} for _ in range(len(cuts) + 1)]
    kept = list(range(len(cuts) + 1)) if keep is None else list(keep)
    if len(kept) != len(out):
        raise ValueError(f"{len(out)} paths for {len(kept)} windows")
    # Window index -> its copy among `out` (-1: not written here).
    to_copy = np.full(len(cuts) + 1, -1, dtype=np.int32)
    to_copy[kept] = np.arange(len(kept), dtype=np.int32)

    def window_of(plane: Plane, line: Line) -> Any:
        ev = line.events
        if each_line is not None:
            each_line(plane, line)
        if not len(ev):
            return None
        start = line.timestamp_ns * 1000 + ev.offset_ps
        part = np.searchsorted(cut_at, start, side="right").astype(np.int32)
        if plane.name.startswith("/device:"):
            end = start + ev.duration_ps
            for k in np.unique(part).tolist():
                mask = part == k
                first, last = int(start[mask].min()), int(end[mask].max())
                was = extents[k].get(plane.name, (first, last))
                extents[k][plane.name] = (min(was[0], first), max(was[1], last))
        return part if keep is None else to_copy[part]

    write_split(scan, [*out, *([stub] if stub is not None else [])], window_of)
    return extents


def idle_between(extents: Sequence[dict[str, tuple[int, int]]]) -> int:
    """Device time between consecutive windows, summed over device planes: what the
    windows' own `idle_time_ps` leave out of the host's (each counts from its first event
    to its last, per device)."""
    total = 0
    for before, after in zip(extents, extents[1:], strict=False):
        for plane, (_, last) in before.items():
            if plane in after:
                total += max(0, after[plane][0] - last)
    return total


def _combine_metrics(into: Any, other: Any, child: bool = False) -> None:
    for name in _SUMMED:
        # A fusion's children count one occurrence each however often it ran (xprof's); an
        # unset field stays unset, as in xprof's own.
        if getattr(other, name) and not (child and name == "occurrences"):
            setattr(into, name, getattr(into, name) + getattr(other, name))
    if other.min_time_ps and (not into.min_time_ps or other.min_time_ps < into.min_time_ps):
        into.min_time_ps = other.min_time_ps
    spaces = {(m.operation_type, m.memory_space): m for m in into.memory_accessed_breakdown}
    for m in other.memory_accessed_breakdown:
        mine = spaces.get((m.operation_type, m.memory_space))
        if mine is None:
            into.memory_accessed_breakdown.add().CopyFrom(m)
        else:
            mine.bytes_accessed += m.bytes_accessed
    if other.HasField("children"):
        _combine_db(into.children, other.children, child=True)


def _key(m: Any) -> tuple[int, str]:
    return (m.hlo_module_id, m.name)


def _combine_db(into: Any, other: Any, child: bool = False) -> None:
    ops = {_key(m): m for m in into.metrics_db}
    for m in other.metrics_db:
        mine = ops.get(_key(m))
        if mine is None:
            ops[_key(m)] = into.metrics_db.add()
            ops[_key(m)].CopyFrom(m)
        else:
            _combine_metrics(mine, m, child)
    for name in _DB_SUMMED:
        if getattr(other, name):
            setattr(into, name, getattr(into, name) + getattr(other, name))
    into.total_time_ps = max(into.total_time_ps, other.total_time_ps)
    if other.HasField("precision_stats"):
        into.precision_stats.compute_16bit_ps += other.precision_stats.compute_16bit_ps
        into.precision_stats.compute_32bit_ps += other.precision_stats.compute_32bit_ps


def _fix_idle(db: Any) -> None:
    idle = [m for m in db.metrics_db if m.name == IDLE_OP and not m.hlo_module_id]
    if idle:
        idle[0].time_ps = idle[0].self_time_ps = max(db.total_time_ps - db.total_op_time_ps, 0)


def seams(extents: Sequence[dict[str, tuple[int, int]]], host: HostActivity | None
          ) -> dict[str, Any]:
    """What the windows' op_stats cannot tell and `combine` needs, from the cut: the device
    time between windows (`idle_between`), the host database's total over the whole trace
    and why the host database would not add up ('' when it does)."""
    return {"idle_between_ps": idle_between(extents),
            "host_time_ps": None if host is None else host.total_time_ps(),
            "host_inexact": "" if host is None else host.inexact()}


def combine(parts: Sequence[Any], seams_of_cut: Mapping[str, Any] | None = None) -> Any:
    """One host's OpStats from its windows' (in time order); see the module's notes.
    `seams_of_cut` are the cut's (`seams`): without them, the device idle time between
    windows counts 0 and the host database's total is the largest window's."""
    from xprof.protobuf import op_stats_pb2

    if not parts:
        raise ValueError("no op_stats to combine")
    out = op_stats_pb2.OpStats()
    out.CopyFrom(parts[0])
    for p in parts[1:]:
        for name in _DBS:
            _combine_db(getattr(out, name), getattr(p, name))
        out.step_db.step_sequence.extend(p.step_db.step_sequence)
        out.step_db.num_steps_dropped += p.step_db.num_steps_dropped
        out.step_db.use_incomplete_step |= p.step_db.use_incomplete_step
        out.device_op_metrics_db.idle_time_ps += p.device_op_metrics_db.idle_time_ps
    cut = seams_of_cut or {}
    if len(parts) > 1 and out.device_op_metrics_db.idle_time_ps:
        out.device_op_metrics_db.idle_time_ps += int(cut.get("idle_between_ps") or 0)
    if cut.get("host_time_ps") is not None:
        out.host_op_metrics_db.total_time_ps = int(cut["host_time_ps"])
    for name in _DBS:
        _fix_idle(getattr(out, name))
    return out


def read(path: str | os.PathLike[str]) -> Any:
    from xprof.protobuf import op_stats_pb2

    o = op_stats_pb2.OpStats()
    o.ParseFromString(Path(path).read_bytes())
    return o
