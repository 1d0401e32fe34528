"""The host op-metrics database's total time, read as the cut decodes the host lines, is
xprof's over the whole trace: on hand-written host planes with every way an event is a TF
activity or is not (xprof's converter as the oracle), and across a cut into windows."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from mldiag.analysis.collection.hosts import op_stats_shards as shards
from mldiag.analysis.collection.profile_input import resolve_session
from mldiag.analysis.collection.xprof_tools import OP_STATS_FILE, XprofWorkspace
from mldiag.analysis.collection.xspace import scan as xspace_scan
from mldiag.analysis.collection.xspace.host_activity import (
    HOST_THREADS_PLANE,
    HostActivity,
    derived_thread,
    tf_op_category_known,
)
from mldiag.analysis.collection.xspace.scan import XSpaceScan

# Event names, and whether tsl's ParseTfOpFullname gives them a category.
NAMES = {
    "model/dense/MatMul:MatMul": True,       # TF name and type
    "model/dense/MatMul_1:": True,           # empty type: TF (or JAX)
    "jit(f)/dot_general:dot_general": True,  # JAX type
    "x:transpose[permutation=(0, 1)]": True,  # JAX type with details
    "Iterator::Batch::Map": True,            # a dataset op
    "MemcpyHToD": True,                      # a copy, any case
    "memcpyDtoH_7": True,
    "tpu::System::Execute": False,           # "tpu" then ":System::Execute"
    "XLA::TPU lowering": False,
    "PjitFunction(f)": False,                # no colon
    "a b:MatMul": False,                      # not a TF name, not a JAX type
    "name:Mixed-Type": False,
    "": False,
}
# The input pipeline's stats as xprof names them (2, 3), and as its sources spell the stat
# types (7, 8), which xprof 2.24.2 does not read.
STATS = {1: "tf_op", 2: "_ipl_stage_id", 3: "_ipl_stage_cat", 4: "dummy", 5: "",
         6: "step_num", 7: "input_pipeline_stage_id", 8: "input_pipeline_stage_category"}


def test_tf_op_categories_as_tsl_parses_them() -> None:
    assert {n: tf_op_category_known(n) for n in NAMES} == NAMES


def test_derived_thread_ids_are_compared_as_a_cpp_int() -> None:
    assert derived_thread(0xDEADBEEF) and derived_thread(0xDEADBEEF + 289)
    assert derived_thread(0xDEADBEEF - 2**32)  # the same id, written as a negative int64
    assert not derived_thread(0xDEADBEEF - 1) and not derived_thread(0xDEADBEEF + 290)
    assert not derived_thread(3116817)


def _host_plane(path: Path, seed: int, events: int,
                durations: tuple[int, ...] = (0, 10, 10**4, 10**6)) -> None:
    """A host plane whose events are activities in every way xprof has, and not: names of
    each kind, `tf_op` stats (string, empty, reference to a named or unnamed stat, integer)
    on events and on metadata, input-pipeline stage ids with and without a category (also
    colliding with metadata ids), unnamed metadata, and a derived thread's line."""
    from mldiag.sdk.xspace import XSpace

    rng = random.Random(seed)
    space = XSpace()
    plane = space.planes.add(id=1, name=HOST_THREADS_PLANE)
    for k, name in STATS.items():
        plane.stat_metadata[k].id = k
        plane.stat_metadata[k].name = name
    names = list(NAMES)
    for k, name in enumerate(names, start=1):
        plane.event_metadata[k].id = k
        plane.event_metadata[k].name = name
    n = len(names)
    # Metadata that carry a stat of their own.
    md_stats: dict[int, tuple[int, str, Any]] = {
        n + 1: (1, "str", "Model/op:Op"), n + 2: (1, "str", ""), n + 3: (2, "int", 3),
        n + 4: (3, "str", "preprocessing"), n + 5: (1, "ref", 4)}
    for k, (sid, kind, value) in md_stats.items():
        plane.event_metadata[k].id = k
        plane.event_metadata[k].name = f"Traced{k}"
        stat = plane.event_metadata[k].stats.add(metadata_id=sid)
        _set(stat, kind, value)
    ids = list(range(1, n + 6))
    choices = [(1, "str", "op:Op"), (1, "str", ""), (1, "ref", 4), (1, "ref", 5),
               (1, "int", 7), (2, "int", 2), (2, "int", 3), (2, "int", 40), (2, "uint", 3),
               (3, "str", "read"), (7, "int", 40), (8, "str", "read"), (2, "int", 0)]
    for line_id in (7, 8, 9, 0xDEADBEEF + 3):
        line = plane.lines.add(id=line_id, name=f"thread{line_id}",
                               timestamp_ns=1000 + line_id % 17)
        t = rng.randrange(10**6)
        for _ in range(events):
            t += rng.randrange(1, 10**5)
            ev = line.events.add(metadata_id=rng.choice(ids), offset_ps=t,
                                 duration_ps=rng.choice(durations))
            for sid, kind, value in rng.sample(choices, rng.choice((0, 0, 1, 2, 3))):
                _set(ev.stats.add(metadata_id=sid), kind, value)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(space.SerializeToString())


def _set(stat: Any, kind: str, value: Any) -> None:
    if kind == "int":
        stat.int64_value = value
    elif kind == "uint":  # xprof's `IntValue()` reads 0 from a uint64
        stat.uint64_value = value
    elif kind == "str":
        stat.str_value = value
    else:
        stat.ref_value = value


