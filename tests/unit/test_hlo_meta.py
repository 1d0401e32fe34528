"""Source lines from HLO protos: inline OpMetadata fields, and newer JAX's stack frames."""

from __future__ import annotations

from mldiag.analysis.collection.hlo.meta import sources


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _len(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _instruction(name: str, meta: bytes) -> bytes:
    return _len(1, name.encode()) + _len(7, meta)


def _proto(*instructions: bytes, frames: bytes = b"") -> bytes:
    computation = b"".join(_len(2, i) for i in instructions)
    module = _len(1, b"jit_step") + _len(3, computation) + (_len(17, frames) if frames else b"")
    return _len(1, module)


def test_stack_frame_id_resolves_to_the_innermost_users_line():
    # Files: _common.py, train.py; frame 1 = _common.py:60, frame 2 = train.py:41 (parent 1).
    frames = (_len(1, b"/src/_common.py") + _len(1, b"/src/train.py")
              + _len(2, b"run") + _len(2, b"step")
              + _len(3, _int(1, 1) + _int(2, 1) + _int(3, 60))
              + _len(3, _int(1, 2) + _int(2, 2) + _int(3, 41))
              + _len(4, _int(1, 1))
              + _len(4, _int(1, 2) + _int(2, 1)))
    proto = _proto(
        _instruction("transpose.0", _len(2, b"jit(step)/transpose") + _int(15, 2)),
        _instruction("x.1", _len(2, b"x")),
        _instruction("bad.0", _len(2, b"jit(step)/add") + _int(15, 9)),  # no such frame
        frames=frames)
    assert sources(proto) == {"transpose.0": "train.py:41 (jit(step)/transpose)",
                              "x.1": "x", "bad.0": "jit(step)/add"}


def test_inline_source_file_wins_over_stack_frames():
    frames = (_len(1, b"/src/other.py") + _len(3, _int(1, 1) + _int(3, 7))
              + _len(4, _int(1, 1)))
    meta = _len(2, b"jit(f)/dot") + _len(3, b"/src/model.py") + _int(4, 12) + _int(15, 1)
    assert sources(_proto(_instruction("dot.1", meta), frames=frames)) == {
        "dot.1": "model.py:12 (jit(f)/dot)"}
