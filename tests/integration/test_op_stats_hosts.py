"""Hosts' op_stats combined by `op_stats_hosts` equal xprof's own multi-host build, field by
field: the seam that lets a fanned-out session's large hosts build their op_stats apart."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from mldiag.analysis.collection.hosts import op_stats_hosts as hosts
from mldiag.analysis.collection.hosts import op_stats_shards as shards
from mldiag.analysis.collection.xspace.scan import XSpaceScan
from tests.helpers.fixtures import GPU_XPLANE as GPU
from tests.helpers.fixtures import REPO, team_fixture
from tests.helpers.fixtures import TPU_XPLANE as TPU
from tests.helpers.op_stats import xprof_op_stats


def _generate(tmp: Path, copies: int) -> Path:
    sys.path.insert(0, str(REPO / "bench"))
    from tpu_shape import generate

    generate(tmp, copies * TPU.stat().st_size / 1024**2)
    (xplane,) = (tmp / "plugins/profile/run1").glob("*.xplane.pb")
    return xplane


def _normal(o: Any) -> bytes:
    """The OpStats with each op-metrics database in one order (xprof's own order of ops
    within a host follows a hash map's, and so does a map packed in a step's breakdown),
    serialized deterministically."""
    from xprof.protobuf import op_stats_pb2, steps_db_pb2

    out = op_stats_pb2.OpStats()
    out.CopyFrom(o)
    for step in out.step_db.step_sequence:
        for info in step.step_info_per_core.values():
            if info.step_breakdown.Is(steps_db_pb2.GenericStepBreakdown.DESCRIPTOR):
                breakdown = steps_db_pb2.GenericStepBreakdown()
                info.step_breakdown.Unpack(breakdown)
                info.step_breakdown.value = breakdown.SerializeToString(deterministic=True)
    dbs = [out.host_op_metrics_db, out.device_op_metrics_db,
           out.hlo_metrics_db_complete_steps_only,
           *(s.hlo_metrics_db for s in out.step_db.step_sequence)]
    for db in dbs:
        ops = sorted(db.metrics_db, key=lambda m: (m.hlo_module_id, m.name))
        kept = [type(m)() for m in ops]
        for k, m in zip(kept, ops, strict=True):
            k.CopyFrom(m)
        del db.metrics_db[:]
        db.metrics_db.extend(kept)
    flat = sorted(out.flat_device_op_metrics_db.op_instances,
                  key=lambda m: m.SerializeToString(deterministic=True))
    kept_flat = [type(m)() for m in flat]
    for k, m in zip(kept_flat, flat, strict=True):
        k.CopyFrom(m)
    del out.flat_device_op_metrics_db.op_instances[:]
    out.flat_device_op_metrics_db.op_instances.extend(kept_flat)
    return bytes(out.SerializeToString(deterministic=True))


def _session(tmp: Path, files: dict[str, Path]) -> Path:
    run_dir = tmp / "session/plugins/profile/run1"
    run_dir.mkdir(parents=True)
    for host, src in files.items():
        shutil.copyfile(src, run_dir / f"{host}.xplane.pb")
    return run_dir


def _each_host(tmp: Path, run_dir: Path) -> list[Any]:
    """Each host's op_stats built alone, in xprof's host order (by file name)."""
    out = []
    for xplane in sorted(run_dir.glob("*.xplane.pb")):
        alone = tmp / f"alone-{xplane.name}/plugins/profile/run1"
        alone.mkdir(parents=True)
        shutil.copyfile(xplane, alone / xplane.name)
        out.append(xprof_op_stats(alone))
    return out


def _assert_equal(ours: Any, xprofs: Any) -> None:
    for name in ("step_db", "run_environment", "perf_env", "core_id_to_details",
                 "program_id_to_name_map", "performance_counter_result", "diagnostics",
                 "kernel_stats_db"):
        a, b = getattr(ours, name), getattr(xprofs, name)
        if hasattr(a, "SerializeToString"):
            assert _strip_ops(a) == _strip_ops(b), name
        else:
            assert dict(a) == dict(b), name
    if _normal(ours) != _normal(xprofs):
        import difflib

        from google.protobuf import text_format
        from xprof.protobuf import op_stats_pb2

        def text(o: Any) -> list[str]:
            n = op_stats_pb2.OpStats()
            n.ParseFromString(_normal(o))
            return str(text_format.MessageToString(n)).splitlines()

        diff = difflib.unified_diff(text(xprofs), text(ours), "xprof", "ours", lineterm="")
        pytest.fail("\n".join(list(diff)[:60]), pytrace=False)


def _strip_ops(m: Any) -> Any:
    """A step database without its per-step op metrics (compared in `_normal`), for a
    readable first difference."""
    from google.protobuf import text_format

    if m.DESCRIPTOR.name != "StepDatabaseResult":
        return text_format.MessageToString(m)
    copy = type(m)()
    copy.CopyFrom(m)
    for s in copy.step_sequence:
        s.ClearField("hlo_metrics_db")
        s.ClearField("flat_hlo_metrics_db")
    return text_format.MessageToString(copy)


@pytest.fixture(scope="module")
def tpu_hosts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three TPU hosts of one program: 4 copies of the fixture in time, 2 copies, and the
    second half of the first (cut between modules), which starts later."""
    team_fixture(TPU)
    tmp = tmp_path_factory.mktemp("tpu-hosts")
    four = _generate(tmp / "four", 4)
    two = _generate(tmp / "two", 2)
    halves = [tmp / "half0.xplane.pb", tmp / "half1.xplane.pb"]
    with XSpaceScan(four) as scan:
        shards.write_windows(scan, shards.module_cuts(scan, 2), halves)
    return {"host-a": four, "host-b": two, "host-c": halves[1]}


