"""Copies of an XSpace with a part of its events: the writing half of `scan`.

Each copy is written in one pass over the mapped file, one line (or one chunk of a long line,
`XSpaceScan.chunks`) decoded at a time: the events a copy keeps are found column-wise and
written as runs of bytes straight from the map; planes, lines, metadata tables and every
other field are copied byte for byte. The map's pages are let go as they are written, so a
pass over a 2 GB host holds about a chunk's columns and pages (0.24-0.29 GB for the cut of a
468 MB and a 1.9 GB TPU-shaped host into time windows).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mldiag.analysis.collection.xspace import scan as xspace_scan
from mldiag.analysis.collection.xspace.protobuf import encode_varint
from mldiag.analysis.collection.xspace.scan import I64, Line, Plane, XSpaceScan

KeepFn = Any  # Callable[[Plane, Line], NDArray[np.bool_] | None]
SplitFn = Any  # Callable[[Plane, Line], NDArray[np.integer] | None]


def write_filtered(scan: XSpaceScan, out: str | os.PathLike[str], keep: KeepFn,
                   planes: Callable[[Plane], bool] | None = None) -> tuple[int, int]:
    """Write a copy of `scan`'s XSpace without the events that `keep` rejects.

    `keep(plane, line)` returns a boolean mask over the line's events, or None to keep the
    line whole. Everything else (metadata, stats, other fields) is copied byte for byte.
    With `planes`, only the planes for which it is true are written.
    Returns (events kept, events dropped) on the lines that `keep` masked.
    """
    def split(plane: Plane, line: Line) -> Any:
        mask = keep(plane, line)
        return None if mask is None else np.where(mask, 0, -1).astype(np.int32)

    (kept,), dropped = write_split(scan, [out], split, planes)
    return kept, dropped


def write_planes(scan: XSpaceScan, out: str | os.PathLike[str], keep: Any) -> int:
    """Write a copy of `scan`'s XSpace with only the planes for which `keep(plane)` is true,
    each byte for byte (the space's other fields too). Returns the planes written."""
    view = memoryview(scan._map)
    written = 0
    try:
        with open(out, "wb") as f:
            for plane in scan.planes:
                if not keep(plane) or not plane._fields:
                    continue
                start, end = plane._fields[0][1], plane._fields[-1][2]
                f.write(b"\x0a" + encode_varint(end - start))
                f.write(view[start:end])
                written += 1
            for start, stop in scan._space_fields:
                f.write(view[start:stop])
    finally:
        view.release()
    return written


def write_split(scan: XSpaceScan, outs: Sequence[str | os.PathLike[str]], split: SplitFn,
                planes: Callable[[Plane], bool] | None = None) -> tuple[list[int], int]:
    """Write len(`outs`) copies of `scan`'s XSpace in one pass, each with a part of the events.

    `split(plane, line)` returns, per event of the line, the index of the copy it goes to
    (-1: none), or None to copy the line whole into every copy. Every copy keeps every
    plane, line and metadata table, and everything else byte for byte.

    Memory stays bounded by one line: each line's events are decoded, cut into runs of
    bytes per copy and let go (unless a caller had decoded them before), and the copies are
    written plane by plane straight from the mapped file.
    With `planes`, only the planes for which it is true are written.
    Returns (events per copy, events in no copy) on the lines that `split` cut.
    """
    counts = [0] * len(outs)
    dropped = 0
    view = memoryview(scan._map)
    files = [open(o, "wb") for o in outs]  # noqa: SIM115 - closed below
    try:
        for plane in scan.planes:
            if planes is not None and not planes(plane):
                continue
            # Per copy: pieces of the plane's body, each bytes or a (start, end) range of
            # the file, or a pair of arrays of ranges.
            pieces: list[list[Any]] = [[] for _ in outs]
            sizes = [0] * len(outs)
            lines = {ln._payload[1]: ln for ln in plane.lines}
            for num, key_at, stop in plane._fields:
                line = lines.get(stop) if num == 3 else None
                cut = None if line is None else _cut_line(scan, plane, line, split, len(outs))
                if cut is None:
                    for k in range(len(outs)):
                        pieces[k].append((key_at, stop))
                        sizes[k] += stop - key_at
                    continue
                assert line is not None
                runs, in_copy, out_of_all, last_end = cut
                pos, end = line._payload
                events_at = line._blocks[0][0]
                dropped += out_of_all
                for k, (starts, ends) in enumerate(runs):
                    length = (events_at - pos) + int((ends - starts).sum()) + (end - last_end)
                    prefix = b"\x1a" + encode_varint(length)
                    pieces[k] += [prefix, (pos, events_at), (starts, ends), (last_end, end)]
                    sizes[k] += len(prefix) + length
                    counts[k] += in_copy[k]
            # The plane's pages, read once to cut it, are read again to write it: each
            # range is let go once written (a host plane is most of a host's file).
            for f, body, size in zip(files, pieces, sizes, strict=True):
                f.write(b"\x0a" + encode_varint(size))
                for piece in body:
                    if isinstance(piece, bytes):
                        f.write(piece)
                    elif isinstance(piece[0], np.ndarray):
                        for a, b in zip(piece[0].tolist(), piece[1].tolist(), strict=True):
                            f.write(view[a:b])
                        if len(piece[0]):
                            scan.release_pages(int(piece[0][0]), int(piece[1][-1]))
                    else:
                        f.write(view[piece[0]:piece[1]])
                        scan.release_pages(piece[0], piece[1])
        for f in files:
            for start, stop in scan._space_fields:
                f.write(view[start:stop])
    finally:
        view.release()
        for f in files:
            f.close()
    return counts, dropped


def _cut_line(scan: XSpaceScan, plane: Plane, line: Line, split: SplitFn, copies: int
              ) -> tuple[list[tuple[I64, I64]], list[int], int, int] | None:
    """`split` applied to one line: per copy, the byte ranges of its runs of events, and
    the events in each copy, those in none and where the last event ends; None when
    `split` keeps the line whole.

    A long line (over `xspace_scan._CHAIN_BYTES`) not decoded before is split chunk by chunk
    (`XSpaceScan.chunks`), so the columns of one chunk are held at a time: `split` sees each chunk
    as a line. None for the first chunk, before it decoded any event, keeps the line
    whole; None for a later chunk puts that chunk into every copy."""
    was_decoded = line._events is not None
    whole = was_decoded or line._payload[1] - line._payload[0] <= xspace_scan._CHAIN_BYTES
    starts: list[list[I64]] = [[] for _ in range(copies)]
    ends: list[list[I64]] = [[] for _ in range(copies)]
    in_copy = [0] * copies
    out_of_all = 0
    last_end = line._blocks[0][0]
    try:
        for i, chunk in enumerate([line] if whole else scan.chunks(line)):
            part = split(plane, chunk)
            if part is None and i == 0 and (whole or chunk._events is None):
                return None
            ev = chunk.events
            if len(ev):
                last_end = int(ev.body_end[-1])
            if part is not None:
                out_of_all += int((part < 0).sum())
            for k in range(copies):
                mask = np.ones(len(ev), dtype=bool) if part is None else part == k
                edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
                starts[k].append(ev.tag_at[np.flatnonzero(edges == 1)])
                ends[k].append(ev.body_end[np.flatnonzero(edges == -1) - 1])
                in_copy[k] += int(mask.sum())
            if chunk is not line:
                # Let the chunk's columns and pages go before the next is decoded.
                del ev, part
                chunk._events = None
                scan.release_pages(*chunk._blocks[0])
    finally:
        if not was_decoded:
            line._events = None
            scan.release_pages(*line._payload)
    return ([(np.concatenate(s), np.concatenate(e)) for s, e in zip(starts, ends,
                                                                     strict=True)],
            in_copy, out_of_all, last_end)
