"""The allocator events xprof's memory profile summary comes from, kept alone.

`get_memory_profile` (xprof's CLI tool) reports each allocator's peak from xprof's memory
profile converter (`xplane_to_memory_profile.cc`). The converter turns every
`MemoryAllocation` and `MemoryDeallocation` event of the host plane (`/host:CPU`) into a
snapshot and holds them all, so its memory follows the trace: 2.1 GB for the 198 MB host
plane of a 1.9 GB TPU-shaped host's memory copy.

What the tool prints depends on one event per allocator. The converter's
`UpdateProfileSummary` visits the events line by line, in file order, and takes as the
allocator's peak the last event whose `bytes_reserved + bytes_allocated` reaches the
allocator's maximum (`>=`). The peak's stack, heap, free bytes and fragmentation are that
event's, and so is the memory capacity (stack + heap + free). The allocator is the event's
last `index_on_host`, `device_ordinal` or `allocator_name` stat.

`write_peaks` finds those events column-wise, one chunk of a line at a time
(`XSpaceScan.chunks`), and writes a copy of the host plane holding only them, with every
metadata table. xprof's own tool then answers from that copy, in the memory of a handful of
events. The other figures of the converter's output (the timeline, active allocations, the
lifetime peak, the HLO modules from the device planes) change, but the CLI tool does not
print them.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from mldiag.analysis.collection.xspace.scan import (
    I64,
    Line,
    Plane,
    XSpaceScan,
    varints_at,
)
from mldiag.analysis.collection.xspace.write import write_filtered

HOST_PLANE = "/host:CPU"  # tsl's kHostThreadsPlaneName
MEMORY_EVENTS = ("MemoryAllocation", "MemoryDeallocation")
_ID_STATS = ("index_on_host", "device_ordinal", "allocator_name")
_USAGE_STATS = ("bytes_reserved", "bytes_allocated")


def peak_events(scan: XSpaceScan) -> dict[str, tuple[int, int]]:
    """Per allocator (xprof's memory id): (its peak bytes, where in the file its peak event
    is), as xprof's converter picks it. Empty without allocator events."""
    plane = next((p for p in scan.planes if p.name == HOST_PLANE), None)
    if plane is None:
        return {}
    memory = [k for k, v in plane.event_names.items() if v in MEMORY_EVENTS]
    if not memory:
        return {}
    ids = {name: plane.stat_id(name) for name in (*_ID_STATS, *_USAGE_STATS)}
    best: dict[str, tuple[int, int]] = {}
    for line in plane.lines:
        for chunk in scan.passing((plane, c) for c in scan.chunks(line)):
            _chunk_peaks(scan, plane, chunk[1], memory, ids, best)
    return best


def _chunk_peaks(scan: XSpaceScan, plane: Plane, line: Line, memory: list[int],
                 ids: dict[str, int | None], best: dict[str, tuple[int, int]]) -> None:
    everything = line.events
    sel = np.flatnonzero(np.isin(everything.metadata_id, memory))
    if not len(sel):
        return
    ev = everything.take(sel)
    at = scan.stat_at(ev, [ids[n] for n in (*_USAGE_STATS, *_ID_STATS)])
    usage = _int_values(scan, at[0]) + _int_values(scan, at[1])
    # Per allocator, in event order: the last event at its maximum.
    for name, mine in _by_memory_id(scan, plane, at[2:]).items():
        peak = int(usage[mine].max())
        last = int(mine[np.flatnonzero(usage[mine] == peak)[-1]])
        if name not in best or peak >= best[name][0]:
            best[name] = (peak, int(ev.tag_at[last]))


def _int_values(scan: XSpaceScan, at: I64, tags: tuple[int, ...] = (0x20,)) -> I64:
    """xprof's `IntValue()` of the stats whose value fields are `at`: an int64 value (tag
    0x20), else 0 (absent, or a uint64, double, string or reference: `IntValue()` reads
    the int64 field alone). With `tags`, the varint of those value fields instead."""
    ok = at >= 0
    tag = np.where(ok, scan.buf[np.where(ok, at, 0)], 0)
    value, _ = varints_at(scan.buf, np.where(ok, at, 0) + 1)
    return np.where(ok & np.isin(tag, tags) & (value >= 0), value, 0)


# Allocator names compared as fixed-width byte rows up to this length (longer ones one by one).
_NAME_BYTES = 64


