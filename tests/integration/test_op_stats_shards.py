"""One host's op_stats from two time windows of its trace, combined as one host, give xprof's
tools the whole trace's answers (the seam for converting a large host window by window)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from mldiag.analysis.collection.hosts import op_stats_shards as shards
from mldiag.analysis.collection.profile_input import resolve_session
from mldiag.analysis.collection.xprof_tools import NoData, XprofWorkspace
from mldiag.analysis.collection.xspace.host_activity import HostActivity
from mldiag.analysis.collection.xspace.scan import XSpaceScan
from tests.helpers.fixtures import REPO, team_fixture
from tests.helpers.fixtures import TPU_XPLANE as TPU
from tests.helpers.op_stats import xprof_op_stats

TOOLS = (("get_overview", {}), ("get_hlo_op_profile", {"top_n": 50}),
         ("get_roofline_model", {"top_n": 15}), ("get_step_trace", {"limit": 50}))


@pytest.fixture(scope="module")
def four_copies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The TPU fixture repeated 4 times in time (bench/tpu_shape.py), 3.2 MB."""
    team_fixture(TPU)
    sys.path.insert(0, str(REPO / "bench"))
    from tpu_shape import generate

    logdir = tmp_path_factory.mktemp("tpu4")
    generate(logdir, 4 * TPU.stat().st_size / 1024**2)
    (xplane,) = (logdir / "plugins/profile/run1").glob("*.xplane.pb")
    return xplane


def _tools(run_dir: Path, cache: Any = None) -> dict[str, Any]:
    with XprofWorkspace(resolve_session(run_dir)) as ws:
        if cache is not None:
            ws.adopt_op_stats(cache.SerializeToString())
        out: dict[str, Any] = {}
        for name, args in TOOLS:
            try:
                out[name] = ws.call(name, **args)
            except NoData as e:  # the step trace, on a trace without step markers
                out[name] = f"NoData: {e}".replace(str(ws.run_dir), "")
        return out


def _ops(db: Any) -> dict[tuple[int, str], bytes]:
    return {(m.hlo_module_id, m.name): m.SerializeToString(deterministic=True)
            for m in db.metrics_db}


def test_two_windows_combine_into_the_whole_host(four_copies: Path, tmp_path: Path) -> None:
    out = [tmp_path / f"w{k}/plugins/profile/run1" for k in range(2)]
    for d in out:
        d.mkdir(parents=True)
    with XSpaceScan(four_copies) as scan:
        cuts = shards.module_cuts(scan, 2)
        assert len(cuts) == 1
        host = HostActivity(scan, cuts)
        extents = shards.write_windows(scan, cuts, [d / four_copies.name for d in out],
                                       each_line=host.add)
    # Two copies each, cut between modules: the first window ends before the second starts.
    assert all(extents[0][p][1] < extents[1][p][0] for p in extents[0])
    whole = xprof_op_stats(four_copies.parent)
    combined = shards.combine([xprof_op_stats(d) for d in out], shards.seams(extents, host))
    # Device and host ops op by op (xprof's order of ops is a hash map's), totals, IDLE,
    # steps. The host's total runs from each host line's first activity to its last, across
    # the cut (1511e12 ps here, 520e12 in each window).
    assert host.total_time_ps() == whole.host_op_metrics_db.total_time_ps > 0
    assert host.inexact() == ""
    for db in ("device_op_metrics_db", "host_op_metrics_db"):
        assert _ops(getattr(combined, db)) == _ops(getattr(whole, db)), db
        for field in ("total_time_ps", "total_op_time_ps", "busy_time_ps", "idle_time_ps"):
            assert getattr(getattr(combined, db), field) == getattr(
                getattr(whole, db), field), (db, field)
    assert list(combined.step_db.step_sequence) == list(whole.step_db.step_sequence)
    for field in ("run_environment", "perf_env", "core_id_to_details",
                  "program_id_to_name_map"):
        assert getattr(combined, field) == getattr(whole, field), field
    # Handed to xprof through its op_stats file, the tools answer as from the whole trace.
    assert _tools(four_copies.parent, cache=combined) == _tools(four_copies.parent)


