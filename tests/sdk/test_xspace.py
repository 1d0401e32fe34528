"""Merging consecutive XSpace windows of one host: real jax CPU traces and the team's fixtures."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.unknown_fields import UnknownFieldSet

from mldiag.sdk.xspace import XSpace, merge_xspaces, parse_xspace
from tests.helpers.fixtures import SHARED_FIXTURES, TPU, team_fixture
from tests.helpers.jax_steps import jit_loop, step_events


def _capture_windows(root: Path, count: int, seconds: float) -> list[bytes]:
    import jax

    blobs = []
    with jit_loop():
        for i in range(count):
            with jax.profiler.trace(root / f"w{i}"):
                time.sleep(seconds)  # the loop thread steps meanwhile
            (found,) = (root / f"w{i}").rglob("*.xplane.pb")
            blobs.append(found.read_bytes())
    return blobs


@pytest.fixture(scope="module")
def windows(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    return _capture_windows(tmp_path_factory.mktemp("windows"), 3, 0.4)


def _stat_value(plane: Any, stat: Any) -> Any:
    kind = stat.WhichOneof("value")
    if kind == "ref_value":
        return plane.stat_metadata[stat.ref_value].name
    return getattr(stat, kind) if kind else None


def _xla_ops(blob: bytes) -> list[tuple[str, str, Any, Any]]:
    """(line, op name, hlo_op, hlo_module) of each XLA op event, with every id resolved."""
    ops = []
    for plane in parse_xspace(blob).planes:
        for line in plane.lines:
            for event in line.events:
                stats = {plane.stat_metadata[s.metadata_id].name: _stat_value(plane, s)
                         for s in event.stats}
                if "hlo_op" in stats:
                    ops.append((line.name, plane.event_metadata[event.metadata_id].name,
                                stats["hlo_op"], stats.get("hlo_module")))
    return ops


@pytest.mark.slow
def test_merged_windows_hold_every_op_event_of_each_window(windows: list[bytes]) -> None:
    merged = merge_xspaces(windows)

    per_window = [_xla_ops(w) for w in windows]
    assert all(per_window), "each window recorded XLA ops"
    merged_ops = _xla_ops(merged)
    assert len(merged_ops) == sum(len(ops) for ops in per_window)
    # Same events, with names and referenced stats resolved exactly as in their window.
    assert sorted(merged_ops) == sorted(op for ops in per_window for op in ops)


@pytest.mark.slow
def test_merged_windows_keep_time_order(windows: list[bytes]) -> None:
    merged = merge_xspaces(windows)

    steps = step_events(merged)
    assert len(steps) == sum(len(step_events(w)) for w in windows)
    by_time = [num for num, _ in sorted(steps, key=lambda s: s[1])]
    # The loop numbers its steps: on one timeline, later windows' steps come after.
    assert by_time == sorted(by_time)
    assert len(set(by_time)) == len(by_time)
    # The gap between windows is real time, not collapsed: the last step starts after the
    # first window's own span.
    first_span = max(t for _, t in step_events(windows[0]))
    assert max(t for _, t in steps) > first_span * 2


@pytest.mark.slow
def test_collect_analyses_the_merged_windows(windows: list[bytes], tmp_path: Path) -> None:
    from mldiag.analysis.collection.collect import collect

    session = tmp_path / "run" / "plugins" / "profile" / "s"
    session.mkdir(parents=True)
    (session / "vm.xplane.pb").write_bytes(merge_xspaces(windows))

    snapshot = collect(session)

    step_trace = snapshot["tools"]["get_step_trace"]
    assert step_trace["status"] == "DATA"
    one_window = len(step_events(windows[0]))
    assert step_trace["data"]["summary"]["total_steps"] > one_window
    assert snapshot["tools"]["list_hlo_modules"]["status"] == "DATA"


@pytest.mark.slow
def test_merging_one_window_gives_the_same_trace(windows: list[bytes]) -> None:
    merged = merge_xspaces(windows[:1])

    assert _xla_ops(merged) == _xla_ops(windows[0])
    assert step_events(merged) == step_events(windows[0])


@pytest.mark.parametrize("blobs, message", [
    ([], "no XSpace"),
    ([b""], "window 0 is empty"),
    ([b"\xff\xfe this is not a protobuf"], "window 0 is not a serialized XSpace"),
    ([b"hello world"], "window 0 is not a serialized XSpace"),
])
def test_garbage_is_a_clear_value_error(blobs: list[bytes], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        merge_xspaces(blobs)


def test_a_bad_later_window_is_named() -> None:
    good = _space(start_ns=0, events=[("a", 0)]).SerializeToString()
    with pytest.raises(ValueError, match="window 1 is empty"):
        merge_xspaces([good, b""])


def _assert_no_unknown_fields(message: Any, path: str, budget: list[int]) -> None:
    assert len(UnknownFieldSet(message)) == 0, f"unknown fields at {path}"
    budget[0] -= 1
    for field, value in message.ListFields():
        if budget[0] <= 0:
            return
        if field.message_type is None:
            continue
        items = value.values() if field.message_type.GetOptions().map_entry else (
            value if field.is_repeated else [value])
        for i, item in enumerate(items):
            if i >= 50:
                break
            _assert_no_unknown_fields(item, f"{path}.{field.name}[{i}]", budget)


@pytest.mark.parametrize("name", ["tpu_inference_2", "gpu_multi_worker"])
def test_descriptor_reads_real_traces_without_unknown_fields(name: str, tmp_path: Path) -> None:
    src = team_fixture(SHARED_FIXTURES / name)
    (xplane,) = src.rglob("*.xplane.pb")
    copy = tmp_path / xplane.name
    shutil.copy(xplane, copy)
    blob = copy.read_bytes()

    space = parse_xspace(blob)

    _assert_no_unknown_fields(space, "XSpace", [20000])
    # Every field is known, so a round trip loses nothing (map entries may be reordered).
    again = space.SerializeToString()
    assert len(again) == len(blob)
    assert parse_xspace(again) == space


def test_tpu_fixture_merged_with_its_continuation_keeps_devices_and_ops(tmp_path: Path) -> None:
    src = team_fixture(SHARED_FIXTURES / TPU)
    (xplane,) = src.rglob("*.xplane.pb")
    first = xplane.read_bytes()
    # A second window of the same host 200 s later, as the ring would record it.
    later = parse_xspace(first)
    _set_start(later, _start(later) + 200 * 10**9)

    merged = parse_xspace(merge_xspaces([first, later.SerializeToString()]))

    original = parse_xspace(first)
    assert [p.name for p in merged.planes] == [p.name for p in original.planes]
    for m, o in zip(merged.planes, original.planes, strict=True):
        assert sum(len(line.events) for line in m.lines) == 2 * sum(
            len(line.events) for line in o.lines)
        # Identical metadata is shared, not duplicated.
        assert len(m.event_metadata) == len(o.event_metadata)
        assert len(m.stat_metadata) == len(o.stat_metadata)


# Synthetic windows: the re-keying rules, one at a time.

def _start(space: Any) -> int:
    for plane in space.planes:
        if plane.name == "Task Environment":
            for stat in plane.stats:
                if plane.stat_metadata[stat.metadata_id].name == "profile_start_time":
                    return int(stat.uint64_value)
    raise AssertionError("no profile_start_time")


def _set_start(space: Any, start_ns: int) -> None:
    for plane in space.planes:
        if plane.name == "Task Environment":
            for stat in plane.stats:
                if plane.stat_metadata[stat.metadata_id].name == "profile_start_time":
                    stat.uint64_value = start_ns


def _space(start_ns: int, events: list[tuple[str, int]], stop_ns: int | None = None,
           event_ids: dict[str, int] | None = None, stat_ids: dict[str, int] | None = None,
           line: tuple[int, str] = (7, "thread")) -> Any:
    """One host window: a CPU plane with one line, and a Task Environment plane."""
    event_ids = event_ids or {}
    stat_ids = stat_ids or {"hlo_op": 1, "op_a": 2, "op_b": 3, "start": 4, "stop": 5}
    space = XSpace(hostnames=["host-a"])
    env = space.planes.add(name="Task Environment")
    for name, sid in (("profile_start_time", stat_ids["start"]),
                      ("profile_stop_time", stat_ids["stop"])):
        env.stat_metadata[sid].id = sid
        env.stat_metadata[sid].name = name
    env.stats.add(metadata_id=stat_ids["start"], uint64_value=start_ns)
    env.stats.add(metadata_id=stat_ids["stop"], uint64_value=stop_ns or start_ns + 10**9)
    plane = space.planes.add(id=1, name="/host:CPU")
    for name in ("hlo_op", "op_a", "op_b"):
        plane.stat_metadata[stat_ids[name]].id = stat_ids[name]
        plane.stat_metadata[stat_ids[name]].name = name
    xline = plane.lines.add(id=line[0], name=line[1], timestamp_ns=100)
    for name, offset_ps in events:
        eid = event_ids.setdefault(name, len(event_ids) + 1)
        md = plane.event_metadata[eid]
        md.id, md.name = eid, name
        event = xline.events.add(metadata_id=eid, offset_ps=offset_ps, duration_ps=10)
        event.stats.add(metadata_id=stat_ids["hlo_op"], ref_value=stat_ids[f"op_{name}"])
    return space


def _resolved(blob: bytes) -> list[tuple[str, int, str]]:
    """(event name, absolute start ps, hlo_op) of each event of the /host:CPU plane."""
    space = parse_xspace(blob)
    start = _start(space)
    out = []
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            for e in line.events:
                (stat,) = e.stats
                out.append((plane.event_metadata[e.metadata_id].name,
                            (start + line.timestamp_ns) * 1000 + e.offset_ps,
                            plane.stat_metadata[stat.ref_value].name))
    return out


def test_colliding_ids_are_rekeyed_and_references_follow() -> None:
    first = _space(10**12, [("a", 0), ("b", 50)])
    # The later window numbered its metadata the other way round.
    later = _space(10**12 + 2 * 10**9, [("b", 0), ("a", 70)], event_ids={"b": 1, "a": 2},
                   stat_ids={"hlo_op": 3, "op_a": 1, "op_b": 2, "start": 1, "stop": 2})
    blobs = [first.SerializeToString(), later.SerializeToString()]

    merged = merge_xspaces(blobs)

    assert _resolved(merged) == _resolved(blobs[0]) + _resolved(blobs[1])
    cpu = next(p for p in parse_xspace(merged).planes if p.name == "/host:CPU")
    assert sorted(md.name for md in cpu.event_metadata.values()) == ["a", "b"]
    assert sorted(md.name for md in cpu.stat_metadata.values()) == ["hlo_op", "op_a", "op_b"]
    assert len(cpu.lines) == 1


def test_later_events_are_rebased_on_the_first_line_and_the_span_grows() -> None:
    first = _space(10**12, [("a", 0)], stop_ns=10**12 + 10**9)
    later = _space(10**12 + 3 * 10**9, [("a", 5)], stop_ns=10**12 + 4 * 10**9)

    merged = parse_xspace(merge_xspaces([first.SerializeToString(), later.SerializeToString()]))

    cpu = next(p for p in merged.planes if p.name == "/host:CPU")
    (line,) = cpu.lines
    assert line.timestamp_ns == 100
    assert [e.offset_ps for e in line.events] == [0, 3 * 10**12 + 5]
    env = next(p for p in merged.planes if p.name == "Task Environment")
    values = {env.stat_metadata[s.metadata_id].name: s.uint64_value for s in env.stats}
    assert values == {"profile_start_time": 10**12, "profile_stop_time": 10**12 + 4 * 10**9}
    assert list(merged.hostnames) == ["host-a"]


def test_lines_and_planes_only_in_later_windows_are_appended() -> None:
    first = _space(10**12, [("a", 0)])
    later = _space(10**12 + 10**9, [("b", 0)], line=(8, "new thread"))
    extra = later.planes.add(id=1, name="/device:GPU:0")
    extra.lines.add(id=1, name="stream", timestamp_ns=5)

    merged = parse_xspace(merge_xspaces([first.SerializeToString(), later.SerializeToString()]))

    cpu = next(p for p in merged.planes if p.name == "/host:CPU")
    assert [(line.id, line.name) for line in cpu.lines] == [(7, "thread"), (8, "new thread")]
    gpu = [p for p in merged.planes if p.name == "/device:GPU:0"]
    assert len(gpu) == 1 and gpu[0].id != cpu.id
    # The appended line is on the merged timeline too: 1 s after the first window.
    assert cpu.lines[1].timestamp_ns == 100 + 10**9


def test_same_name_with_different_stats_is_not_merged_into_one_metadata() -> None:
    first = _space(10**12, [("a", 0)])
    later = _space(10**12 + 10**9, [("a", 0)])
    cpu_later = next(p for p in later.planes if p.name == "/host:CPU")
    md = next(iter(cpu_later.event_metadata.values()))
    md.stats.add(metadata_id=2, str_value="program 2")
    md.child_id.append(md.id)

    merged = parse_xspace(merge_xspaces([first.SerializeToString(), later.SerializeToString()]))

    cpu = next(p for p in merged.planes if p.name == "/host:CPU")
    assert len(cpu.event_metadata) == 2
    new = next(m for m in cpu.event_metadata.values() if m.stats)
    assert list(new.child_id) == [new.id]
    (line,) = cpu.lines
    assert [e.metadata_id for e in line.events] == [1, new.id]