def test_tpu_hosts_combine_as_xprof_combines_them(tpu_hosts: dict[str, Path],
                                                  tmp_path: Path) -> None:
    run_dir = _session(tmp_path, tpu_hosts)
    xprofs = xprof_op_stats(run_dir)
    each = _each_host(tmp_path, run_dir)
    ours = hosts.combine_hosts(each)
    # An inference trace: xprof finds no steps on any host (the GPU test combines steps).
    assert not any(h.step_db.step_sequence for h in each)
    assert ours.run_environment.device_core_count == sum(
        h.run_environment.device_core_count for h in each)
    _assert_equal(ours, xprofs)


def test_hosts_whose_steps_do_not_meet_have_an_empty_intersection(
        tpu_hosts: dict[str, Path], tmp_path: Path) -> None:
    """The first half of one host beside the second half of another: no common step."""
    tmp = tmp_path / "split"
    tmp.mkdir()
    halves = [tmp / "a.xplane.pb", tmp / "b.xplane.pb"]
    with XSpaceScan(tpu_hosts["host-a"]) as scan:
        shards.write_windows(scan, shards.module_cuts(scan, 2), halves)
    run_dir = _session(tmp_path, {"early": halves[0], "late": halves[1]})
    xprofs = xprof_op_stats(run_dir)
    ours = hosts.combine_hosts(_each_host(tmp_path, run_dir))
    _assert_equal(ours, xprofs)


def test_gpu_hosts_combine_as_xprof_combines_them(tmp_path: Path) -> None:
    team_fixture(GPU)
    run_dir = _session(tmp_path, {"worker-0": GPU, "worker-1": GPU})
    xprofs = xprof_op_stats(run_dir)
    ours = hosts.combine_hosts(_each_host(tmp_path, run_dir))
    assert ours.kernel_stats_db.reports, "the GPU fixture has kernel reports to combine"
    _assert_equal(ours, xprofs)


def test_one_host_is_itself_and_none_is_an_error() -> None:
    from xprof.protobuf import op_stats_pb2

    one = op_stats_pb2.OpStats()
    one.run_environment.device_type = "TPU v6 lite"
    assert hosts.combine_hosts([one]) == one
    with pytest.raises(ValueError):
        hosts.combine_hosts([])


def test_step_alignment_follows_the_overlap_in_time() -> None:
    from xprof.protobuf import steps_db_pb2

    def db(*spans: tuple[int, int]) -> Any:
        out = steps_db_pb2.StepDatabaseResult()
        for n, (b, e) in enumerate(spans):
            out.step_sequence.add(step_num=n).step_info_per_core[0].CopyFrom(
                steps_db_pb2.StepInfoResult(step_num=n, begin_ps=b, duration_ps=e - b))
        return out

    long = db((0, 10), (10, 20), (20, 30), (30, 40))
    late = db((21, 29), (31, 39), (41, 49))  # the chief: its steps span the least time
    got = hosts.step_intersection({0: long, 1: late})
    assert (got.num_steps, got.first, got.empty) == (2, {0: 2, 1: 0}, False)


_STEPPED = """
import sys, time
import jax, jax.numpy as jnp
out, delay, steps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
f = jax.jit(lambda x: jnp.tanh(x @ x) / 8.0)
x = jnp.ones((128, 128)); f(x).block_until_ready()
start = float(sys.argv[4])
time.sleep(max(0.0, start - time.time()))
with jax.profiler.trace(out):
    time.sleep(delay)  # step times count from the capture's start
    for n in range(steps):
        with jax.profiler.StepTraceAnnotation("train", step_num=n):
            x = f(x); x.block_until_ready(); time.sleep(0.02)
"""


def test_stepped_hosts_align_their_steps_as_xprof_does(tmp_path: Path) -> None:
    """Two JAX processes traced at once, the second's steps starting about 3 steps into its
    capture, and fewer: xprof aligns the steps by their overlap in time (from each
    capture's start), and so does the combine."""
    import subprocess
    import time

    start = time.time() + 6.0
    procs = [subprocess.Popen([sys.executable, "-c", _STEPPED, str(tmp_path / name),
                               str(delay), str(steps), str(start)])
             for name, delay, steps in (("a", 0.0, 12), ("b", 0.07, 6))]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    files = {name: next((tmp_path / name).rglob("*.xplane.pb")) for name in ("a", "b")}
    run_dir = _session(tmp_path, files)
    xprofs = xprof_op_stats(run_dir)
    each = _each_host(tmp_path, run_dir)
    ours = hosts.combine_hosts(each)
    counts = [len(h.step_db.step_sequence) for h in each]
    assert min(counts) >= 4 and counts[0] > counts[1], counts
    assert 0 < len(ours.step_db.step_sequence) <= counts[1]
    assert hosts.step_intersection({0: each[0].step_db, 1: each[1].step_db}).first[0] > 0
    _assert_equal(ours, xprofs)
