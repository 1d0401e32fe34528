"""A line's events as NumPy columns (`Events`), decoded from the mapped file in one go:
the metadata ids, where each event's body ends and its tag starts; offsets and durations on
first use. `XSpaceScan` finds the events and builds these; the passes read them.

Serializers write an event's fields in field-number order (XEvent metadata_id=1,
offset_ps=2, duration_ps=3, stats=4, num_occurrences=5), and the columns assume it: an event
whose fields are elsewhere is decoded field by field (`event_fields`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from mldiag.analysis.collection.xspace.protobuf import (
    MAX_VARINT,
    CorruptProtobuf,
    fields,
    optional_varints,
    read_varint,
)

I64 = NDArray[np.int64]


def signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


class Events:
    """The events of one line as columns (one entry per event, in file order).

    Which metadata each event points at, and where its bytes are, are decoded at once; its
    offset, duration and where its stats start on first use. Offsets and durations are the
    long varints, most of the decoding time, and copying or filtering events (the reduction
    on the critical path of collection) needs neither.
    """

    __slots__ = ("metadata_id", "body_end", "tag_at", "_after_mid", "_buf", "_offset_ps",
                 "_duration_ps", "_stats_start", "unordered", "odd")

    def __init__(self, metadata_id: I64, body_end: I64, tag_at: I64, after_mid: I64,
                 buf: NDArray[np.uint8]) -> None:
        self.metadata_id = metadata_id
        # Where each event's body ends, and where its field starts (its tag byte), in bytes
        # of the file.
        self.body_end = body_end
        self.tag_at = tag_at
        self._after_mid = after_mid
        self._buf = buf
        self._offset_ps: I64 | None = None
        self._duration_ps: I64 | None = None
        self._stats_start: I64 | None = None
        # Written out of field-number order (see `XSpaceScan._decode_block`): every event is
        # decoded field by field, or those in `odd` (indices) only.
        self.unordered = False
        self.odd: I64 = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.metadata_id)

    def _decode_times(self) -> None:
        if self.unordered:
            n = len(self)
            self._offset_ps = np.zeros(n, dtype=np.int64)
            self._duration_ps = np.zeros(n, dtype=np.int64)
            self._stats_start = np.zeros(n, dtype=np.int64)
            for i in range(n):
                body = body_start(self._buf, int(self.tag_at[i]))
                _, self._offset_ps[i], self._duration_ps[i] = event_fields(
                    self._buf, body, int(self.body_end[i]))
                self._stats_start[i] = body
            return
        pos = self._after_mid.copy()
        self._offset_ps = optional_varints(self._buf, pos, self.body_end, 0x10, missing=_ABSENT)
        absent = self._offset_ps == _ABSENT
        self._offset_ps[absent] = 0
        self._duration_ps = optional_varints(self._buf, pos, self.body_end, 0x18)
        if np.any(pos > self.body_end):
            raise CorruptProtobuf("truncated or corrupt protobuf (bad event)")
        # Serializers write fields in field-number order: after the id, offset and duration
        # come stats (4) and num_occurrences (5). An event whose next field is another, or
        # without an offset where it belongs (else it counts occurrences), is written in
        # another order, and decoded field by field instead.
        at = np.minimum(pos, len(self._buf) - 1)
        odd = np.union1d(self.odd, np.flatnonzero(
            absent | (pos < self.body_end) & ~np.isin(self._buf[at], _LATE_TAGS)))
        for i in odd.tolist():
            body = body_start(self._buf, int(self.tag_at[i]))
            got = event_fields(self._buf, body, int(self.body_end[i]))
            self.metadata_id[i], self._offset_ps[i], self._duration_ps[i] = got
            # `int_stat` reads stats wherever they are among the event's fields.
            pos[i] = body
        self._stats_start = pos

    def _times(self) -> tuple[I64, I64, I64]:
        """Offsets, durations and stats starts, decoded together on first use."""
        if self._stats_start is None:
            self._decode_times()
        assert self._offset_ps is not None and self._duration_ps is not None
        assert self._stats_start is not None
        return self._offset_ps, self._duration_ps, self._stats_start

    @property
    def offset_ps(self) -> I64:
        return self._times()[0]

    @property
    def duration_ps(self) -> I64:
        return self._times()[1]

    @property
    def stats_start(self) -> I64:
        """Where each event's stats start, in bytes of the file."""
        return self._times()[2]

    def take(self, idx: I64) -> Events:
        """The events at `idx` (ascending), as columns of their own."""
        events = Events(self.metadata_id[idx], self.body_end[idx], self.tag_at[idx],
                        self._after_mid[idx], self._buf)
        events.unordered = self.unordered
        events.odd = np.flatnonzero(np.isin(idx, self.odd))
        return events

    @classmethod
    def concatenate(cls, parts: list[Events], buf: NDArray[np.uint8]) -> Events:
        def joined(field_name: str) -> I64:
            return np.concatenate([getattr(p, field_name) for p in parts])

        events = cls(joined("metadata_id"), joined("body_end"), joined("tag_at"),
                     joined("_after_mid"), buf)
        events.unordered = any(p.unordered for p in parts)
        starts = np.cumsum([0] + [len(p) for p in parts[:-1]])
        events.odd = np.concatenate([p.odd + k for p, k in zip(parts, starts.tolist(),
                                                                 strict=True)])
        return events


