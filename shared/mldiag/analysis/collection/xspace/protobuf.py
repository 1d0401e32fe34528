"""The protobuf wire format, as far as our readers of xprof's files need it.

One scalar reader for the few messages read field by field (an XSpace's planes, lines and
metadata in `scan`; HLO protos' metadata in `hlo.meta`), and the writer of a varint.
`scan` decodes the events themselves column-wise: the varints at many positions at
once (`varints_at`, `optional_varints`), as NumPy columns.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mldiag.errors import ProfileUnreadable


class CorruptProtobuf(ProfileUnreadable):
    """The bytes do not decode as the protobuf they should be: permanent (the file is bad,
    reading it again gives the same)."""


def read_varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """The varint at buf[pos] (before `end`), and the position after it."""
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise CorruptProtobuf("truncated or corrupt protobuf (bad varint)")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def fields(buf: Any, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value or start, end) of each field in buf[pos:end].

    For length-delimited fields the value is the payload's start and `end` its end; for
    varints the value is the number; fixed-width fields give their start.
    """
    while pos < end:
        key, pos = read_varint(buf, pos, end)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise CorruptProtobuf("truncated or corrupt protobuf (field number 0)")
        if wt == 0:
            value, pos = read_varint(buf, pos, end)
            yield num, wt, value, pos
        elif wt == 2:
            length, pos = read_varint(buf, pos, end)
            if pos + length > end:
                raise CorruptProtobuf("truncated or corrupt protobuf (field runs past its parent)")
            yield num, wt, pos, pos + length
            pos += length
        elif wt == 1:
            if pos + 8 > end:
                raise CorruptProtobuf("truncated or corrupt protobuf (fixed64 past the end)")
            yield num, wt, pos, pos + 8
            pos += 8
        elif wt == 5:
            if pos + 4 > end:
                raise CorruptProtobuf("truncated or corrupt protobuf (fixed32 past the end)")
            yield num, wt, pos, pos + 4
            pos += 4
        else:
            raise CorruptProtobuf(f"truncated or corrupt protobuf (wire type {wt})")


def encode_varint(value: int) -> bytes:
    """`value` (unsigned) as a varint."""
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


# -- columns: the varints at many positions at once (NumPy) ----------------------------------

MAX_VARINT = 10
I64 = NDArray[np.int64]


def varints_at(buf: NDArray[np.uint8], pos: I64) -> tuple[I64, I64]:
    """Decode the varint at each position; returns (values, positions after them).

    A varint that runs past the buffer (or is longer than 10 bytes) decodes as -1. Most
    varints here (lengths, ids) fit one byte: only the others take the loop. (Reading 8 bytes
    per position as one word and decoding with bit operations was tried: slower here.)
    """
    n = len(buf)
    inside = (pos >= 0) & (pos < n)
    first = buf[np.where(inside, pos, 0)].astype(np.int64)
    value = np.where(inside, first & 0x7F, -1)
    cur = pos + 1
    idx = np.flatnonzero(inside & (first >= 0x80))
    shift = 7
    while len(idx) and shift < 7 * MAX_VARINT:
        past = cur[idx] >= n
        if past.any():
            value[idx[past]] = -1
            idx = idx[~past]
        b = buf[cur[idx]].astype(np.int64)
        value[idx] |= (b & 0x7F) << shift
        cur[idx] += 1
        idx = idx[b >= 0x80]
        shift += 7
    if len(idx):
        value[idx] = -1  # more than 10 bytes: not a varint
    return value, cur


def optional_varints(buf: NDArray[np.uint8], pos: I64, end: I64, tag: int,
                     missing: int = 0) -> I64:
    """Decode a varint field with key byte `tag` where present at `pos` (in place: `pos` moves
    past the fields decoded). Absent fields read as `missing` (proto3 default 0)."""
    out = np.full(len(pos), missing, dtype=np.int64)
    inside = pos < end
    safe = np.minimum(pos, len(buf) - 1)
    has = np.flatnonzero(inside & (buf[safe] == tag))
    if len(has):
        v, after = varints_at(buf, pos[has] + 1)
        out[has] = v
        pos[has] = after
    return out
