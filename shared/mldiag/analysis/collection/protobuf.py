"""The protobuf wire format, as far as our readers of xprof's files need it.

One scalar reader for the few messages read field by field (an XSpace's planes, lines and
metadata in `xspace_scan`; HLO protos' metadata in `hlo_meta`), and the writer of a varint.
`xspace_scan` decodes the events themselves column-wise (`_varints_at`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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
