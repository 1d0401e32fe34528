"""A vectorised reader of XSpace protobufs: event columns as NumPy arrays, not objects.

mldiag's own passes over a profile (the step timeline, the per-step op shares the detectors
use) need three numbers per event: which metadata it points at, when it started and how long it
ran. Large profiles hold millions of events, and xprof's readers hand them over one Python
object (or one C call) at a time, which costs several microseconds per event. Here the file is
memory-mapped and each line's events are decoded column-wise:

- the planes, lines and metadata tables are parsed field by field in Python (there are few);
- the boundaries of a line's repeated `events` field are found without visiting events one by
  one: every byte that could start an event (the field's tag) gets the offset of the event that
  would follow it, and the true chain from the first event is extracted by pointer doubling,
  in O(n log n) NumPy operations;
- the fields of all events of a line are then decoded together, one varint column at a time.

Serializers write a message's fields in field-number order, and the columns assume it. A
line whose first events are in another order (a hand-written writer) is decoded event by
event, field by field; so is any event whose id, offset or duration is not where that order
puts it. `int_stat` walks every field of an event, so stats are found wherever they are.

Field numbers follow `tsl/profiler/protobuf/xplane.proto` (XSpace.planes=1; XPlane id=1, name=2,
lines=3, event_metadata=4, stat_metadata=5, stats=6; XLine id=1, name=2, timestamp_ns=3,
events=4, duration_ps=9, display_id=10, display_name=11; XEvent metadata_id=1, offset_ps=2,
duration_ps=3, stats=4, num_occurrences=5; XStat metadata_id=1, double=2, uint64=3, int64=4,
str=5, bytes=6, ref=7; XEventMetadata id=1, name=2, stats=5; XStatMetadata id=1, name=2).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mldiag.analysis.collection.xspace.events import (
    ORDER_SAMPLE,
    Events,
    event_fields,
    in_field_order,
    signed,
    unique_ids,
)
from mldiag.analysis.collection.xspace.protobuf import (
    CorruptProtobuf,
    fields,
    optional_varints,
    read_varint,
    varints_at,
)

_EVENT_TAG = 0x22  # field 4 (XLine.events), wire type 2
# Bytes of a line chained at once (`XSpaceScan._chain`): about 20 times that in temporaries.
_CHAIN_BYTES = 16 << 20

I64 = NDArray[np.int64]
__all__ = ["CorruptXSpace", "Events", "Line", "Plane", "XSpaceScan", "unique_ids"]


# An XSpace that does not decode: the protobuf reader's error, by the name the scan's callers
# know.
CorruptXSpace = CorruptProtobuf


def _fields_until_events(buf: Any, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """Like `fields`, but an `events` field (4, length-delimited) is yielded as (4, 2, the offset
    of its tag, end) without being read: events are decoded column-wise, not one by one."""
    while pos < end:
        key, _ = read_varint(buf, pos, end)
        if key == _EVENT_TAG:
            yield 4, 2, pos, end
            return
        for item in fields(buf, pos, end):
            yield item
            pos = item[3]
            break


@dataclass
class Line:
    name: str
    timestamp_ns: int
    _space: XSpaceScan = field(repr=False)
    _blocks: list[tuple[int, int]] = field(default_factory=list, repr=False)
    _events: Events | None = field(default=None, repr=False)
    # The line's payload in the file (between its length prefix and its end).
    _payload: tuple[int, int] = (0, 0)
    # A chunk's events, chained already (`XSpaceScan.chunks`).
    _tags: I64 | None = field(default=None, repr=False)
    id: int = 0

    @property
    def key(self) -> tuple[int, int]:
        """Which line of the file this is: the same for every chunk of it."""
        return self._payload

    @property
    def events(self) -> Events:
        """Decoded on first use, then kept: lines a pass does not need cost nothing."""
        if self._events is None:
            self._events = (self._space.decode_events(self._blocks) if self._tags is None
                            else self._space._decode_block(self._tags))
        return self._events

    def has_events(self) -> bool:
        """Whether the line has an event, from the file's structure (nothing decoded)."""
        return bool(self._blocks) and self._blocks[0][0] < self._blocks[0][1]

    def start_ns(self) -> NDArray[np.float64]:
        ev = self.events
        return self.timestamp_ns + ev.offset_ps.astype(np.float64) / 1000.0

    def duration_ns(self) -> NDArray[np.float64]:
        return self.events.duration_ps.astype(np.float64) / 1000.0


