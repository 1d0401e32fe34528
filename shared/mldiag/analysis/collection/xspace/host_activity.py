"""The total time of xprof's host op-metrics database, read from the host lines as the cut
into time windows decodes them, so that windows of one host combine into its exact figure.

xprof (`ConvertHostThreadsXPlaneToOpMetricsDb`) builds the host database line by line on
the `/host:CPU` plane. Each line's database counts from the line's first TF activity to its
last, and the lines add up; the host `IDLE` op is that total less the ops' time. Windows each
count their own span on each line, so their sum leaves out the time between one window's
last activity and the next one's first: the same line's span, read once over every window,
is the host's. Which events are activities is xprof's choice (facts carried over from its
`CollectTfOpsFromHostThreadsXPlane`, `CollectTfActivities` and tsl's `ParseTfOpFullname`):

- lines whose id is a derived thread's (`IsDerivedThreadId`, an `int` compare) are skipped;
- an event is an activity when it has a non-empty `tf_op` stat (a string or a reference), or
  when its id is among the plane's TF ops: its input-pipeline stage id (`_ipl_stage_id`) if
  it has one, else its metadata id;
- the plane's TF ops, from every line and every named event: the stage id of an event that
  has one and a stage category (`_ipl_stage_cat`; an event with a stage id and no
  category adds nothing), else the metadata id of an event whose name `ParseTfOpFullname`
  gives a category (`tf_op_category_known`);
- a stat is the event's own (one on its metadata is not read: measured against xprof's
  converter); a stage id is an `int64` value (xprof's `IntValue`), anything else reads 0.

The rest of the host database adds up window by window as long as no activity spans a cut
(an activity's self time subtracts the activities nested in it, on its line, which a cut
would put in the next window), and no infeed enqueue is among them (xprof adds the gaps
between consecutive enqueues). `HostActivity.inexact` says when either happened.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mldiag.analysis.collection.xspace.events import signed
from mldiag.analysis.collection.xspace.protobuf import MAX_VARINT, encode_varint, read_varint
from mldiag.analysis.collection.xspace.scan import Events, Line, Plane, XSpaceScan

HOST_THREADS_PLANE = "/host:CPU"
# The stats' names as xprof 2.24.2's stat types read them (`kTfOp`,
# `kInputPipelineStageId`, `kInputPipelineStageCategory`: the names in its binary).
TF_OP, STAGE_ID, STAGE_CATEGORY = "tf_op", "_ipl_stage_id", "_ipl_stage_cat"
# tsl's derived thread ids, compared as a C++ `int`: from (int)0xdeadbeef up to its host XLA
# regions' end (0xdeadbeef + 49 + 240).
_DERIVED_MIN = 0xDEADBEEF - 2**32
_DERIVED_MAX = _DERIVED_MIN + 289
# tsl's name and type patterns (`IsTfOpName`, `IsTfOpType`, `IsJaxOpType`).
_TF_NAME = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_./>-]*")
_TF_TYPE = re.compile(r"[A-Z_][a-zA-Z0-9_]*")
_JAX_TYPE = re.compile(r"[a-z_][a-z0-9_]*(\[.*\])?")
_MEMCPY = ("memcpyhtod", "memcpydtoh", "memcpydtod", "memcpyhtoh")
_STR, _INT64, _REF = 0x2A, 0x20, 0x38  # an XStat's value fields, as tags

I64 = NDArray[np.int64]


def derived_thread(line_id: int) -> bool:
    """tsl's `IsDerivedThreadId` on a line id, truncated to a C++ `int` as xprof passes it."""
    as_int = (line_id + 2**31) % 2**32 - 2**31
    return _DERIVED_MIN <= as_int <= _DERIVED_MAX


def tf_op_category_known(name: str) -> bool:
    """Whether tsl's `ParseTfOpFullname(name)` gives a category (not `kUnknown`)."""
    head, colon, kind = name.partition(":")
    if not colon:
        return name.lower().startswith(_MEMCPY)
    if head == "Iterator" or not kind:  # a dataset op; an empty type is TF's or JAX's
        return True
    return bool((_TF_NAME.fullmatch(head) and _TF_TYPE.fullmatch(kind))
                or _JAX_TYPE.fullmatch(kind))


