"""Where each HLO instruction came from: `op_name`, `source_file` and `source_line` from the
OpMetadata of xprof's `<module>.hlo_proto.pb` files (the HLO text xprof prints omits them).

A minimal protobuf reader, for the few fields read here (xla/service/hlo.proto):
HloProto.hlo_module = 1; HloModuleProto.computations = 3; HloComputationProto.instructions = 2;
HloInstructionProto.name = 1, metadata = 7; OpMetadata.op_name = 2, source_file = 3,
source_line = 4.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) of one message; unknown wire types end it."""
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            yield field, wire, value
        elif wire == 2:
            size, i = _varint(buf, i)
            yield field, wire, buf[i:i + size]
            i += size
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            return


def _sub(buf: bytes, number: int) -> Iterator[bytes]:
    for field, wire, value in _fields(buf):
        if field == number and wire == 2 and isinstance(value, bytes):
            yield value


def sources(hlo_proto: bytes) -> dict[str, str]:
    """instruction name -> `file.py:LINE (op_name)` (or whichever part is known)."""
    out: dict[str, str] = {}
    for module in _sub(hlo_proto, 1):
        for computation in _sub(module, 3):
            for instruction in _sub(computation, 2):
                name, meta = "", b""
                for field, wire, value in _fields(instruction):
                    if field == 1 and wire == 2 and isinstance(value, bytes):
                        name = value.decode(errors="replace")
                    elif field == 7 and wire == 2 and isinstance(value, bytes):
                        meta = value
                if not name or not meta:
                    continue
                op_name = source_file = ""
                line = 0
                for field, _wire, value in _fields(meta):
                    if field == 2 and isinstance(value, bytes):
                        op_name = value.decode(errors="replace")
                    elif field == 3 and isinstance(value, bytes):
                        source_file = value.decode(errors="replace")
                    elif field == 4 and isinstance(value, int):
                        line = value
                where = os.path.basename(source_file) + (f":{line}" if line else "")
                text = (f"{where} ({op_name})" if where and op_name else where or op_name)
                if text:
                    out[name] = text
    return out


def module_sources(run_dir: Path) -> dict[str, dict[str, str]]:
    """{module name: {instruction: source}} for every `.hlo_proto.pb` in an xprof run dir;
    a file that does not parse is skipped."""
    out: dict[str, dict[str, str]] = {}
    for path in sorted(run_dir.glob("*.hlo_proto.pb")):
        try:
            found = sources(path.read_bytes())
        except (OSError, ValueError, IndexError):
            continue
        if found:
            out[path.name[: -len(".hlo_proto.pb")]] = found
    return out