def _by_memory_id(scan: XSpaceScan, plane: Plane, at: I64) -> dict[str, I64]:
    """The events (indices, ascending) of each memory id: an event's last id stat among
    `_ID_STATS` (rows of `at`), as xprof's `absl::StrCat(IntValue())` of an index or
    ordinal, or the allocator's name (a string, or a reference to a stat metadata's name);
    "" without one."""
    n = at.shape[1]
    which = np.argmax(at, axis=0)
    where = at[which, np.arange(n)]
    value = _int_values(scan, where)
    ref = _int_values(scan, where, (0x38,))
    tag = np.where(where >= 0, scan.buf[np.maximum(where, 0)], 0)
    named = (which == _ID_STATS.index("allocator_name")) & (where >= 0)
    groups: dict[str, list[I64]] = {}

    def add(name: str, idx: I64) -> None:
        groups.setdefault(name, []).append(idx)

    add("", np.flatnonzero(where < 0))
    for kind, column, names in (((where >= 0) & ~named, value, str),
                                (named & (tag == 0x38), ref,
                                 lambda v: plane.stat_names.get(v, ""))):
        idx = np.flatnonzero(kind)
        keys, inverse = np.unique(column[idx], return_inverse=True)
        for k, key in enumerate(keys.tolist()):
            add(names(key), idx[inverse == k])
    # `StrOrRefValue()` of any other value (bytes, a number) is empty.
    add("", np.flatnonzero(named & (tag != 0x38) & (tag != 0x2A)))
    idx = np.flatnonzero(named & (tag == 0x2A))
    if len(idx):
        length, body = varints_at(scan.buf, where[idx] + 1)
        short = length <= _NAME_BYTES
        cols = np.arange(_NAME_BYTES)
        grab = np.minimum(body[short, None] + cols, scan.size - 1)
        rows = np.where(cols < length[short, None], scan.buf[grab], 0).astype(np.uint8)
        rows = np.column_stack([rows, length[short]])
        _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        for k, i in enumerate(first.tolist()):
            add(_string(scan, int(body[short][i]), int(length[short][i])),
                idx[short][inverse.reshape(-1) == k])
        for i, b, ln in zip(idx[~short].tolist(), body[~short].tolist(),
                            length[~short].tolist(), strict=True):
            add(_string(scan, b, ln), np.array([i], dtype=np.int64))
    return {name: np.sort(np.concatenate(parts)) for name, parts in groups.items()
            if sum(len(p) for p in parts)}


def _string(scan: XSpaceScan, start: int, length: int) -> str:
    return bytes(scan.buf[start:start + length]).decode("utf-8", errors="replace")


def write_peaks(src: str | os.PathLike[str], out: str | os.PathLike[str], *,
                host_plane_only: bool = True) -> dict[str, Any]:
    """A copy of `src` with only its allocators' peak events (`peak_events`) among its
    allocator events, every metadata table kept, written to `out`: xprof's
    `get_memory_profile` prints the same from it as from `src`. The copy holds the host plane
    alone, or with `host_plane_only=False` every plane and every other event (and each host
    line's first and last event, whose span xprof's smart suggestions divide by), for the
    converters that read a host's memory copy. Returns the allocators and their peak bytes."""
    with XSpaceScan(src) as scan:
        best = peak_events(scan)
        tags = np.array(sorted(t for _, t in best.values()), dtype=np.int64)
        host = next((p for p in scan.planes if p.name == HOST_PLANE), None)
        memory = ([k for k, v in host.event_names.items() if v in MEMORY_EVENTS]
                  if host is not None else [])

        def keep(plane: Plane, line: Line) -> Any:
            if host_plane_only:
                return np.isin(line.events.tag_at, tags)
            if plane is not host or not memory:
                return None
            ev = line.events
            if not len(ev):
                return None
            mask = ~np.isin(ev.metadata_id, memory) | np.isin(ev.tag_at, tags)
            mask[int(np.argmin(ev.offset_ps))] = True
            mask[int(np.argmax(ev.offset_ps + ev.duration_ps))] = True
            return None if mask.all() else mask

        write_filtered(scan, out, keep,
                       planes=(lambda plane: plane.name == HOST_PLANE) if host_plane_only
                       else None)
    return {"allocators": {name: peak for name, (peak, _) in sorted(best.items())}}