class HostActivity:
    """Every host line's activities, gathered line by line (`add`, as `write_windows`'s
    `each_line`), for `total_time_ps` once all are seen. `cuts` (ps) are the windows'."""

    def __init__(self, scan: XSpaceScan, cuts: Sequence[int] = ()) -> None:
        self._scan = scan
        self._cuts = np.asarray(cuts, dtype=np.int64)
        # Per line (by `Line.key`): per id, the first begin and last end of its events; and
        # those of events with a `tf_op` stat (activities whatever their id).
        self._ids: dict[tuple[int, int], list[tuple[I64, I64, I64]]] = {}
        self._tf_op: dict[tuple[int, int], tuple[int, int]] = {}
        self._known: set[int] = set()  # the plane's TF ops (metadata and stage ids)
        self._seen: set[int] = set()  # metadata ids whose names were parsed
        self._plane: Plane | None = None
        self._sids: dict[str, list[int]] = {}
        # Events that span a cut, per chunk: (line, ids, begins, ends, has a `tf_op` stat);
        # which are activities is known once the plane's TF ops are.
        self._spanning: list[tuple[tuple[int, int], I64, I64, I64, NDArray[np.bool_]]] = []
        self.infeed = False

    def add(self, plane: Plane, line: Line) -> None:
        if plane.name != HOST_THREADS_PLANE:
            return
        if self._plane is not plane:
            self._plane = plane
            self._sids = {n: [k for k, v in plane.stat_names.items() if v == n]
                          for n in (TF_OP, STAGE_ID, STAGE_CATEGORY)}
        ev = line.events
        if not len(ev):
            return
        tf_op, stage, category = self._stats(plane, ev)
        named = self._named(plane, ev.metadata_id)
        # The plane's TF ops, from every line (derived ones too).
        with_stage = stage != _NONE
        self._known.update(stage[with_stage & category & named].tolist())
        for mid in np.unique(ev.metadata_id[~with_stage & named]).tolist():
            if mid in self._seen:
                continue
            self._seen.add(mid)
            name = plane.event_names.get(mid, "")
            if tf_op_category_known(name):
                self._known.add(mid)
                self.infeed |= "InfeedEnqueue" in name
        if derived_thread(line.id):
            return
        begin = line.timestamp_ns * 1000 + ev.offset_ps
        end = begin + ev.duration_ps
        lo, hi = np.minimum(begin, end), np.maximum(begin, end)
        ids = np.where(with_stage, stage, ev.metadata_id)
        order = np.argsort(ids, kind="stable")
        uniq, first = np.unique(ids[order], return_index=True)
        self._ids.setdefault(line.key, []).append(
            (uniq, np.minimum.reduceat(lo[order], first), np.maximum.reduceat(hi[order], first)))
        if tf_op.any():
            was = self._tf_op.get(line.key)
            span = (int(lo[tf_op].min()), int(hi[tf_op].max()))
            self._tf_op[line.key] = span if was is None else (min(was[0], span[0]),
                                                              max(was[1], span[1]))
        if len(self._cuts):
            at = np.searchsorted(self._cuts, begin, side="right")
            spans = np.searchsorted(self._cuts, end, side="left") > at
            if spans.any():
                self._spanning.append((line.key, ids[spans], lo[spans], hi[spans],
                                       tf_op[spans]))

    def total_time_ps(self) -> int:
        """The host database's `total_time_ps` as xprof computes it over the whole trace:
        each line's span from its first activity to its last, added up."""
        keys = np.fromiter(self._known, dtype=np.int64, count=len(self._known))
        total = 0
        for line, parts in self._ids.items():
            firsts, lasts = [], []
            for ids, lo, hi in parts:
                hit = np.isin(ids, keys)
                if hit.any():
                    firsts.append(int(lo[hit].min()))
                    lasts.append(int(hi[hit].max()))
            if line in self._tf_op:
                firsts.append(self._tf_op[line][0])
                lasts.append(self._tf_op[line][1])
            if firsts:
                total += max(lasts) - min(firsts)
        return total

    def inexact(self) -> str:
        """Why the windows' host databases would not add up to the host's ('' when they do)."""
        keys = np.fromiter(self._known, dtype=np.int64, count=len(self._known))
        spanning = sum(int((np.isin(ids, keys) | tf_op).sum())
                       for _, ids, _, _, tf_op in self._spanning)
        if spanning:
            return f"{spanning} host activities span a cut between windows"
        if self.infeed:
            return "the host enqueues infeed (xprof adds the gaps between enqueues)"
        return ""

    # -- stats -----------------------------------------------------------------------------

    def _named(self, plane: Plane, mids: I64) -> NDArray[np.bool_]:
        uniq, inverse = np.unique(mids, return_inverse=True)
        return np.array([bool(plane.event_names.get(m)) for m in uniq.tolist()],
                        dtype=bool)[inverse]

    def _stats(self, plane: Plane, ev: Events
               ) -> tuple[NDArray[np.bool_], I64, NDArray[np.bool_]]:
        """Per event: a non-empty `tf_op` stat; its stage id (`_NONE` without one); whether
        it has a stage category. The event's own stats only, as xprof reads them."""
        n = len(ev)
        tf_op = np.zeros(n, dtype=bool)
        stage = np.full(n, _NONE, dtype=np.int64)
        category = np.zeros(n, dtype=bool)
        sids = self._sids
        if not any(sids.values()):
            return tf_op, stage, category
        idx = _events_with(self._scan.buf, ev, [s for v in sids.values() for s in v])
        if len(idx):
            sub = ev.take(idx)
            rows = [*sids[TF_OP], *sids[STAGE_ID], *sids[STAGE_CATEGORY]]
            at = self._scan.stat_at(sub, rows, first=True)
            buf = self._scan.buf
            r = 0
            for kind, col in ((TF_OP, 0), (STAGE_ID, 1), (STAGE_CATEGORY, 2)):
                for _ in sids[kind]:
                    where = at[r]
                    r += 1
                    has = where != -1
                    for i, pos in zip(idx[has].tolist(), where[has].tolist(), strict=True):
                        if col == 0:
                            tf_op[i] = self._str_or_ref(buf, pos, plane)
                        elif col == 1:
                            stage[i] = _int64_at(buf, pos)
                    if col == 2:
                        category[idx[has]] = True
        return tf_op, stage, category

    @staticmethod
    def _str_or_ref(buf: Any, pos: int, plane: Plane) -> bool:
        if pos < 0:  # a stat without a value: empty
            return False
        tag = int(buf[pos])
        if tag == _STR:
            return int(buf[pos + 1]) > 0  # a length varint is 0 only as one byte
        if tag == _REF:
            return bool(plane.stat_names.get(_varint_after(buf, pos)))
        return False


