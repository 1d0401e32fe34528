"""xprof's `analyze_async_overlap`, computed column-wise from lines a scan has decoded.

The follow-up reads the whole trace again: xprof's tool decodes every plane into Python
objects and builds one `TimelineEvent` per event of the `XLA Ops`, `Sparse Core Ops` and
`Async XLA Ops` lines, 14 s of a 94 MB TPU-shaped profile after collection had finished. The
timeline pass has those lines decoded already (as NumPy columns, `scan`), so collection
computes the same answer there, per host, and the investigator's call is answered from it.

The result is xprof's own, field for field (its `async_overlap.analyze`): the same windows
(the `Async XLA Ops` line, else `<op>-start`/`<op>-done` pairs matched first in, first out),
the same coverage by the plane's non-async ops, the same classification, sort orders and
integer picoseconds. xprof's helpers classify each distinct event name (few), never each event.
Per-host partials combine into the multi-host answer as xprof's does (hosts never merged).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mldiag.analysis.collection.xspace.scan import XSpaceScan, unique_ids

I64 = NDArray[np.int64]
_LABELS = ("hidden", "partial", "exposed")


def _xprof() -> Any:
    from xprof.cli.internal import async_overlap

    return async_overlap


def _isum(a: I64) -> int:
    # Sums of picoseconds stay exact past int64 (a 2 GB capture's window total is near it).
    if not len(a):
        return 0
    if int(np.abs(a).max()) * len(a) < 2**62:
        return int(a.sum())
    return sum(a.tolist())


def _merge(lo: I64, hi: I64) -> tuple[I64, I64]:
    """xprof's `_merge`: sorted, disjoint, non-empty intervals (touching ones merge)."""
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    if not len(lo):
        return lo, hi
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(hi)
    new = np.empty(len(lo), dtype=bool)
    new[0] = True
    new[1:] = lo[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(lo) - 1)
    return lo[first], reach[last]


def _covered(m_lo: I64, m_hi: I64, lo: I64, hi: I64) -> I64:
    """xprof's `_Coverage.covered` for every window [lo, hi) at once."""
    out = np.zeros(len(lo), dtype=np.int64)
    if not len(m_lo) or not len(lo):
        return out
    prefix = np.concatenate([[0], np.cumsum(m_hi - m_lo)])
    first = np.maximum(np.searchsorted(m_lo, lo, side="right") - 1, 0)
    last = np.searchsorted(m_lo, hi, side="left") - 1
    ok = (hi > lo) & (last >= first)
    f, la = first[ok], last[ok]
    lo_, hi_ = lo[ok], hi[ok]
    total = prefix[la + 1] - prefix[f]
    total -= np.maximum(0, np.minimum(lo_, m_hi[f]) - m_lo[f])
    total -= np.maximum(0, m_hi[la] - np.maximum(hi_, m_lo[la]))
    out[ok] = np.maximum(total, 0)
    return out


