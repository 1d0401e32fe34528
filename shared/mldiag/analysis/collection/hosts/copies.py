"""Copies of a host that xprof's converters read instead of its whole trace.

- `reduce_one`: the trace without its Python-tracer events, which feed no collection tool
  (the converters' input on Python-traced profiles);
- `memory_copy`: the few events the memory profile and the smart suggestions read;
- `peaks_memory_profile`: the memory profile from each allocator's peak event alone
  (`memory_peaks`).

Each copy is written in one pass (`xspace.write`), one chunk of a line at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mldiag.analysis.collection.hosts import memory_allocators
from mldiag.analysis.collection.hosts.memory_peaks import MEMORY_EVENTS, write_peaks
from mldiag.analysis.collection.xprof_tools import XprofWorkspace
from mldiag.analysis.collection.xspace.scan import Line, Plane, XSpaceScan
from mldiag.analysis.collection.xspace.write import write_filtered

# Event names whose share of each step xprof's smart suggestions measure from the XSpace
# (its EventTimeFractionAnalyzer: barrier-cores and debug_print, matched as substrings).
SMART_EVENTS = ("barrier-cores", "debug_print")
MEMORY_DIR = "memory"


def memory_copy(ws: XprofWorkspace, scan: XSpaceScan, xplane: Path) -> dict[str, Any]:
    """A copy of one host for xprof's memory profile and smart suggestions: each allocator's
    peak event among its host plane's allocator events (`memory_peaks.write_peaks`, a second
    pass over the copy), its TPU planes' `XLA Modules` and `Steps` lines, and the events the
    smart suggestions time (`SMART_EVENTS`); every other event dropped (lines and metadata
    kept).

    The memory profile reads nothing else (xprof's `ConvertXSpaceToMemoryProfileJson`), and
    what its CLI tool prints comes from the allocators' peak events alone. The smart
    suggestions read the XSpace only for that profile and for the share of each step
    that `SMART_EVENTS` take (xprof's event-time-fraction analyzer): a step's time comes from
    its step markers (the `Steps` and module lines, kept whole), the events' own times from
    their stats (kept), and on host lines from each line's span (its first start and last
    end: those two events are kept). So with op_stats from the saved file both answer the
    same from this copy (94 MB TPU-shaped: the memory profile 2.9 s CPU on the file, 0.7 s
    on the copy; the smart suggestions 5.3 s, 0.3 s). Written to the workspace's `memory`
    run directory.
    """
    target = ws.side_run_dir(MEMORY_DIR) / xplane.name
    target.unlink(missing_ok=True)
    smart_events = any(t in name for plane in scan.planes
                       for name in plane.event_names.values() for t in SMART_EVENTS)
    kept, _ = write_filtered(scan, target, _memory_events)
    allocators = {}
    if any(name in MEMORY_EVENTS for plane in scan.planes if plane.name.startswith("/host:")
           for name in plane.event_names.values()):
        # Of the allocator events, each allocator's peak alone: the memory profile's summary,
        # and the smart suggestions' memory profile, are the same from them.
        peaks = target.with_name(f".{target.name}.peaks")
        allocators = write_peaks(target, peaks, host_plane_only=False)["allocators"]
        peaks.replace(target)
    return {"memory_copy_bytes": target.stat().st_size, "memory_events": kept,
            "smart_events": smart_events, "allocators": len(allocators)}


_STEP_LINES = ("XLA Modules", "Steps")


def _memory_events(plane: Plane, line: Line) -> Any:
    if plane.name.startswith("/device:") and line.name in _STEP_LINES:
        return None
    ev = line.events
    if not len(ev):
        return None
    smart = [k for k, v in plane.event_names.items() if any(t in v for t in SMART_EVENTS)]
    mask = np.isin(ev.metadata_id, smart) if smart else np.zeros(len(ev), dtype=bool)
    if plane.name.startswith("/host:"):
        memory = [k for k, v in plane.event_names.items() if v in MEMORY_EVENTS]
        if memory:
            mask |= np.isin(ev.metadata_id, memory)
        if smart:
            # The line's span, which the host-side fraction divides by.
            mask[int(np.argmin(ev.offset_ps))] = True
            mask[int(np.argmax(ev.offset_ps + ev.duration_ps))] = True
    return None if mask.all() else mask


def reduce_one(ws: XprofWorkspace, scan: XSpaceScan, xplane: Path) -> dict[str, Any]:
    """The workspace's copy of one host without its Python-tracer events, written over the
    run directory's link to the trace (none written when there are none: a trace whose host
    planes name no Python-tracer event is not copied at all, 1.9 GB of writes at 1.9 GB)."""
    target = ws.run_dir / xplane.name
    if not any(plane.name.startswith("/host:") and any(
            n.startswith("$") for n in plane.event_names.values()) for plane in scan.planes):
        size = xplane.stat().st_size
        return {"events_kept_on_filtered_lines": 0, "python_events_dropped": 0,
                "bytes_in": size, "bytes_out": size}
    tmp = target.with_name(f".{xplane.name}.reduced")
    kept, dropped = write_filtered(scan, tmp, _drop_python_events)
    if dropped:
        target.unlink()
        tmp.replace(target)
    else:
        tmp.unlink()
    return {"events_kept_on_filtered_lines": kept, "python_events_dropped": dropped,
            "bytes_in": xplane.stat().st_size, "bytes_out": target.stat().st_size}


_XLA_THREADS = ("tf_XLA",)


def _drop_python_events(plane: Plane, line: Line) -> Any:
    # XLA's executor threads (tf_XLA*) never run Python: their lines are copied whole without
    # being decoded here (the timeline pass decodes them later, beside the op_stats build).
    if not plane.name.startswith("/host:") or line.name.startswith(_XLA_THREADS):
        return None
    python = [k for k, v in plane.event_names.items() if v.startswith("$")]
    if not python:
        return None
    ev = line.events
    if not len(ev):
        return None
    mask = ~np.isin(ev.metadata_id, python)
    return None if mask.all() else mask


PEAKS_DIR = "memory_peaks"
# Below this size xprof's converter reads the file itself: the pass that finds the peaks,
# and its copy, cost more than they save (0.06 s against 0.11 s on the 0.9 MB TPU fixture).
PEAKS_MIN_BYTES = 16 * 1024**2


def peaks_memory_profile(ws: XprofWorkspace, src: Path, only_host: str | None) -> dict[str, Any]:
    """xprof's `get_memory_profile` of one host (`src`, its trace or its memory copy, in a
    run directory of `ws`). From `PEAKS_MIN_BYTES` on, run on a copy of the host plane that
    keeps only each allocator's peak event (`memory_peaks.write_peaks`): the tool prints the
    same, and the converter no longer holds every allocator event (3.3 GB on the 264 MB
    memory copy of a 1.9 GB TPU-shaped host; 0.18 GB for the copy's pass)."""
    if src.stat().st_size < PEAKS_MIN_BYTES:
        run_dir = src.parent
    else:
        run_dir = ws.side_run_dir(PEAKS_DIR)
        target = run_dir / src.name
        target.unlink(missing_ok=True)
        write_peaks(src, target)
    cli = ws.call("get_memory_profile", only_host=only_host, run_dir=run_dir)
    return {**cli, memory_allocators.KEY: allocators_of(ws, run_dir, only_host, cli)}


def allocators_of(ws: XprofWorkspace, run_dir: Path, only_host: str | None,
                  cli: dict[str, Any]) -> dict[str, Any]:
    """Each allocator's figures from the converter the CLI tool read (`memory_allocators`),
    or why there are none; never raises (the CLI's own result stands without them)."""
    try:
        raw = ws.fetch_tool_data("memory_profile", run_dir=run_dir, only_host=only_host)
        found = memory_allocators.summarize(raw, cli)
    except Exception as e:  # noqa: BLE001 - the CLI's summary is kept, the reason recorded
        return {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
    return found if found is not None else {
        "error": "xprof's memory_profile converter names no allocator"}