def test_adopted_op_stats_are_what_xprofs_tools_read(four_copies: Path) -> None:
    theirs = xprof_op_stats(four_copies.parent)
    theirs.run_environment.device_type = "TPU adopted"
    assert _tools(four_copies.parent, cache=theirs)["get_overview"]["run_environment"][
        "device_type"] == "TPU adopted"


@pytest.mark.parametrize("windows", [2, 4])
def test_a_host_over_the_threshold_is_collected_in_windows(
        four_copies: Path, monkeypatch: pytest.MonkeyPatch, windows: int) -> None:
    from mldiag.analysis.collection import collect as collect_mod
    from mldiag.analysis.collection import plan as plan_mod

    session = resolve_session(four_copies.parent)
    whole = collect_mod.collect(session)
    monkeypatch.setattr(plan_mod, "WINDOW_MIN_BYTES", 0)
    # The large-session path whole: the reduction and its memory copies, from which the
    # combined overview is read.
    monkeypatch.setattr(plan_mod, "REDUCE_MIN_BYTES", 0)
    monkeypatch.setattr(plan_mod, "WINDOW_BYTES",
                        four_copies.stat().st_size // windows + 1)
    assert plan_mod.op_stats_windows(session) == windows
    windowed = collect_mod.collect(session)
    # Combined exactly, the host database too: recorded, not degraded.
    assert windowed["collection"]["op_stats_windows"] == windows
    assert not [d for d in windowed["collection"]["degraded"] if "time windows" in d["reason"]]
    # Cut in one pass, each window built as a job of its own (the fourth in the second
    # worker, after its own passes), then combined.
    jobs = windowed["collection"]["jobs"]
    names = ("split_windows", *(f"op_stats_window{k}" for k in range(windows)), "op_stats")
    assert {k: jobs[k]["status"] for k in names} == dict.fromkeys(names, "DATA")
    for name in ("get_xprof_overview", "get_hlo_op_profile", "get_roofline_model",
                 "get_kpi_metrics", "get_step_trace", "list_hlo_modules",
                 "detect_layout_mismatch_copies", "get_smart_suggestions"):
        assert windowed["tools"][name]["status"] == whole["tools"][name]["status"], name
        assert windowed["tools"][name].get("data") == whole["tools"][name].get("data"), name


def test_a_task_writes_only_its_own_windows_byte_for_byte(four_copies: Path,
                                                           tmp_path: Path) -> None:
    """A collect-job task cuts only the windows it claimed (`keep`): each is the same file as
    in the cut of every window, and the extents (hence the idle between) are every window's."""
    every = [tmp_path / f"all{k}.pb" for k in range(3)]
    some = [tmp_path / "some2.pb", tmp_path / "some0.pb"]
    with XSpaceScan(four_copies) as scan:
        cuts = shards.module_cuts(scan, 3)
        assert len(cuts) == 2
        whole = shards.write_windows(scan, cuts, every)
        kept = shards.write_windows(scan, cuts, some, keep=[2, 0])
        with pytest.raises(ValueError, match="2 paths for 1 windows"):
            shards.write_windows(scan, cuts, some, keep=[1])
    assert some[0].read_bytes() == every[2].read_bytes()
    assert some[1].read_bytes() == every[0].read_bytes()
    assert kept == whole


def _without_times(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _without_times(v) for k, v in obj.items() if k != "elapsed_ms"}
    if isinstance(obj, list):
        return [_without_times(v) for v in obj]
    return obj


def test_a_large_host_s_timeline_from_its_windows_is_the_whole_file_s(
        four_copies: Path) -> None:
    """Our timeline pass measured window by window (in the window jobs) and combined, and
    the async-overlap follow-up in a pass of its own, give the whole file's answers."""
    from mldiag.analysis.collection.collect import collect

    windowed = collect(four_copies, window_min_bytes=1,
                       window_bytes=four_copies.stat().st_size // 2 + 1)
    whole = collect(four_copies)
    jobs = windowed["collection"]["jobs"]
    assert "op_stats_window1" in jobs and "async_overlap" in jobs
    assert "async_overlap" not in whole["collection"]["jobs"]
    assert _without_times(windowed["passes"]) == _without_times(whole["passes"])
    overlap = windowed["precomputed_follow_ups"]["analyze_async_overlap"]
    assert overlap == whole["precomputed_follow_ups"]["analyze_async_overlap"]
    assert overlap["data"]["summary"]["count"] > 0


def test_windows_measured_against_the_host_s_steps_add_up(four_copies: Path,
                                                          tmp_path: Path) -> None:
    """Steps that straddle a cut: each window measures its busy time inside the host's
    steps, and the sums are the whole file's (here five steps of equal length over the
    capture, two of them across the cut)."""
    import numpy as np

    from mldiag.analysis.collection.xspace import timeline

    with XSpaceScan(four_copies) as scan:
        whole0 = timeline.analyze_scan(scan, "h")
        cuts = shards.module_cuts(scan, 2)
        paths = [tmp_path / f"w{k}.xplane.pb" for k in range(2)]
        shards.write_windows(scan, cuts, paths)
    edges = np.linspace(whole0.active_from_ns, whole0.active_to_ns, 6)
    steps = (np.column_stack([edges[:-1], edges[1:]]), [])
    with XSpaceScan(four_copies) as scan:
        whole = timeline.analyze_scan(scan, "h", steps=steps)
    parts = []
    for path in paths:
        with XSpaceScan(path) as scan:
            parts.append(timeline.analyze_scan(scan, "h", steps=steps))
    assert all(p.busy_per_step_ns.sum() > 0 for p in parts)
    combined = timeline.combine_windows(parts)
    np.testing.assert_allclose(combined.busy_per_step_ns, whole.busy_per_step_ns, rtol=1e-12)
    assert combined.busy_per_step_ns.sum() > 0
    assert dict(combined.op_time_ns) == pytest.approx(dict(whole.op_time_ns), rel=1e-12)
    assert dict(combined.op_count) == dict(whole.op_count)
    assert dict(combined.op_lines) == dict(whole.op_lines)
    assert [(n, c) for n, _, c in combined.devices] == [(n, c) for n, _, c in whole.devices]
    assert [b for _, b, _ in combined.devices] == pytest.approx(
        [b for _, b, _ in whole.devices], rel=1e-12)
    assert combined.active_span_ns == whole.active_span_ns
    assert combined.busy_in_span_ns == pytest.approx(whole.busy_in_span_ns, rel=1e-12)
    assert timeline.summarize([combined]) == timeline.summarize([whole])


def test_long_lines_cut_chunk_by_chunk_give_the_same_windows(
        four_copies: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line over `_CHAIN_BYTES` is cut chunk by chunk (one chunk's columns held at a time):
    the windows, their extents and the host's steps are those of the line cut whole."""
    from mldiag.analysis.collection.xspace import scan as xspace_scan
    from mldiag.analysis.collection.xspace import timeline

    def cut(tag: str) -> tuple[list[bytes], Any, Any]:
        paths = [tmp_path / f"{tag}{k}.pb" for k in range(3)]
        with XSpaceScan(four_copies) as scan:
            host = timeline.HostSpans(scan)
            extents = shards.write_windows(scan, shards.module_cuts(scan, 3), paths,
                                           each_line=host.add)
            steps, excluded = host.host_steps()
        return [p.read_bytes() for p in paths], extents, (steps.tolist(), excluded)

    whole = cut("whole")
    monkeypatch.setattr(xspace_scan, "_CHAIN_BYTES", 2048)
    with XSpaceScan(four_copies) as scan:
        longest = max(ln._payload[1] - ln._payload[0] for p in scan.planes for ln in p.lines)
    assert longest > 20 * 2048, "no line long enough to be cut in chunks"
    assert cut("chunked") == whole