class _Column:
    """The events of one (plane, line name): name index into `names`, start and end in ps."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._name_index: dict[str, int] = {}
        self.parts: list[tuple[I64, I64, I64]] = []

    def add(self, names: list[str], inverse: I64, start: I64, end: I64) -> None:
        lut = np.array([self._name_index.setdefault(n, len(self._name_index)) for n in names],
                       dtype=np.int64)
        self.names = list(self._name_index)
        self.parts.append((lut[inverse] if len(lut) else inverse, start, end))

    def columns(self) -> tuple[I64, I64, I64]:
        if len(self.parts) != 1:
            # Joined once, and the chunks' parts let go.
            idx, start, end = (np.concatenate([p[i] for p in self.parts]) for i in range(3))
            self.parts = [(idx, start, end)]
        return self.parts[0]


def _events_by_line(scan: XSpaceScan) -> Iterator[tuple[str, dict[str, _Column]]]:
    """(plane name, line name → events) for the lines xprof's analysis reads, plane by plane
    in the order of their names (empty lines and planes are absent, as in xprof's grouping).
    One plane's events are held at a time, as three columns (name, start, end); each line not
    decoded before is decoded one chunk at a time (`XSpaceScan.chunks`), so the decoder's
    own columns are a chunk's, not a long line's."""
    xp = _xprof()
    for plane in sorted(scan.planes, key=lambda p: p.name):
        out: dict[str, _Column] = {}
        # A line decoded already (by the timeline pass before this) is read as it is.
        chunks = ((plane, chunk) for ln in plane.lines if ln.name in xp.LINE_NAMES
                  for chunk in ([ln] if ln._events is not None else scan.chunks(ln)))
        for _, line in scan.passing(chunks):
            ev = line.events
            if not len(ev):
                continue
            # xprof's times: the event's start in ns (a double) times 1000, truncated.
            start = (line.start_ns() * 1000).astype(np.int64)
            dur = ((ev.duration_ps.astype(np.float64) / 1000.0) * 1000).astype(np.int64)
            mids, _, inverse = unique_ids(ev.metadata_id)
            names = [plane.event_names.get(int(m), "") for m in mids.tolist()]
            out.setdefault(line.name, _Column()).add(names, inverse, start, start + dur)
        if out:
            yield plane.name, out


def _joined(parts: list[I64]) -> I64:
    """The parts as one column (the part itself when there is one)."""
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _pairs(keys: I64, starts: NDArray[np.bool_]) -> tuple[I64, I64, int]:
    """xprof's first-in-first-out pairing of start and done ops, in sequence order.

    `keys[i]` is the async op's key and `starts[i]` whether it is its start (else its done).
    Returns (index of each paired start, index of its done) in the order the dones come, and
    how many ops stayed unpaired (dones with no open start, starts never done).
    """
    n = len(keys)
    if not n:
        z = np.zeros(0, dtype=np.int64)
        return z, z, 0
    order = np.lexsort((np.arange(n), keys))
    k, s = keys[order], starts[order]
    group_start = np.flatnonzero(np.concatenate([[True], k[1:] != k[:-1]]))
    group = np.cumsum(np.concatenate([[False], k[1:] != k[:-1]]))
    # A done finds no open start when the dones so far outnumber the starts by more than ever
    # before (a queue's failures are the running maximum of dones minus starts, floored at 0).
    step = np.where(s, -1, 1).astype(np.int64)
    run = np.cumsum(step)
    run -= np.repeat(np.concatenate([[0], run[group_start[1:] - 1]]),
                     np.diff(np.append(group_start, n)))
    big = 2 * n + 2
    failures = np.maximum(np.maximum.accumulate(run + group * big) - group * big, 0)
    prev = np.concatenate([[0], failures[:-1]])
    prev[group_start] = 0
    ok_done = ~s & (failures == prev)
    # The j-th paired done of a key takes the key's j-th start.
    rank_done = np.cumsum(ok_done) - 1
    base_done = np.concatenate([[0], np.cumsum(ok_done)[group_start[1:] - 1]])
    base_start = np.concatenate([[0], np.cumsum(s)[group_start[1:] - 1]])
    sizes = np.diff(np.append(group_start, n))
    rank_done -= np.repeat(base_done, sizes)
    # The starts in sorted order are grouped by key, each group's in sequence: the j-th start
    # of group g sits after every start of the groups before it.
    done_idx = order[ok_done]
    start_idx = order[s][base_start[group[ok_done]] + rank_done[ok_done]]
    # Back in sequence order of the dones.
    by_done = np.argsort(done_idx, kind="stable")
    paired = len(done_idx)
    unpaired = int(n - 2 * paired)
    return start_idx[by_done], done_idx[by_done], unpaired


def _bucket() -> dict[str, Any]:
    return {"count": 0, "span_ps": 0, "exposed_ps": 0, "hidden": 0, "partial": 0, "exposed": 0}


def _fill(bucket: dict[str, Any], span: I64, exposed: I64, label: I64) -> None:
    bucket["count"] += len(span)
    bucket["span_ps"] += _isum(span)
    bucket["exposed_ps"] += _isum(exposed)
    for i, name in enumerate(_LABELS):
        bucket[name] += int(np.count_nonzero(label == i))


def host_partial(scan: XSpaceScan, top_k: int, hidden_threshold: float | None = None,
                 exposed_threshold: float | None = None) -> dict[str, Any]:
    """One host's share of the analysis (JSON-able): its buckets, its `top_k` most exposed
    windows and its chips' concurrency; `combine` makes the tool's answer from these."""
    xp = _xprof()
    hidden_t = xp.DEFAULT_HIDDEN_THRESHOLD if hidden_threshold is None else hidden_threshold
    exposed_t = (xp.DEFAULT_EXPOSED_THRESHOLD if exposed_threshold is None
                 else exposed_threshold)
    summary = _bucket()
    summary["unpaired_ops"] = 0
    by_op: dict[str, dict[str, Any]] = {}
    by_plane: dict[str, dict[str, Any]] = {}
    busy: dict[tuple[str, str], tuple[I64, I64]] = {}
    rows: list[tuple[I64, ...]] = []
    row_meta: list[tuple[str, list[str], list[str]]] = []
    events = False
    # Busy time is kept only for the chips with two engines or more (the concurrency's).
    engines: dict[int, int] = {}
    for p in scan.planes:
        match = xp._TPU_PLANE_RE.match(p.name)
        if match:
            engines[int(match["chip"])] = engines.get(int(match["chip"]), 0) + sum(
                ln.name in xp.OPS_LINES and ln.has_events() for ln in p.lines)
    for rank, (plane, lines) in enumerate(_events_by_line(scan)):
        events = True
        op_cols = [(ln, lines[ln].columns(), lines[ln].names) for ln in sorted(xp.OPS_LINES)
                   if ln in lines]
        match = xp._TPU_PLANE_RE.match(plane)
        if match and engines.get(int(match["chip"]), 0) >= 2:
            for ln, (_, lo, hi), _ in op_cols:
                busy[(plane, ln)] = _merge(lo, hi)
        # The plane's op events, as one sequence (xprof's order: line by sorted name).
        names: list[str] = []
        idx_parts, lo_parts, hi_parts = [], [], []
        for _, (idx, lo, hi), line_names in op_cols:
            idx_parts.append(idx + len(names))
            names += line_names
            lo_parts.append(lo)
            hi_parts.append(hi)
        empty = np.zeros(0, dtype=np.int64)
        op_idx, op_lo, op_hi = _joined(idx_parts), _joined(lo_parts), _joined(hi_parts)
        inst = [xp.instruction_name(n) for n in names]
        roles = [xp.async_role(i) for i in inst]
        is_async = np.array([r is not None for r in roles], dtype=bool)
        compute = ~is_async[op_idx] if len(names) else np.zeros(0, dtype=bool)
        m_lo, m_hi = _merge(op_lo[compute], op_hi[compute])
        if xp.ASYNC_OPS_LINE in lines:
            col = lines[xp.ASYNC_OPS_LINE]
            w_idx, w_lo, w_hi = col.columns()
            w_names = [xp.instruction_name(n) for n in col.names]
            source = xp.ASYNC_OPS_LINE
        else:
            # Start and done ops in time order (a stable sort, as xprof's).
            sel = np.flatnonzero(is_async[op_idx]) if len(names) else empty
            order = sel[np.argsort(op_lo[sel], kind="stable")]
            key_names = {r[0] for r in roles if r is not None}
            key_index = {k: i for i, k in enumerate(sorted(key_names))}
            key_of = np.array([key_index[r[0]] if r else -1 for r in roles], dtype=np.int64)
            start_of = np.array([bool(r and r[1] == "start") for r in roles], dtype=bool)
            seq = op_idx[order]
            s_i, d_i, unpaired = _pairs(key_of[seq], start_of[seq]) if len(seq) else (
                empty, empty, 0)
            summary["unpaired_ops"] += unpaired
            w_idx = seq[s_i]
            w_lo, w_hi = op_lo[order][s_i], op_hi[order][d_i]
            w_names = inst
            source = "start_done_pairs"
        if not len(w_lo):
            continue
        span = w_hi - w_lo
        ok = span > 0
        w_idx, w_lo, span = w_idx[ok], w_lo[ok], span[ok]
        covered = _covered(m_lo, m_hi, w_lo, w_lo + span)
        exposed = span - covered
        ratio = covered / span if len(span) else np.zeros(0)
        label = np.where(ratio >= hidden_t, 0, np.where(ratio <= exposed_t, 2, 1))
        families = [xp.op_family(n) for n in w_names]
        fam_names = sorted(set(families))
        fam = np.array([fam_names.index(f) for f in families], dtype=np.int64)[w_idx] if len(
            families) else w_idx
        plane_bucket = _bucket()
        plane_bucket["window_source"] = source
        _fill(plane_bucket, span, exposed, label)
        _fill(summary, span, exposed, label)
        for i, f in enumerate(fam_names):
            sel_f = fam == i
            if sel_f.any():
                _fill(by_op.setdefault(f, _bucket()), span[sel_f], exposed[sel_f], label[sel_f])
        by_plane[plane] = plane_bucket
        # The plane's own most exposed windows only: the host's are among them (the same
        # order within a plane), and the rest would be held to the end for nothing.
        keep = np.lexsort((np.arange(len(w_lo)), w_lo, -exposed))[:max(top_k, 0)]
        rows.append((np.full(len(keep), rank), w_lo[keep], span[keep], exposed[keep],
                     covered[keep], label[keep], w_idx[keep], np.full(len(keep), len(row_meta))))
        row_meta.append((plane, w_names, families))
        # Let the plane's columns go before the next plane is decoded.
        del lines, op_cols, op_idx, op_lo, op_hi, m_lo, m_hi, w_idx, w_lo, w_hi, span, covered
    return {"events": events, "summary": summary, "by_op": by_op, "by_plane": by_plane,
            "top_exposed": _top_rows(rows, row_meta, top_k), "concurrency": _concurrency(busy),
            "thresholds": {"hidden": hidden_t, "exposed": exposed_t}}


def _top_rows(rows: list[tuple[I64, ...]], meta: list[tuple[str, list[str], list[str]]],
              top_k: int) -> list[dict[str, Any]]:
    if top_k <= 0 or not rows:
        return []
    rank, lo, span, exposed, covered, label, idx, seg = (
        np.concatenate([r[i] for r in rows]) for i in range(8))
    # xprof sorts by (-exposed, host, plane, start), stably: ties keep the windows' order.
    order = np.lexsort((np.arange(len(lo)), lo, rank, -exposed))[:top_k]
    out = []
    for i in order.tolist():
        plane, names, families = meta[int(seg[i])]
        row: dict[str, Any] = {
            "plane": plane, "name": names[int(idx[i])], "op": families[int(idx[i])],
            "start_ps": int(lo[i]), "span_ps": int(span[i]), "exposed_ps": int(exposed[i]),
            "overlap_ratio": int(covered[i]) / int(span[i]), "class": _LABELS[int(label[i])]}
        out.append(row)
    return out


def _concurrency(busy: Mapping[tuple[str, str], tuple[I64, I64]]) -> list[dict[str, Any]]:
    """xprof's `_engine_concurrency` for one host: per TPU chip with two busy engines or more,
    each pair's concurrent busy time (|A ∩ B| = |A| + |B| - |A ∪ B|, exact in integers)."""
    xp = _xprof()
    chips: dict[int, list[tuple[str, str]]] = {}
    for plane, line in busy:
        match = xp._TPU_PLANE_RE.match(plane)
        if match:
            chips.setdefault(int(match["chip"]), []).append((plane, line))
    result = []
    for chip in sorted(chips):
        engines = sorted(chips[chip])
        if len(engines) < 2:
            continue
        totals = {e: _isum(busy[e][1] - busy[e][0]) for e in engines}
        pairs: list[dict[str, Any]] = []
        for i, a in enumerate(engines):
            for b in engines[i + 1:]:
                u_lo, u_hi = _merge(np.concatenate([busy[a][0], busy[b][0]]),
                                    np.concatenate([busy[a][1], busy[b][1]]))
                concurrent = totals[a] + totals[b] - _isum(u_hi - u_lo)
                shorter = min(totals[a], totals[b])
                pairs.append({"a": {"plane": a[0], "line": a[1]},
                              "b": {"plane": b[0], "line": b[1]},
                              "concurrent_ps": concurrent,
                              "concurrent_ratio": concurrent / shorter if shorter else 0.0})
        pairs.sort(key=lambda p: p["concurrent_ps"], reverse=True)
        entry: dict[str, Any] = {
            "chip": chip,
            "engines": [{"plane": p, "line": ln, "busy_ps": totals[(p, ln)]}
                        for p, ln in engines],
            "pairs": pairs}
        result.append(entry)
    return result


def combine(partials: Sequence[tuple[str, Mapping[str, Any]]], top_k: int) -> dict[str, Any]:
    """The tool's answer (xprof's `summary`, `by_op`, `by_plane`, `top_exposed`,
    `concurrency`, `thresholds`, `status`) from every host's label and `host_partial`. Labels
    are xprof's for trace files (`trace_labels`: empty for a single file, else file stems)."""
    parts = sorted(partials, key=lambda p: p[0])
    summary = _bucket()
    summary["unpaired_ops"] = 0
    by_op: dict[str, dict[str, Any]] = {}
    by_plane: dict[str, Any] = {}
    multi_host = len({label for label, p in parts if p["events"]}) > 1
    rows: list[dict[str, Any]] = []
    concurrency: list[dict[str, Any]] = []
    for label, p in parts:
        tag = {"host": label} if label else {}
        for k, v in p["summary"].items():
            summary[k] += v
        for fam, b in p["by_op"].items():
            acc = by_op.setdefault(fam, _bucket())
            for k, v in b.items():
                acc[k] += v
        for plane, b in p["by_plane"].items():
            if multi_host:
                by_plane[f"{label}:{plane}"] = {**b, "host": label}
            else:
                by_plane[plane] = dict(b)
        rows.extend({**r, **tag} for r in p["top_exposed"])
        concurrency.extend({**c, **tag} for c in p["concurrency"])
    rows.sort(key=lambda r: (-r["exposed_ps"], r.get("host", ""), r["plane"], r["start_ps"]))
    summary["overlap_ratio"] = (1.0 - summary["exposed_ps"] / summary["span_ps"]
                                if summary["span_ps"] else None)
    out: dict[str, Any] = {
        "summary": summary,
        "by_op": dict(sorted(by_op.items(), key=lambda kv: (-kv[1]["exposed_ps"], kv[0]))),
        "by_plane": by_plane,
        "top_exposed": rows[: max(top_k, 0)],
        "concurrency": concurrency,
        "thresholds": dict(parts[0][1]["thresholds"]) if parts else {},
        "status": "OK",
    }
    if not any(p["events"] for _, p in parts):
        out["status"] = "NO_DEVICE_TIMELINE_EVENTS"
        out["reason"] = ("No XLA Ops, Async XLA Ops, or Sparse Core Ops timeline events were"
                         " found in the capture.")
    return out


def has_async_lines(scan: XSpaceScan) -> bool:
    """Whether any plane has a line the analysis reads (device XLA op lines): without one,
    xprof answers NO_DEVICE_TIMELINE_EVENTS, and nothing is worth precomputing."""
    names = _xprof().LINE_NAMES
    return any(line.name in names for plane in scan.planes for line in plane.lines)


def analyze_scans(scans: Iterable[tuple[str, XSpaceScan]], top_k: int) -> dict[str, Any]:
    """The whole answer from open scans and their hosts' labels (see `combine`)."""
    return combine([(label, host_partial(scan, top_k)) for label, scan in scans], top_k)
