"""The vectorised XSpace reader agrees with xprof's own reader, event for event."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mldiag.analysis.collection.xspace.scan import (
    CorruptXSpace,
    XSpaceScan,
    unique_ids,
    varints_at,
)
from mldiag.analysis.collection.xspace.timeline import _covered, _merge
from mldiag.analysis.collection.xspace.write import write_filtered
from tests.helpers.fixtures import GPU_XPLANE, TPU_XPLANE, fixture_id, team_fixture, team_xplanes

FIXTURES = team_xplanes()


def _xprof_lines(path: Path) -> list[tuple[str, str, list[tuple[str, float, float]]]]:
    from xprof.profile_data import ProfileData

    out = []
    with ProfileData.from_file(str(path)) as data:
        for plane in data.planes:
            for line in plane.lines:
                events = [(e.name, e.start_ns, e.duration_ns) for e in line.events]
                out.append((plane.name, line.name, events))
    return out


@pytest.mark.parametrize("path", FIXTURES, ids=fixture_id)
def test_every_event_matches_xprofs_reader(path: Path):
    team_fixture(path)
    expected = _xprof_lines(path)
    with XSpaceScan(path) as scan:
        got = []
        for plane in scan.planes:
            for line in plane.lines:
                names = [plane.event_names.get(int(m), "") for m in line.events.metadata_id]
                got.append((plane.name, line.name,
                            list(zip(names, line.start_ns(), line.duration_ns(), strict=True))))
    assert [(p, n, len(e)) for p, n, e in got] == [(p, n, len(e)) for p, n, e in expected]
    for (_, _, ours), (_, _, theirs) in zip(got, expected, strict=True):
        assert [e[0] for e in ours] == [e[0] for e in theirs]
        assert np.allclose([e[1] for e in ours], [e[1] for e in theirs], rtol=0, atol=1e-3)
        assert np.allclose([e[2] for e in ours], [e[2] for e in theirs], rtol=0, atol=1e-6)


@pytest.mark.parametrize("path", FIXTURES, ids=fixture_id)
def test_a_filtered_copy_keeping_everything_is_byte_identical(path: Path, tmp_path: Path):
    team_fixture(path)
    out = tmp_path / "copy.xplane.pb"
    with XSpaceScan(path) as scan:
        write_filtered(scan, out, lambda plane, line: np.ones(len(line.events), dtype=bool))
    assert out.read_bytes() == path.read_bytes()


def test_a_filtered_copy_drops_exactly_the_rejected_events(tmp_path: Path):
    path = team_fixture(GPU_XPLANE)
    out = tmp_path / "odd.xplane.pb"
    with XSpaceScan(path) as scan:
        kept, dropped = write_filtered(
            scan, out, lambda plane, line: np.arange(len(line.events)) % 2 == 0)
    before, after = _xprof_lines(path), _xprof_lines(out)
    assert dropped > 0 and kept + dropped == sum(len(e) for _, _, e in before)
    for (p1, n1, e1), (p2, n2, e2) in zip(before, after, strict=True):
        assert (p1, n1) == (p2, n2)
        assert e2 == e1[::2]


@pytest.mark.parametrize("path", FIXTURES, ids=fixture_id)
def test_long_lines_decode_and_filter_chunk_by_chunk_as_whole(
        path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines chained a few KiB at a time decode to the same columns, and a copy filtered chunk
    by chunk (by metadata, and whole lines left whole) is the copy filtered line by line."""
    from mldiag.analysis.collection.xspace import scan as xspace_scan

    team_fixture(path)

    def keep(plane: Any, line: Any) -> Any:
        if line.name.startswith("XLA Modules"):
            return None  # whole, without decoding
        return line.events.metadata_id % 3 != 0

    def read(tag: str) -> tuple[list[Any], bytes, tuple[int, int]]:
        out = tmp_path / f"{tag}.xplane.pb"
        with XSpaceScan(path) as scan:
            columns = [(ln.events.metadata_id.tolist(), ln.events.offset_ps.tolist(),
                        ln.events.duration_ps.tolist()) for p in scan.planes for ln in p.lines]
        with XSpaceScan(path) as scan:
            counts = write_filtered(scan, out, keep)
        return columns, out.read_bytes(), counts

    whole = read("whole")
    monkeypatch.setattr(xspace_scan, "_CHAIN_BYTES", 1024)
    chunked = read("chunked")
    assert chunked[0] == whole[0]
    assert chunked[2] == whole[2] and whole[2][1] > 0
    assert chunked[1] == whole[1]