@dataclass
class Plane:
    name: str
    lines: list[Line]
    event_names: dict[int, str]
    stat_names: dict[int, str]
    # Byte ranges of each event metadata's own stats, for stat lookups by metadata.
    event_metadata_stats: dict[int, list[tuple[int, int]]]
    # (field number, start of its key, end) of each field of the plane, in file order.
    _fields: list[tuple[int, int, int]] = field(default_factory=list, repr=False)

    def stat_id(self, name: str) -> int | None:
        for k, v in self.stat_names.items():
            if v == name:
                return k
        return None


class XSpaceScan:
    """One xplane file, memory-mapped; planes and lines parsed, events decoded lazily.

    Use as a context manager (the map is closed on exit). Raises CorruptXSpace with a one-line
    reason when the file does not parse.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._file = open(self.path, "rb")  # noqa: SIM115 - closed in close()
        size = os.fstat(self._file.fileno()).st_size
        if size == 0:
            self._file.close()
            raise CorruptXSpace("empty file (0 bytes)")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self.buf = np.frombuffer(self._map, dtype=np.uint8)
        self.size = size
        self._trailing: dict[tuple[int, int], str] = {}
        # Byte ranges of the space's other fields (errors, warnings, hostnames), kept on writes.
        self._space_fields: list[tuple[int, int]] = []
        self.planes = self._parse_space()

    def __enter__(self) -> XSpaceScan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for plane in getattr(self, "planes", []):
            for line in plane.lines:
                line._events = None
        self.buf = np.empty(0, dtype=np.uint8)
        try:
            self._map.close()
        except BufferError:
            # A caller still holds a view of the map; it is released with that view.
            pass
        self._file.close()

    # -- structure -----------------------------------------------------------------------------

    def _parse_space(self) -> list[Plane]:
        m = self._map
        planes = []
        key_at = 0
        for num, wt, start, end in fields(m, 0, self.size):
            if num == 1 and wt == 2:
                planes.append(self._parse_plane(start, end))
            else:
                self._space_fields.append((key_at, end))
            key_at = end
        return planes

    def _parse_plane(self, pos: int, end: int) -> Plane:
        m = self._map
        name = ""
        lines: list[Line] = []
        event_names: dict[int, str] = {}
        stat_names: dict[int, str] = {}
        md_stats: dict[int, list[tuple[int, int]]] = {}
        layout: list[tuple[int, int, int]] = []
        key_at = pos
        for num, wt, start, stop in fields(m, pos, end):
            layout.append((num, key_at, stop))
            key_at = stop
            if wt != 2:
                continue
            if num == 2:
                name = m[start:stop].decode("utf-8", errors="replace")
            elif num == 3:
                lines.append(self._parse_line(start, stop))
            elif num in (4, 5):
                key, value = 0, None
                for n2, w2, s2, e2 in fields(m, start, stop):
                    if n2 == 1 and w2 == 0:
                        key = signed(s2)
                    elif n2 == 2 and w2 == 2:
                        value = (s2, e2)
                if value is None:
                    continue
                md_name, stats = "", []
                for n3, w3, s3, e3 in fields(m, value[0], value[1]):
                    if n3 == 2 and w3 == 2:
                        md_name = m[s3:e3].decode("utf-8", errors="replace")
                    elif num == 4 and n3 == 5 and w3 == 2:
                        stats.append((s3, e3))
                if num == 4:
                    event_names[key] = md_name
                    if stats:
                        md_stats[key] = stats
                else:
                    stat_names[key] = md_name
        return Plane(name=name, lines=lines, event_names=event_names, stat_names=stat_names,
                     event_metadata_stats=md_stats, _fields=layout)

    def _parse_line(self, pos: int, end: int) -> Line:
        m = self._map
        name = ""
        timestamp_ns = line_id = 0
        events_at = end
        for n, w, value, stop in _fields_until_events(m, pos, end):
            if n == 4:
                events_at = value
                break
            if n == 1 and w == 0:
                line_id = signed(value)
            elif n == 2 and w == 2:
                name = m[value:stop].decode("utf-8", errors="replace")
            elif n == 3 and w == 0:
                timestamp_ns = signed(value)
        line = Line(name=name, timestamp_ns=timestamp_ns, _space=self,
                    _blocks=[(events_at, end)], _payload=(pos, end), id=line_id)
        if not name:
            # The display name (field 11) follows the events: find them, then read on.
            line.events  # noqa: B018 - decodes and records the trailing fields
            line.name = self._trailing.pop((events_at, end), "")
        return line

    # -- events --------------------------------------------------------------------------------

    def _chain(self, start: int, end: int, limit: int) -> I64:
        """Offsets of the consecutive events fields from `start` (whose byte is the tag) that
        start before `limit` (≤ `end`, the line's end): the chain's arrays hold one entry per
        candidate byte, so a long line is chained `_CHAIN_BYTES` at a time (the next run
        starts where the last event found ends)."""
        seg = self.buf[start:end]
        cand = np.flatnonzero(seg[:limit - start] == _EVENT_TAG)
        # Length varint after each candidate tag; event bodies are short, but decode fully.
        length, body = varints_at(seg, cand + 1)
        nxt = body + length
        ok = (length >= 0) & (nxt <= len(seg))
        # Successor: the candidate at `nxt`, else the sentinel (end of the run). Indices fit
        # 32 bits (a line is under 2 GiB), which halves the memory traffic of the rounds below.
        n = len(cand)
        index = np.int32 if n < 2**31 - 1 else np.int64
        idx = np.searchsorted(cand, nxt)
        idx_c = np.minimum(idx, n - 1)
        succ = np.where(ok & (idx < n) & (cand[idx_c] == nxt), idx, n).astype(index)
        succ = np.append(succ, np.array([n], dtype=index))
        # After k rounds `on` marks the first 2**k events of the chain; it is complete once it
        # reaches the sentinel.
        on = np.zeros(n + 1, dtype=bool)
        on[0] = True
        jump = succ
        while not on[n]:
            on[jump[np.flatnonzero(on)]] = True
            jump = jump[jump]
        members = np.flatnonzero(on[:n])
        if not ok[members[-1]]:
            raise CorruptXSpace("truncated or corrupt protobuf (an event runs past its line)")
        return cand[members].astype(np.int64) + start

    def decode_events(self, blocks: list[tuple[int, int]]) -> Events:
        parts = [self._decode_block(tags) for tags in self._segments(blocks)]
        if not parts:
            z = np.zeros(0, dtype=np.int64)
            return Events(z, z, z, z, self.buf)
        if len(parts) == 1:
            return parts[0]
        return Events.concatenate(parts, self.buf)

    def _segments(self, blocks: list[tuple[int, int]]) -> Iterator[I64]:
        """The tags of a line's events, one chained run (`_chain`) at a time."""
        for start, end in blocks:
            pos = start
            while pos < end:
                tags = self._chain(pos, end, min(end, pos + _CHAIN_BYTES))
                yield tags
                length, body = varints_at(self.buf, tags[-1:] + 1)
                pos = int(body[0] + length[0])
                # Fields after the run (duration_ps, display_id, display_name), and any
                # further run of events (writers need not keep a message's fields in order).
                for n, w, value, stop in _fields_until_events(self._map, pos, end):
                    if n == 4:
                        pos = value
                        break
                    if n == 11 and w == 2:
                        self._trailing[(start, end)] = self._map[value:stop].decode(
                            "utf-8", errors="replace")
                    pos = stop

    def chunks(self, line: Line) -> Iterator[Line]:
        """The line cut into lines of consecutive events (about `_CHAIN_BYTES` each, same
        name and timestamp), each decoded on first use: a pass that treats events one by one
        holds one chunk's columns, not a long line's."""
        for tags in self._segments(line._blocks):
            length, body = varints_at(self.buf, tags[-1:] + 1)
            yield Line(name=line.name, timestamp_ns=line.timestamp_ns, _space=self,
                       _blocks=[(int(tags[0]), int(body[0] + length[0]))],
                       _payload=line._payload, _tags=tags, id=line.id)

    def _decode_block(self, tags: I64) -> Events:
        buf = self.buf
        length, pos = varints_at(buf, tags + 1)
        body_end = pos + length
        body = pos.copy()
        mid = optional_varints(buf, pos, body_end, 0x08)
        if np.any(pos > body_end):
            raise CorruptXSpace("truncated or corrupt protobuf (bad event)")
        # An event that does not start with its metadata id (written out of field-number
        # order, or without one): its id decoded field by field, its times from its start.
        odd = np.flatnonzero((mid == 0) & (body < body_end))
        for i in odd.tolist():
            mid[i] = event_fields(buf, int(body[i]), int(body_end[i]))[0]
        events = Events(mid, body_end, tags, pos, buf)
        events.odd = odd
        # A writer orders every event's fields alike: when the first events are not in
        # field-number order (as serializers write them), the block is decoded field by field.
        events.unordered = any(
            not in_field_order(buf, int(b), int(e))
            for b, e in zip(body[:ORDER_SAMPLE].tolist(), body_end[:ORDER_SAMPLE].tolist(),
                            strict=True))
        return events

    def passing(self, pairs: Iterable[tuple[Plane, Line]] | None = None
                ) -> Iterator[tuple[Plane, Line]]:
        """(plane, line) of `pairs` (default: every line), each line's events let go once the
        caller moves on unless they were decoded before: a pass over a large file holds one
        line's columns at a time instead of the whole file's."""
        if pairs is None:
            pairs = ((plane, line) for plane in self.planes for line in plane.lines)
        for plane, line in pairs:
            was_decoded = line._events is not None
            yield plane, line
            if not was_decoded:
                line._events = None
                # A chunk (`XSpaceScan.chunks`) holds its own bytes only.
                a, b = line._payload if line._tags is None else line._blocks[0]
                self.release_pages(a, b)

    def release_pages(self, start: int, end: int) -> None:
        """Drop the mapped file's pages in [start, end) from this process's resident memory
        (they stay in the page cache, and are read back if touched again): a pass over a
        large file holds one plane's pages, not the whole file's."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        lo = -(-start // page) * page
        hi = (end // page) * page
        if hi > lo:
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    # -- stats ---------------------------------------------------------------------------------

    def fields(self, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
        """`protobuf.fields` of the file's bytes [start, end)."""
        return fields(self._map, start, end)

    def stats_of(self, start: int, end: int) -> Iterator[tuple[int, Any]]:
        """(stat metadata id, value) of each XStat in the bytes [start, end) of an event."""
        for num, wt, s, e in fields(self._map, start, end):
            if num == 4 and wt == 2:
                yield self.stat(s, e)

    def stat(self, start: int, end: int) -> tuple[int, Any]:
        """(stat metadata id, value) of one XStat message (an event's, or a metadata's)."""
        m = self._map
        sid, value = 0, None  # type: tuple[int, Any]
        for n2, w2, s2, e2 in fields(m, start, end):
            if n2 == 1 and w2 == 0:
                sid = s2
            elif n2 == 2 and w2 == 1:
                value = struct.unpack("<d", m[s2:e2])[0]
            elif n2 in (3, 7) and w2 == 0:
                value = s2
            elif n2 == 4 and w2 == 0:
                value = signed(s2)
            elif n2 in (5, 6) and w2 == 2:
                value = m[s2:e2].decode("utf-8", errors="replace")
        return sid, value

    def stat_at(self, events: Events, stat_ids: Sequence[int | None], max_stats: int = 64,
                first: bool = False) -> I64:
        """Where the values of stats `stat_ids` are on every event, one row per stat id: the
        offset of the value field's tag in the file, of the last such stat (as xprof's stat
        visitors leave it; with `first`, of the first, as its `GetStat` finds it, and -2
        where that one has no value: a zero or empty one), or -1 where the event has none (or
        the id is None)."""
        out = np.full((len(stat_ids), len(events)), -1, dtype=np.int64)
        for at, is_stat, sid, vpos, stat_end in self._stat_rounds(events, max_stats):
            valued = vpos < stat_end
            if not first:
                is_stat &= valued
            for row, stat_id in enumerate(stat_ids):
                if stat_id is not None:
                    hit = is_stat & (sid == stat_id)
                    if first:
                        hit &= out[row, at] == -1
                    out[row, at[hit]] = np.where(valued[hit], vpos[hit], -2)
        return out

    def int_stat(self, events: Events, stat_id: int, max_stats: int = 64) -> I64:
        """The integer value of stat `stat_id` on every event (-1 where it has none)."""
        buf = self.buf
        out = np.full(len(events), -1, dtype=np.int64)
        for at, is_stat, sid, vpos, stat_end in self._stat_rounds(events, max_stats):
            val = np.full(len(at), -1, dtype=np.int64)
            for tag in (0x18, 0x20, 0x38):
                v = optional_varints(buf, vpos.copy(), stat_end, tag, missing=-2)
                val = np.where(v != -2, v, val)
            hit = is_stat & (sid == stat_id) & (out[at] == -1)
            out[at[hit]] = val[hit]
        return out

    def _stat_rounds(self, events: Events, max_stats: int
                     ) -> Iterator[tuple[I64, NDArray[np.bool_], I64, I64, I64]]:
        """Every event's fields after its id and times, one round per position, all events at
        once: (the events still reading, whether the field is a stat, its stat metadata id,
        where its value field starts, where the stat ends). Any other field is stepped over
        too (an event written out of field-number order has its id, offset or duration among
        its stats)."""
        buf = self.buf
        pos = events.stats_start.copy()
        end = events.body_end
        active = pos < end
        for _ in range(max_stats):
            if not active.any():
                break
            at = np.flatnonzero(active)
            p = pos[at]
            key = buf[p]
            wire = key & 7
            length, body = varints_at(buf, p + 1)
            stat_end = body + length
            sid = optional_varints(buf, body.copy(), stat_end, 0x08)
            vpos = body.copy()
            optional_varints(buf, vpos, stat_end, 0x08)
            yield at, key == _EVENT_TAG, sid, vpos, stat_end
            nxt = np.select([wire == 2, wire == 0, wire == 1, wire == 5],
                            [stat_end, body, p + 9, p + 5], default=end[at])
            pos[at] = nxt
            active[at] = nxt < end[at]