# Fields that may follow an event's id, offset and duration in field-number order:
# XEvent.stats (4, length-delimited) and XEvent.num_occurrences (5, varint).
_LATE_TAGS = np.array([0x22, 0x28], dtype=np.uint8)
# An optional field not present (no varint decodes to it).
_ABSENT = -(1 << 62)


# Events of each block whose field order is checked.
ORDER_SAMPLE = 64


def in_field_order(buf: NDArray[np.uint8], start: int, end: int) -> bool:
    body = bytes(buf[start:end])
    numbers = [num for num, _, _, _ in fields(body, 0, len(body))]
    return numbers == sorted(numbers)


def body_start(buf: NDArray[np.uint8], tag_at: int) -> int:
    head = bytes(buf[tag_at + 1:tag_at + 1 + MAX_VARINT])
    _, after = read_varint(head, 0, len(head))
    return tag_at + 1 + after


def event_fields(buf: NDArray[np.uint8], start: int, end: int) -> tuple[int, int, int]:
    """(metadata_id, offset_ps, duration_ps) of one event, its fields in any order."""
    mid = offset = duration = 0
    body = bytes(buf[start:end])
    for num, wt, value, _ in fields(body, 0, len(body)):
        if wt != 0:
            continue
        if num == 1:
            mid = signed(value)
        elif num == 2:
            offset = signed(value)
        elif num == 3:
            duration = signed(value)
    return mid, offset, duration


def unique_ids(ids: I64) -> tuple[I64, I64, I64]:
    """`np.unique(ids, return_index=True, return_inverse=True)` for id columns.

    Metadata ids (and keys built from them) are non-negative and few, so the unique values,
    each one's first index and every entry's index among them come from a table over the
    ids' range in O(n), where `np.unique` sorts: 15 ms against 1.3 s for 3 M events. Ids
    that are negative or spread over far more values than entries take `np.unique`.
    """
    n = len(ids)
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi - lo > max(1 << 20, 4 * n):
        uniq, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        return uniq, first, inverse.reshape(-1)
    shifted = ids - lo
    first_at = np.full(hi - lo + 1, n, dtype=np.int64)
    np.minimum.at(first_at, shifted, np.arange(n, dtype=np.int64))
    present = np.flatnonzero(first_at < n)
    lut = np.empty(hi - lo + 1, dtype=np.int64)
    lut[present] = np.arange(len(present), dtype=np.int64)
    return present + lo, first_at[present], lut[shifted]
