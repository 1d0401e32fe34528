"""The sweeper end to end through `bootstrap` (mldiag.stages.maintenance): a session stuck
past its deadline is re-queued, a restart resumes sessions left without a message, a profile
whose finalize event was lost is found by the rescan, and a stage that never finishes is failed
after its attempts."""

from __future__ import annotations

import json
import os

import pytest

from mldiag.analysis.collection.collect import collect as collect_snapshot
from mldiag.analysis.judgement.triage import triage
from mldiag.bootstrap import LocalRuntime
from mldiag.model import (
    ANALYZING,
    CAPTURED,
    CAPTURING,
    FAILED,
    INVESTIGATING,
    REPORTED,
    HostRecord,
)
from mldiag.stages import sweep
from tests.helpers.clock import SkewedClock
from tests.helpers.pipeline import (
    RUN,
    SESSION,
    MakeRuntime,
    analysis_dir,
    assert_reported_once,
    kinds,
    object_name,
    session_of,
    wait_state,
)


def _stranded_session(rt: LocalRuntime, xplane_bytes: bytes, state: str, at: float) -> None:
    """A session left in `state` with no message on the bus, as a crash could leave it."""
    finalize, rt.storage.on_finalize = rt.storage.on_finalize, None
    try:
        info = rt.storage.write_bytes(object_name("h0"), xplane_bytes)
    finally:
        rt.storage.on_finalize = finalize
    rt.state.ensure_run(RUN, discovered=True)
    rt.state.register_host(RUN, SESSION, "h0", HostRecord(
        object_name=info.name, generation=info.generation, size=info.size, arrived_at=at), at)
    assert rt.state.transition(RUN, SESSION, state, now=at) is not None


def test_the_sweeper_requeues_a_session_stuck_past_the_deadline(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    clock = SkewedClock()
    rt = make_runtime(clock=clock, stuck_after_s=300)
    rt.start()
    _stranded_session(rt, xplane_bytes, ANALYZING, clock())
    assert rt.wait_idle(0.5) is False  # stuck: nothing would move it before the deadline
    assert session_of(rt).state == ANALYZING and kinds(rt, "AnalyzeSession") == []
    clock.advance(301)
    wait_state(rt, REPORTED)
    assert_reported_once(rt)
    assert len(kinds(rt, "AnalyzeSession")) == 1, "re-queued more than once per deadline"


@pytest.mark.parametrize("state", [CAPTURED, ANALYZING, INVESTIGATING])
def test_a_restart_resumes_sessions_left_without_a_message(
        make_runtime: MakeRuntime, xplane_bytes: bytes, state: str) -> None:
    # A kill -9 between a stage's transition and its publish leaves such a session; the
    # sweeper's deadline (default 10 min) is far beyond this test's timeout.
    crashed = make_runtime()
    now = crashed.services.clock()
    _stranded_session(crashed, xplane_bytes, ANALYZING if state == INVESTIGATING else state,
                      now)
    if state == INVESTIGATING:
        # Collection finished just before the crash: its snapshot and progress are recorded.
        snapshot = collect_snapshot(analysis_dir(crashed).parent)
        crashed.storage.on_finalize = None
        for name in ("v1/health_snapshot.json", "health_snapshot.json"):
            crashed.storage.write_bytes(f"{RUN}/plugins/profile/{SESSION}/analysis/{name}",
                                        json.dumps(snapshot).encode())
        crashed.state.transition(RUN, SESSION, INVESTIGATING, now=now,
                                 progress=f"collected:{triage(snapshot).status}")
    restarted = make_runtime()
    restarted.start()
    wait_state(restarted, REPORTED, timeout=30)
    assert_reported_once(restarted)


def test_a_profile_whose_finalize_event_was_lost_is_found_by_the_rescan(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    clock = SkewedClock()
    rt = make_runtime(clock=clock, rescan_interval_s=3600, rescan_window_s=86400)
    emit, rt.storage.on_finalize = rt.storage.on_finalize, None  # these events are lost
    rt.storage.write_bytes(object_name("h0"), xplane_bytes)
    rt.storage.write_bytes(object_name("old", session="s0"), xplane_bytes)
    old = rt.services.settings.bucket_dir / object_name("old", session="s0")
    os.utime(old, (clock() - 2 * 86400, clock() - 2 * 86400))  # outside the window
    rt.storage.write_bytes(f"{RUN}/plugins/profile/{SESSION}/notes.txt", b"not a profile")
    rt.storage.on_finalize = emit
    assert rt.state.list_sessions() == []
    assert sweep(rt.services)["rescanned"] == 0, "too young: its event may be on its way"
    clock.advance(3600)

    assert sweep(rt.services)["rescanned"] == 1
    s = session_of(rt)
    assert s.state == CAPTURING and list(s.hosts) == ["h0"]  # settles like any drop
    assert sweep(rt.services)["rescanned"] == 0, "one rescan per interval"
    clock.advance(3600)
    assert sweep(rt.services)["rescanned"] == 0, "registered objects are not handed again"
    rt.start()
    wait_state(rt, REPORTED)


def test_a_stage_that_never_finishes_is_failed_after_max_attempts(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    # A stage killed for memory or past its timeout reports nothing: only the sweeper sees it.
    clock = SkewedClock()
    rt = make_runtime(clock=clock, stuck_after_s=60, max_attempts=3)
    _stranded_session(rt, xplane_bytes, ANALYZING, clock())
    for _ in range(3):
        clock.advance(61)
        assert sweep(rt.services)["requeued"] == 1
    clock.advance(61)
    assert sweep(rt.services)["requeued"] == 0
    s = session_of(rt)
    assert s.state == FAILED
    assert s.reason.startswith("the analyzing stage did not finish after 4 attempts")
