"""xprof's `aggregate_xplane_events` (the host-bound follow-up), column-wise over
`XSpaceScan`: the same arguments and output, without a record per event."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mldiag.analysis.collection.xspace.scan import Line, XSpaceScan, unique_ids


def aggregate_events(
    xplanes: Any, plane_regex: str, event_regex: str, *,
    min_duration_ps: int | None = None, max_duration_ps: int | None = None,
    start_time_ps: int | None = None, end_time_ps: int | None = None,
) -> dict[str, Any]:
    """Duration statistics per event name over matching planes: xprof's
    aggregate_xplane_events output (`aggregates` sorted by total time, each with count,
    total/avg/min/p50/p90/p99/max duration and std dev in ps), computed per distinct name."""
    scans = [XSpaceScan(path) for path in xplanes]
    try:
        return aggregate_scans(scans, plane_regex, event_regex,
                               min_duration_ps=min_duration_ps,
                               max_duration_ps=max_duration_ps,
                               start_time_ps=start_time_ps, end_time_ps=end_time_ps)
    finally:
        for scan in scans:
            scan.close()


# What `aggregate_scans` hands a line's matching events to (`on_line`): the line, their start
# and duration (ps, as xprof's times), and each one's index into the line's event names.
LineEvents = Callable[[Line, NDArray[np.int64], NDArray[np.int64], NDArray[np.int64],
                       list[str]], None]


def aggregate_scans(
    scans: Any, plane_regex: str, event_regex: str, *,
    min_duration_ps: int | None = None, max_duration_ps: int | None = None,
    start_time_ps: int | None = None, end_time_ps: int | None = None,
    on_line: LineEvents | None = None,
) -> dict[str, Any]:
    """`aggregate_events` on files already open: lines they decoded before are reused.
    `on_line` is given each line's matching events, as they are aggregated (another pass
    over them without decoding the lines again)."""
    import re

    if start_time_ps is not None and end_time_ps is not None and start_time_ps > end_time_ps:
        raise ValueError(f"start_time_ps ({start_time_ps}) must be <= end_time_ps "
                         f"({end_time_ps})")
    p_re, e_re = re.compile(plane_regex), re.compile(event_regex)
    groups: dict[str, list[NDArray[np.int64]]] = {}
    scanned = 0
    for scan in scans:
        for plane, line in scan.passing((p, ln) for p in scan.planes
                                        if p_re.search(p.name) for ln in p.lines):
            ev = line.events
            scanned += len(ev)
            if not len(ev):
                continue
            # xprof's times: start in ps from the line's ns timestamp, truncated.
            start_ps = (line.start_ns() * 1000).astype(np.int64)
            dur_ps = ((ev.duration_ps.astype(np.float64) / 1000.0) * 1000).astype(
                np.int64)
            keep = np.ones(len(ev), dtype=bool)
            if start_time_ps is not None:
                keep &= start_ps >= start_time_ps
            if end_time_ps is not None:
                keep &= start_ps + dur_ps <= end_time_ps
            if min_duration_ps is not None:
                keep &= dur_ps >= min_duration_ps
            if max_duration_ps is not None:
                keep &= dur_ps <= max_duration_ps
            mids, _, inverse = unique_ids(ev.metadata_id)
            names = [plane.event_names.get(int(m), "") for m in mids.tolist()]
            matched = np.array([bool(e_re.search(n)) for n in names], dtype=bool)
            sel = keep & matched[inverse]
            if not sel.any():
                continue
            if on_line is not None:
                on_line(line, start_ps[sel], dur_ps[sel], inverse[sel], names)
            # Group the selected durations by name with one sort, not a pass per name.
            inv, dur = inverse[sel], dur_ps[sel]
            order = np.argsort(inv, kind="stable")
            inv, dur = inv[order], dur[order]
            cuts = np.flatnonzero(np.diff(inv)) + 1
            for first, chunk in zip(np.concatenate([[0], cuts]).tolist(),
                                    np.split(dur, cuts), strict=True):
                groups.setdefault(names[int(inv[first])], []).append(chunk)
    rows: list[dict[str, Any]] = []
    for name, parts in groups.items():
        d = np.sort(np.concatenate(parts))
        n = len(d)
        total = int(d.sum())

        def q(frac: float, d: NDArray[np.int64] = d, n: int = n) -> float:
            pos = frac * (n - 1)
            lo = int(pos)
            hi = min(lo + 1, n - 1)
            return float(d[lo]) + (pos - lo) * float(d[hi] - d[lo])

        rows.append({"event": name, "count": n, "total_duration_ps": total,
                     "avg_duration_ps": total / n, "min_duration_ps": int(d[0]),
                     "p50_duration_ps": q(0.5), "p90_duration_ps": q(0.9),
                     "p99_duration_ps": q(0.99), "max_duration_ps": int(d[-1]),
                     "std_dev_ps": float(np.std(d, ddof=1)) if n > 1 else 0.0})
    rows.sort(key=lambda r: r["total_duration_ps"], reverse=True)
    return {"aggregates": rows, "returned": len(rows), "total_matched": len(rows),
            "events_scanned": scanned, "truncated": False}