_NONE = np.iinfo(np.int64).min  # no stage id


def _varint_after(buf: NDArray[np.uint8], tag_at: int) -> int:
    """The varint after the tag at `tag_at` (read from bytes: NumPy's uint8 would overflow)."""
    head = bytes(buf[tag_at + 1:tag_at + 1 + MAX_VARINT])
    return read_varint(head, 0, len(head))[0]


def _int64_at(buf: Any, pos: int) -> int:
    if pos < 0 or int(buf[pos]) != _INT64:
        return 0
    return signed(_varint_after(buf, pos))


def _events_with(buf: NDArray[np.uint8], ev: Events, sids: Sequence[int]) -> I64:
    """The events whose stats' bytes hold a stat metadata id of `sids` (`08 <varint>`): the
    few a stat lookup need read (a superset; the lookup decides)."""
    lo, hi = int(ev.stats_start.min()), int(ev.body_end.max())
    if hi <= lo:
        return np.zeros(0, dtype=np.int64)
    seg = buf[lo:hi]
    hits = []
    for sid in sids:
        pattern = b"\x08" + encode_varint(sid)
        cand = np.flatnonzero(seg[:len(seg) - len(pattern) + 1] == pattern[0])
        for k, byte in enumerate(pattern[1:], start=1):
            cand = cand[seg[cand + k] == byte]
        hits.append(cand + lo)
    pos = np.sort(np.concatenate(hits)) if hits else np.zeros(0, dtype=np.int64)
    inside = np.searchsorted(pos, ev.body_end) > np.searchsorted(pos, ev.stats_start)
    return np.flatnonzero(inside)
