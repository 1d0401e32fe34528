"""Where each HLO instruction came from: `op_name`, `source_file` and `source_line` from the
OpMetadata of xprof's `<module>.hlo_proto.pb` files (the HLO text xprof prints omits them).

The few fields read here (xla/service/hlo.proto), with the wire-format reader of
`xspace/protobuf.py`:
HloProto.hlo_module = 1; HloModuleProto.computations = 3; HloComputationProto.instructions = 2;
HloInstructionProto.name = 1, metadata = 7; OpMetadata.op_name = 2, source_file = 3,
source_line = 4, stack_frame_id = 15.

Newer JAX leaves `source_file` empty and records the Python stack instead: OpMetadata's
`stack_frame_id` points into the module's `stack_frame_index` (HloModuleProto = 17), whose
frames (= 4: file_location_id = 1, parent_frame_id = 2) name file locations (= 3:
file_name_id = 1, function_name_id = 2, line = 3) in its file names (= 1). Ids are 1-based
and the frame an op points at is its innermost (the user's line; JAX drops its own frames).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from mldiag.analysis.collection.xspace.protobuf import CorruptProtobuf, fields


def _fields(buf: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) of one message's varint and length-delimited fields."""
    for number, wire, value, end in fields(buf, 0, len(buf)):
        if wire == 0:
            yield number, wire, value
        elif wire == 2:
            yield number, wire, buf[value:end]


def _sub(buf: bytes, number: int) -> Iterator[bytes]:
    for field, wire, value in _fields(buf):
        if field == number and wire == 2 and isinstance(value, bytes):
            yield value


def _stack_frames(module: bytes) -> dict[int, tuple[str, int]]:
    """stack frame id -> (source file, line) of the module's stack frame index."""
    files: list[str] = []
    locations: list[tuple[int, int]] = []
    frames: list[int] = []
    for index in _sub(module, 17):
        for field, wire, value in _fields(index):
            if wire != 2 or not isinstance(value, bytes):
                continue
            if field == 1:
                files.append(value.decode(errors="replace"))
            elif field == 3:
                loc = {f: v for f, w, v in _fields(value) if w == 0 and isinstance(v, int)}
                locations.append((loc.get(1, 0), loc.get(3, 0)))
            elif field == 4:
                frame = {f: v for f, w, v in _fields(value) if w == 0 and isinstance(v, int)}
                frames.append(frame.get(1, 0))
    out: dict[int, tuple[str, int]] = {}
    for frame_id, location_id in enumerate(frames, start=1):
        if 0 < location_id <= len(locations):
            file_id, line = locations[location_id - 1]
            if 0 < file_id <= len(files):
                out[frame_id] = (files[file_id - 1], line)
    return out


def sources(hlo_proto: bytes) -> dict[str, str]:
    """instruction name -> `file.py:LINE (op_name)` (or whichever part is known)."""
    out: dict[str, str] = {}
    for module in _sub(hlo_proto, 1):
        frames = _stack_frames(module)
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
                op_name = source_file = frame_file = ""
                line = frame_line = 0
                for field, _wire, value in _fields(meta):
                    if field == 2 and isinstance(value, bytes):
                        op_name = value.decode(errors="replace")
                    elif field == 3 and isinstance(value, bytes):
                        source_file = value.decode(errors="replace")
                    elif field == 4 and isinstance(value, int):
                        line = value
                    elif field == 15 and isinstance(value, int) and value in frames:
                        frame_file, frame_line = frames[value]
                if not source_file and frame_file:
                    source_file, line = frame_file, frame_line
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
        except (OSError, CorruptProtobuf):
            continue
        if found:
            out[path.name[: -len(".hlo_proto.pb")]] = found
    return out
