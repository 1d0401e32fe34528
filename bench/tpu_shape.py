"""TPU-shaped profiles of a given size: a real TPU capture repeated in time.

    python bench/tpu_shape.py SIZE_MB OUT_LOGDIR [--source XPLANE]

The product's own input is a TPU device trace: device planes of XLA ops, modules and steps
(continuous profiling keeps the last 2 GB of it per host). To get one of any size, a real
capture (the team's TPU v6 Lite fixture by default) is repeated in time: every event of every
line of every plane is copied once per repetition, shifted by one span of the whole capture
(plus a gap), so the plane, line, op and metadata structure is the capture's own and only the
duration grows, as if the same program had run longer. Event metadata, stat metadata and the
events' stats are the capture's bytes, unchanged.

The output is written as a stream: each event's bytes without its offset are encoded once,
and the offset is written per copy; the sizes of planes and lines (protobuf length prefixes)
are computed before writing, so memory stays at a few times the source's size, whatever the
output's.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mldiag.sdk.xspace import parse_xspace

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = (REPO.parent / "shared" / "fixtures" / "tpu_inference_2" / "plugins" /
                  "profile" / "run1" / "tpu_inference_2.xplane.pb")
# Between copies: the capture's own span plus this fraction of it, idle, as between windows.
GAP_FRACTION = 0.01

_OFFSET_TAG = b"\x10"  # XEvent.offset_ps: field 2, varint
_EVENT_TAG = 0x22  # XLine.events: field 4, length-delimited
_LINE_TAG = 0x1A  # XPlane.lines: field 3, length-delimited
_PLANE_TAG = 0x0A  # XSpace.planes: field 1, length-delimited


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _varint_sizes(values: np.ndarray) -> np.ndarray:
    """Encoded sizes of non-negative varints, element-wise."""
    sizes = np.ones(values.shape, dtype=np.int64)
    v = values.astype(np.uint64) >> np.uint64(7)
    while v.any():
        sizes += v > 0
        v >>= np.uint64(7)
    return sizes


def _metadata_id_size(body: bytes) -> int:
    """Bytes of the leading metadata_id field (tag 0x08 and its varint) of a serialized
    event, 0 when it has none."""
    if not body or body[0] != 0x08:
        return 0
    i = 1
    while body[i] & 0x80:
        i += 1
    return i + 1


@dataclass
class _Line:
    header: bytes  # the line without its events, its duration already stretched
    bodies: list[bytes]  # each event without its offset
    offsets: np.ndarray  # each event's offset_ps (-1: the event has none, e.g. aggregated)
    body_sizes: np.ndarray
    heads: np.ndarray  # bytes of each body before where its offset goes (its metadata_id)

    def copy_size(self, shift_ps: int) -> int:
        """Bytes of one copy of the events, shifted by `shift_ps`, as line fields."""
        has = self.offsets >= 0
        event = self.body_sizes + np.where(has, 1 + _varint_sizes(
            np.where(has, self.offsets + shift_ps, 0)), 0)
        return int((1 + _varint_sizes(event) + event).sum())

    def write_copy(self, out: BinaryIO, shift_ps: int) -> None:
        parts = []
        for body, head, offset in zip(self.bodies, self.heads.tolist(), self.offsets.tolist(),
                                      strict=True):
            # The offset goes where a serializer puts it: after metadata_id (field 1), before
            # duration_ps and the stats (readers may rely on fields in field-number order).
            event = body if offset < 0 else (
                body[:head] + _OFFSET_TAG + _varint(offset + shift_ps) + body[head:])
            parts.append(bytes((_EVENT_TAG,)) + _varint(len(event)) + event)
        out.write(b"".join(parts))


@dataclass
class _Plane:
    header: bytes
    lines: list[_Line]


def _span_ps(space: Any) -> tuple[int, int]:
    """(first start, last end) of any event in the capture, in ps since the epoch."""
    first, last = math.inf, -math.inf
    for plane in space.planes:
        for line in plane.lines:
            base = line.timestamp_ns * 1000
            for e in line.events:
                if e.WhichOneof("data") == "offset_ps":
                    first = min(first, base + e.offset_ps)
                    last = max(last, base + e.offset_ps + e.duration_ps)
    if first == math.inf:
        raise ValueError("the source capture has no timed events")
    return int(first), int(last)


def _prepare(space: Any, copies: int, period_ps: int) -> list[_Plane]:
    planes = []
    for plane in space.planes:
        lines = []
        for line in plane.lines:
            bodies, offsets = [], []
            for e in line.events:
                if e.WhichOneof("data") == "offset_ps":
                    offsets.append(e.offset_ps)
                    e.ClearField("offset_ps")
                else:
                    offsets.append(-1)
                bodies.append(e.SerializeToString())
            del line.events[:]
            if line.duration_ps:
                line.duration_ps += (copies - 1) * period_ps
            lines.append(_Line(line.SerializeToString(), bodies, np.array(offsets, np.int64),
                               np.array([len(b) for b in bodies], np.int64),
                               np.array([_metadata_id_size(b) for b in bodies], np.int64)))
        del plane.lines[:]
        planes.append(_Plane(plane.SerializeToString(), lines))
    return planes


def generate(out_logdir: Path, size_mb: float, source: Path = DEFAULT_SOURCE,
             host: str = "tpu_host") -> dict[str, Any]:
    """Write `<out_logdir>/plugins/profile/run1/<host>.xplane.pb` of about `size_mb` MB."""
    blob = source.read_bytes()
    space = parse_xspace(blob, str(source))
    first, last = _span_ps(space)
    period_ps = int((last - first) * (1 + GAP_FRACTION)) + 1
    copies = max(1, round(size_mb * 1024**2 / len(blob)))
    planes = _prepare(space, copies, period_ps)
    del space.planes[:]
    tail = space.SerializeToString()  # hostnames, errors, warnings
    xplane = out_logdir / "plugins" / "profile" / "run1" / f"{host}.xplane.pb"
    xplane.parent.mkdir(parents=True, exist_ok=True)
    with open(xplane, "wb") as out:
        for plane in planes:
            line_sizes = [len(line.header) + sum(line.copy_size(k * period_ps)
                                                 for k in range(copies))
                          for line in plane.lines]
            plane_size = len(plane.header) + sum(1 + len(_varint(s)) + s for s in line_sizes)
            out.write(bytes((_PLANE_TAG,)) + _varint(plane_size) + plane.header)
            for line, size in zip(plane.lines, line_sizes, strict=True):
                out.write(bytes((_LINE_TAG,)) + _varint(size) + line.header)
                for k in range(copies):
                    line.write_copy(out, k * period_ps)
        out.write(tail)
    meta = {"source": str(source), "source_bytes": len(blob), "copies": copies,
            "period_ms": round(period_ps / 1e9, 3), "bytes": xplane.stat().st_size}
    (out_logdir / "shape.json").write_text(json.dumps(meta))
    return meta


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("size_mb", type=float)
    parser.add_argument("out_logdir", type=Path)
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE,
                        help="the capture to repeat (default: the team's TPU fixture)")
    parser.add_argument("--host", default="tpu_host")
    args = parser.parse_args()
    print(json.dumps(generate(args.out_logdir, args.size_mb, args.source, args.host)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
