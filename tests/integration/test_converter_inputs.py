"""What large sessions give xprof's converters instead of the whole trace (the memory copies,
op_stats from the saved file, no conversion where the answer is known from the headers)
changes no tool's answer: the snapshot is the one the small-session path computes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mldiag.analysis.collection import collect as collect_mod
from mldiag.analysis.collection import jobs
from mldiag.analysis.collection import plan as plan_mod
from mldiag.analysis.collection.hosts import copies as host_copies
from mldiag.analysis.collection.profile_input import resolve_session
from mldiag.analysis.collection.xprof_tools import XprofWorkspace
from mldiag.analysis.collection.xspace.scan import XSpaceScan
from tests.helpers.fixtures import TPU_XPLANE as TPU
from tests.helpers.fixtures import team_fixture


def _fixture_copy(tmp_path: Path, rename_smart_events: bool = False) -> Path:
    team_fixture(TPU)
    run = tmp_path / "plugins/profile/run1"
    run.mkdir(parents=True)
    blob = TPU.read_bytes()
    if rename_smart_events:
        # The same trace without the events the smart suggestions time per step (same length,
        # so every protobuf length stays right).
        blob = blob.replace(b"barrier-cores", b"barrier-corez")
    (run / TPU.name).write_bytes(blob)
    return run


def _tools(snapshot: dict[str, Any]) -> dict[str, Any]:
    return {name: (t["status"], t.get("data"), t.get("error"))
            for name, t in snapshot["tools"].items()}


@pytest.mark.parametrize("smart_events", [True, False], ids=["barrier-cores", "none"])
def test_the_large_session_path_gives_the_small_session_path_s_snapshot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smart_events: bool) -> None:
    run = _fixture_copy(tmp_path, rename_smart_events=not smart_events)
    session = resolve_session(run)
    monkeypatch.setattr(plan_mod, "REDUCE_MIN_BYTES", 1 << 40)
    small = collect_mod.collect(session)
    monkeypatch.setattr(plan_mod, "REDUCE_MIN_BYTES", 0)
    large = collect_mod.collect(session)
    assert "reduce_for_converters" in large["collection"]["jobs"]
    assert "reduce_for_converters" not in small["collection"]["jobs"]
    assert _tools(large) == _tools(small)
    assert large["tools"]["get_memory_profile"]["status"] == "DATA"
    assert large["tools"]["get_smart_suggestions"]["status"] == "DATA"


def test_the_memory_copy_holds_only_what_the_memory_profile_reads(tmp_path: Path) -> None:
    run = _fixture_copy(tmp_path)
    session = resolve_session(run)
    with XprofWorkspace(session) as ws:
        ctx = jobs.Context(ws=ws, session=session)
        reduced = jobs.reduce_for_converters(ctx, {})
        part = reduced[session.hosts[0]]
        assert part["smart_events"] is True  # the fixture's TPU planes name barrier-cores
        assert 0 < part["memory_copy_bytes"] < TPU.stat().st_size / 2
        from_copy = jobs.memory_profile(ctx, {"reduced": reduced})
        whole = jobs.memory_profile(ctx, {})
        copy = ws.side_run_dir(host_copies.MEMORY_DIR) / TPU.name
        # What the smart suggestions time per step travels whole: every event they time
        # (with its stats, byte for byte) and the step and module lines.
        with XSpaceScan(TPU) as a, XSpaceScan(copy) as b:
            for pa, pb in zip(a.planes, b.planes, strict=True):
                ids = [k for k, v in pa.event_names.items()
                       if any(t in v for t in host_copies.SMART_EVENTS)]
                for la, lb in zip(pa.lines, pb.lines, strict=True):
                    if pa.name.startswith("/device:") and la.name in ("XLA Modules", "Steps"):
                        assert len(lb.events) == len(la.events) > 0
                    timed_a = np.isin(la.events.metadata_id, ids)
                    timed_b = np.isin(lb.events.metadata_id, ids)
                    assert timed_b.sum() == timed_a.sum()
                    assert [bytes(a.buf[s:e]) for s, e in zip(
                        la.events.tag_at[timed_a], la.events.body_end[timed_a], strict=True)] == [
                        bytes(b.buf[s:e]) for s, e in zip(
                            lb.events.tag_at[timed_b], lb.events.body_end[timed_b], strict=True)]
                assert pa.name.startswith("/host:") or not ids or any(
                    np.isin(lb.events.metadata_id, ids).any() for lb in pb.lines)
    assert from_copy == whole and whole["peak_memory_usage_gib"] > 0


def test_without_counters_the_utilization_viewer_answers_from_the_headers(
        tmp_path: Path) -> None:
    run = _fixture_copy(tmp_path)
    (xplane,) = run.glob("*.xplane.pb")
    assert not jobs.has_counters(xplane)
    session = resolve_session(run)
    with XprofWorkspace(session) as ws:
        # xprof's own converter, reading every event, says the same.
        with pytest.raises(jobs.NoData, match=jobs.NO_COUNTERS):
            ws.call("get_utilization_viewer")
        with pytest.raises(jobs.NoData, match=jobs.NO_COUNTERS):
            jobs.utilization_viewer(jobs.Context(ws=ws, session=session), {})


def test_a_tpu_plane_naming_the_counter_stat_is_converted(tmp_path: Path) -> None:
    from mldiag.sdk.xspace import XSpace

    space = XSpace()
    plane = space.planes.add(id=1, name="/device:TPU:0")
    plane.stat_metadata[7].id = 7
    plane.stat_metadata[7].name = jobs.COUNTER_VALUE_STAT
    path = tmp_path / "counters.xplane.pb"
    path.write_bytes(space.SerializeToString())
    assert jobs.has_counters(path)