def test_truncated_and_garbage_files_are_corrupt(tmp_path: Path):
    data = team_fixture(GPU_XPLANE).read_bytes()
    for i, content in enumerate([data[: len(data) // 3], b"\xff" * 64, b"\x0a\x05abc"]):
        p = tmp_path / f"bad{i}.xplane.pb"
        p.write_bytes(content)
        with pytest.raises(CorruptXSpace, match="truncated or corrupt"), XSpaceScan(p) as scan:
            for plane in scan.planes:
                for line in plane.lines:
                    line.events  # noqa: B018 - decoding is what must fail


def _brute_union(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    points = sorted({lo, hi, *[x for iv in intervals for x in iv if lo <= x <= hi]})
    total = 0.0
    for a, b in zip(points, points[1:], strict=False):
        mid = (a + b) / 2
        if any(s <= mid < e for s, e in intervals):
            total += b - a
    return total


def test_busy_time_per_window_matches_a_brute_force_union():
    rng = random.Random(7)
    for _ in range(50):
        n = rng.randint(0, 30)
        ivs = [(s := rng.uniform(0, 100), s + rng.uniform(0, 15)) for _ in range(n)]
        windows = [(a := rng.uniform(-5, 100), a + rng.uniform(0, 40)) for _ in range(10)]
        starts = np.array([s for s, _ in ivs])
        ends = np.array([e for _, e in ivs])
        seg_s, seg_e = _merge(starts, ends)
        got = _covered(seg_s, seg_e, np.array([w[0] for w in windows]),
                       np.array([w[1] for w in windows]))
        want = [_brute_union(ivs, lo, hi) for lo, hi in windows]
        assert np.allclose(got, want, atol=1e-9)


@pytest.mark.parametrize("plane,event", [(".*", ".*"), ("^/device:TPU:0$", "fusion"),
                                         ("^/host:CPU$", r"^\$")])
def test_event_aggregates_match_xprofs_tool(plane: str, event: str):
    from mldiag.analysis.collection.profile_input import resolve_session
    from mldiag.analysis.collection.xprof_tools import XprofWorkspace
    from mldiag.analysis.collection.xspace.event_aggregates import aggregate_events

    session = resolve_session(team_fixture(TPU_XPLANE).parent)
    with XprofWorkspace(session) as ws:
        theirs = ws.call("aggregate_xplane_events", plane_regex=plane, event_regex=event)
    ours = aggregate_events(session.xplanes, plane, event)
    assert ours["events_scanned"] == theirs["events_scanned"]
    assert [r["event"] for r in ours["aggregates"]] == [r["event"] for r in theirs["aggregates"]]
    for a, b in zip(ours["aggregates"], theirs["aggregates"], strict=True):
        assert a == pytest.approx(b)


def test_an_ops_executors_are_its_most_overlapping_executions() -> None:
    """8 devices running an all-gather at once are 8 executors; one device whose ops
    alternate between two threads is one; touching intervals do not overlap."""
    import numpy as np

    from mldiag.analysis.collection.xspace.timeline import _max_concurrency

    gather, eigh = ("6", "all_gather.3"), ("14", "eigh.0")
    ids = {gather: 0, eigh: 1}
    # Eight lines, each with one all-gather over [10, 20) (slightly staggered), and eigh
    # alternating between two threads, back to back: [0, 5), [5, 10), [10, 15).
    spans = [(np.array([0]), np.array([10.0 + i * 0.1]), np.array([20.0])) for i in range(8)]
    spans.append((np.array([1, 1]), np.array([0.0, 10.0]), np.array([5.0, 15.0])))
    spans.append((np.array([1]), np.array([5.0]), np.array([10.0])))
    assert _max_concurrency(ids, spans) == {gather: 8, eigh: 1}


def _encode(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64s are written as 10-byte varints
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


@given(st.lists(st.one_of(st.integers(0, 2**7), st.integers(0, 2**56 + 5),
                          st.integers(-(2**63), 2**63 - 1)), min_size=1, max_size=60),
       st.integers(0, 3))
@settings(max_examples=200, deadline=None)
def test_varints_decode_as_protobuf_writes_them_at_every_length(values, pad):
    # One buffer of varints back to back, so some sit within 8 bytes of its end.
    blob = b"".join(_encode(v) for v in values) + b"\x00" * pad
    starts, pos = [], 0
    for v in values:
        starts.append(pos)
        pos += len(_encode(v))
    buf = np.frombuffer(blob, dtype=np.uint8)
    got, after = varints_at(buf, np.array(starts, dtype=np.int64))
    # Read back as int64, as the fields are declared: a negative one is itself again.
    assert [int(g) for g in got] == values
    assert list(after) == [s + len(_encode(v)) for s, v in zip(starts, values, strict=True)]


def test_a_varint_that_runs_past_the_buffer_is_minus_one():
    buf = np.frombuffer(b"\x01" * 9 + b"\xff\xff", dtype=np.uint8)
    got, _ = varints_at(buf, np.array([0, 9, 10, 11, -1], dtype=np.int64))
    assert list(got) == [1, -1, -1, -1, -1]


@given(st.lists(st.integers(-3, 70), max_size=300), st.booleans())
@settings(max_examples=200, deadline=None)
def test_unique_ids_is_numpys_unique(values, spread):
    ids = np.array(values, dtype=np.int64)
    if spread and len(ids):
        ids = ids * 10**9  # far more values than entries: numpy's own path
    uniq, first, inverse = unique_ids(ids)
    want = np.unique(ids, return_index=True, return_inverse=True)
    assert uniq.tolist() == want[0].tolist()
    assert first.tolist() == want[1].tolist()
    assert inverse.tolist() == want[2].reshape(-1).tolist()


def _field(num: int, value: int | bytes) -> bytes:
    from mldiag.analysis.collection.xspace.protobuf import encode_varint

    if isinstance(value, bytes):
        return encode_varint(num << 3 | 2) + encode_varint(len(value)) + value
    return encode_varint(num << 3) + encode_varint(value)


# XEvent fields by number: 1 metadata_id, 2 offset_ps, 3 duration_ps, 4 stats, 5 occurrences.
_ORDERS = ((1, 2, 3, 4), (2, 1, 3, 4), (4, 3, 2, 1), (3, 4, 1, 2), (2, 4, 3, 1), (1, 4, 2, 3))


def _space(orders: list[tuple[int, ...]]) -> tuple[bytes, list[tuple[int, int, int, int]]]:
    """One plane, one line, an event per entry of `orders` with its fields in that order;
    and each event's (metadata id, offset, duration, value of stat 7)."""
    events, expected = b"", []
    for i, order in enumerate(orders):
        mid, offset, duration, value = 1 + i % 3, 1000 * i + 5, 300 + i, 7000 + i
        stat = _field(1, 7) + _field(4, value)  # XStat: metadata_id 7, int64_value
        parts = {1: _field(1, mid), 2: _field(2, offset), 3: _field(3, duration),
                 4: _field(4, stat)}
        events += _field(4, b"".join(parts[n] for n in order))
        expected.append((mid, offset, duration, value))
    line = _field(2, b"XLA Ops") + _field(3, 1_000_000) + events
    plane = _field(2, b"/device:TPU:0") + _field(3, line)
    for k in (1, 2, 3):
        plane += _field(4, _field(1, k) + _field(2, _field(1, k) + _field(2, f"op{k}".encode())))
    plane += _field(5, _field(1, 7) + _field(2, _field(1, 7) + _field(2, b"group_id")))
    return _field(1, plane), expected


def test_events_written_out_of_field_order_decode_as_in_order(tmp_path: Path) -> None:
    orders = [random.Random(seed).choice(_ORDERS) for seed in range(200)]
    # A block's first events in order and a few later ones not: found event by event.
    late = [_ORDERS[0]] * 100 + [_ORDERS[1], _ORDERS[3], _ORDERS[4], _ORDERS[5]] * 5
    for name, chosen in (("in_order", [_ORDERS[0]] * len(orders)), ("shuffled", orders),
                         ("late", late)):
        blob, expected = _space(chosen)
        path = tmp_path / f"{name}.xplane.pb"
        path.write_bytes(blob)
        with XSpaceScan(path) as scan:
            (plane,) = scan.planes
            (line,) = plane.lines
            ev = line.events
            got = list(zip(ev.metadata_id.tolist(), ev.offset_ps.tolist(),
                           ev.duration_ps.tolist(), scan.int_stat(ev, 7).tolist(),
                           strict=True))
        assert got == expected, name