def _xprof_host_db(run_dir: Path) -> Any:
    with XprofWorkspace(resolve_session(run_dir)) as ws:
        ws.precompute_op_stats()
        return shards.read(ws.run_dir / OP_STATS_FILE).host_op_metrics_db


def _ours(xplane: Path, cuts: list[int] | None = None) -> HostActivity:
    with XSpaceScan(xplane) as scan:
        host = HostActivity(scan, cuts or [])
        for plane in scan.planes:
            for line in plane.lines:
                for chunk in scan.chunks(line):
                    host.add(plane, chunk)
        return host


@pytest.mark.parametrize("seed", range(4))
def test_the_host_total_is_xprofs_on_hand_written_host_planes(
        seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    xplane = tmp_path / "trace/plugins/profile/run1/host.xplane.pb"
    _host_plane(xplane, seed, 400)
    db = _xprof_host_db(xplane.parent)
    assert db.total_time_ps > 0 and len(db.metrics_db) > 3
    # Lines read a few KiB at a time, as the cut reads a long line.
    monkeypatch.setattr(xspace_scan, "_CHAIN_BYTES", 2048)
    assert _ours(xplane).total_time_ps() == db.total_time_ps


def test_windows_of_a_host_plane_combine_into_its_database(tmp_path: Path) -> None:
    """Cut where no activity spans the cut, the windows' host databases and the cut's total
    are the whole host's; where one does, the cut says so."""
    xplane = tmp_path / "trace/plugins/profile/run1/host.xplane.pb"
    _host_plane(xplane, 7, 400, durations=(0, 10, 10**3, 10**4))
    whole = _xprof_host_db(xplane.parent)
    with XSpaceScan(xplane) as scan:
        spans = sorted((ln.timestamp_ns * 1000 + o, ln.timestamp_ns * 1000 + o + d, m)
                       for p in scan.planes for ln in p.lines[:3]
                       for o, d, m in zip(ln.events.offset_ps.tolist(),
                                          ln.events.duration_ps.tolist(),
                                          ln.events.metadata_id.tolist(), strict=True))
    # Inside an activity (a TF op's name): it spans the cut.
    b, e, _ = next(x for x in spans if x[2] == 1 and x[1] > x[0] + 1)
    assert "1 host activities span a cut" in _ours(xplane, [(b + e) // 2]).inexact()
    begins = [b for b, _, _ in spans]
    reach = list(itertools.accumulate((e for _, e, _ in spans), max))
    # Where no event spans it (the middle one of those points): the windows add up.
    gaps = [i for i in range(len(spans) - 1) if begins[i + 1] > reach[i]]
    assert len(gaps) > 10
    g = gaps[len(gaps) // 2]
    cuts = [(reach[g] + begins[g + 1]) // 2]
    out = [tmp_path / f"w{k}/plugins/profile/run1" for k in range(2)]
    for d in out:
        d.mkdir(parents=True)
    with XSpaceScan(xplane) as scan:
        host = HostActivity(scan, cuts)
        extents = shards.write_windows(scan, cuts, [d / xplane.name for d in out],
                                       each_line=host.add)
    assert host.inexact() == ""
    from xprof.protobuf import op_stats_pb2

    parts = []
    for d in out:
        o = op_stats_pb2.OpStats()
        o.host_op_metrics_db.CopyFrom(_xprof_host_db(d))
        parts.append(o)
    combined = shards.combine(parts, shards.seams(extents, host)).host_op_metrics_db
    assert combined.total_time_ps == whole.total_time_ps
    assert combined.total_op_time_ps == whole.total_op_time_ps
    idle = {m.name: m.time_ps for m in combined.metrics_db}
    assert idle["IDLE"] == {m.name: m.time_ps for m in whole.metrics_db}["IDLE"]


def test_stage_ids_and_references_of_several_bytes_are_read_whole(tmp_path: Path) -> None:
    """Stat values past one varint byte: a stage id of 300 and a reference to stat 200."""
    from mldiag.sdk.xspace import XSpace

    space = XSpace()
    plane = space.planes.add(id=1, name=HOST_THREADS_PLANE)
    for k, name in ((1, "tf_op"), (2, "_ipl_stage_id"), (3, "_ipl_stage_cat"), (200, "x:Op")):
        plane.stat_metadata[k].id = k
        plane.stat_metadata[k].name = name
    for k, name in ((300, "a:MatMul"), (5, "plain"), (6, "plain too")):
        plane.event_metadata[k].id = k
        plane.event_metadata[k].name = name
    line = plane.lines.add(id=1, name="t", timestamp_ns=0)
    line.events.add(metadata_id=300, offset_ps=0, duration_ps=10)  # a TF op: key 300
    staged = line.events.add(metadata_id=5, offset_ps=1000, duration_ps=10)
    staged.stats.add(metadata_id=2, int64_value=300)  # its stage id names that op
    line = plane.lines.add(id=2, name="u", timestamp_ns=0)
    line.events.add(metadata_id=6, offset_ps=0, duration_ps=10)
    ref = line.events.add(metadata_id=6, offset_ps=5000, duration_ps=7)
    ref.stats.add(metadata_id=1, ref_value=200)  # tf_op "x:Op", by reference
    line.events.add(metadata_id=6, offset_ps=9000, duration_ps=10)
    xplane = tmp_path / "trace/plugins/profile/run1/host.xplane.pb"
    xplane.parent.mkdir(parents=True)
    xplane.write_bytes(space.SerializeToString())
    assert _ours(xplane).total_time_ps() == _xprof_host_db(xplane.parent).total_time_ps \
        == 1010 + 7
