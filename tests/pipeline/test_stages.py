"""The stages end to end through `bootstrap`: real SQLite, real bus workers, real files.

Each scenario drops the real TPU trace (or a broken one) into the bucket of a runtime built by
`bootstrap(Settings(...))` and checks what a user would see: session states and reasons, the
artifacts in `analysis/`, the bus's durable queue and its dead letters.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from mldiag.analysis.judgement.followups import FollowUps
from mldiag.analysis.judgement.investigator import RuleBasedInvestigator
from mldiag.analysis.judgement.triage import Triage
from mldiag.bootstrap import LocalRuntime
from mldiag.messages import (
    AnalyzeSession,
    CaptureProfile,
    ContinuousProfiling,
    Message,
    ProfileObjectFinalized,
)
from mldiag.model import (
    ANALYZING,
    CAPTURED,
    CAPTURING,
    FAILED,
    INVESTIGATING,
    REPORTED,
    SessionRecord,
    TargetRecord,
)
from mldiag.ports import ObjectInfo
from mldiag.stages import sweep
from tests.helpers.clock import SkewedClock
from tests.helpers.pipeline import (
    RUN,
    SESSION,
    MakeRuntime,
    analysis_dir,
    assert_reported_once,
    bus_messages,
    finalized_names,
    kinds,
    object_name,
    session_of,
    wait_state,
)
from tests.helpers.wait import wait_until


def hosts_of(rt: LocalRuntime, session: str = SESSION) -> set[str]:
    """The hosts registered so far (none before the session exists)."""
    s = rt.state.get_session(RUN, session)
    return set(s.hosts) if s is not None else set()


def snapshot_writes(rt: LocalRuntime, version: int = 1, session: str = SESSION) -> int:
    want = f"{session}/analysis/v{version}/health_snapshot.json"
    return sum(name.endswith(want) for name in finalized_names(rt.state))


class CountingInvestigator:
    """The rule-based investigator, counting its calls (and optionally always failing)."""

    name = "rule-based"

    def __init__(self, error: Exception | None = None) -> None:
        self.calls = 0
        self.error = error
        self._inner = RuleBasedInvestigator()
        self._lock = threading.Lock()

    def investigate(self, snapshot: Mapping[str, Any], triage: Triage,
                    follow_ups: FollowUps) -> dict[str, Any]:
        with self._lock:
            self.calls += 1
        if self.error is not None:
            raise self.error
        return self._inner.investigate(snapshot, triage, follow_ups)


class FlakyStorage:
    """Storage whose writes of `suffix` fail `times` times with OSError (a full disk, a GCS 503)."""

    def __init__(self, inner: Any, suffix: str, times: int = 1) -> None:
        self.inner, self.suffix, self.left = inner, suffix, times

    def write_bytes(self, name: str, data: bytes, **kw: Any) -> ObjectInfo:
        if name.endswith(self.suffix) and self.left > 0:
            self.left -= 1
            raise OSError(28, "No space left on device")
        result: ObjectInfo = self.inner.write_bytes(name, data, **kw)
        return result

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


class SlowStorage:
    """Storage whose downloads for a stage (`local_files`) take `delay_s` longer: a long
    collection or investigation, as a large profile gives."""

    def __init__(self, inner: Any, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s

    def local_files(self, *args: Any, **kw: Any) -> Any:
        time.sleep(self.delay_s)
        return self.inner.local_files(*args, **kw)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


class FlakyBus:
    """A bus whose publishes of one message kind fail `times` times (Pub/Sub DEADLINE_EXCEEDED)."""

    def __init__(self, inner: Any, kind: str, times: int = 1) -> None:
        self.inner, self.kind, self.left = inner, kind, times
        self._lock = threading.Lock()

    def publish(self, message: Message, attributes: Mapping[str, str] | None = None) -> str:
        with self._lock:
            fail = message.kind == self.kind and self.left > 0
            self.left -= fail
        if fail:
            raise TimeoutError(f"publish of {message.kind} timed out")
        result: str = self.inner.publish(message, attributes)
        return result


# The happy path, through the watcher


def test_a_file_dropped_in_the_bucket_is_reported(make_runtime: MakeRuntime,
                                                  xplane_bytes: bytes) -> None:
    rt = make_runtime()
    rt.start()
    path = rt.storage.root / object_name("tpu_inference_2")
    path.parent.mkdir(parents=True)
    path.write_bytes(xplane_bytes)  # from outside: the watcher turns it into an event
    wait_state(rt, REPORTED)
    assert_reported_once(rt)
    s = session_of(rt)
    run = rt.state.get_run(RUN)
    assert run is not None and run.discovered
    assert list(s.hosts) == ["tpu_inference_2"] and s.hosts["tpu_inference_2"].size == len(
        xplane_bytes)
    order = [CAPTURING, CAPTURED, ANALYZING, INVESTIGATING, REPORTED]
    times = [s.timings[state] for state in order]
    assert times == sorted(times), s.timings
    snapshot = json.loads((analysis_dir(rt) / "health_snapshot.json").read_text())
    assert snapshot["session"]["hosts"] == ["tpu_inference_2"]
    assert rt.wait_idle(30)
    assert rt.state.list_dead_letters() == []


def test_triage_runs_once_per_version_and_the_report_tells_its_story(
        make_runtime: MakeRuntime, xplane_bytes: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    # Collect triages, investigate and render read its triage.json back: the real triage,
    # counted, runs once for the version.
    from mldiag.stages import analysis as stage

    calls: list[int] = []
    real = stage.triage

    def counted(source: Any) -> Any:
        calls.append(1)
        return real(source)

    monkeypatch.setattr(stage, "triage", counted)
    rt = make_runtime()
    rt.start()
    rt.storage.write_bytes(object_name("h0"), xplane_bytes)
    wait_state(rt, REPORTED)
    assert rt.wait_idle(30)
    assert len(calls) == 1
    stored = json.loads((analysis_dir(rt) / "v1" / "triage.json").read_text())
    analysis = json.loads((analysis_dir(rt) / "analysis.json").read_text())
    assert stored["metrics"] == analysis["metrics"]
    assert [c["check"] for c in stored["checks"]] == [c["check"] for c in analysis["checks"]]
    # The verdict is the final list's, and the session record says the same.
    assert session_of(rt).verdict == analysis["status"] == "NEEDS_ATTENTION"
    assert analysis["summary"].startswith(
        f"This TPU v6 Lite profile (1 host(s)) needs attention: "
        f"{sum(f['priority'] == 'P0' for f in analysis['findings'])} P0")


# Idempotency


def test_fifty_duplicate_finalize_events_give_one_session_and_one_analysis(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    investigator = CountingInvestigator()
    rt = make_runtime(investigator=investigator)
    info = rt.storage.write_bytes(object_name("h0"), xplane_bytes)  # the first event
    duplicate = ProfileObjectFinalized(bucket=rt.storage.bucket, name=info.name,
                                       generation=info.generation, size=info.size)
    for _ in range(24):
        rt.bus.publish(duplicate)
    rt.start()
    # The rest arrive while the first are being handled, from several publishers at once.
    publishers = [threading.Thread(target=lambda: [rt.bus.publish(duplicate) for _ in range(5)])
                  for _ in range(5)]
    for t in publishers:
        t.start()
    for t in publishers:
        t.join(30)
    assert len(kinds(rt, "ProfileObjectFinalized")) >= 50
    wait_state(rt, REPORTED)
    assert rt.wait_idle(30)
    assert_reported_once(rt)
    assert [r.name for r in rt.state.list_runs()] == [RUN]
    assert [s.key for s in rt.state.list_sessions()] == [f"{RUN}/{SESSION}"]
    assert list(session_of(rt).hosts) == ["h0"]
    assert len(kinds(rt, "AnalyzeSession")) == 1
    assert snapshot_writes(rt) == 1
    assert investigator.calls == 1
    assert all(m["state"] == "done" for m in bus_messages(rt.state))


def test_fifty_duplicate_analysis_requests_give_one_collection(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    investigator = CountingInvestigator()
    rt = make_runtime(investigator=investigator)
    rt.state.ensure_run(RUN, discovered=False)
    # A capture request made the session and knows its hosts: no settle window needed.
    rt.state.create_session(SessionRecord(run=RUN, session=SESSION, state=CAPTURING,
                                          expected_hosts=["h0"], kind="on_demand"))
    rt.start()
    rt.storage.write_bytes(object_name("h0"), xplane_bytes)
    wait_state(rt, CAPTURED, ANALYZING, INVESTIGATING, REPORTED)
    for _ in range(49):
        rt.bus.publish(AnalyzeSession(run=RUN, session=SESSION, version=1))
    wait_state(rt, REPORTED)
    assert rt.wait_idle(30)
    assert_reported_once(rt)
    assert len(kinds(rt, "AnalyzeSession")) == 50
    assert snapshot_writes(rt) == 1
    assert investigator.calls == 1
    assert session_of(rt).kind == "on_demand"


# Faults


@pytest.mark.parametrize("suffix", ["health_snapshot.json", "triage.json",
                                    "investigation.json", "summary.html"])
def test_a_stage_failing_midway_is_retried_and_finishes(
        make_runtime: MakeRuntime, xplane_bytes: bytes, suffix: str) -> None:
    rt = make_runtime()
    flaky = FlakyStorage(rt.storage, f"v1/{suffix}")
    rt.services.storage = flaky  # type: ignore[assignment]
    rt.start()
    rt.storage.write_bytes(object_name("h0"), xplane_bytes)
    wait_state(rt, REPORTED)
    assert rt.wait_idle(30)
    assert flaky.left == 0, "the fault was never injected"
    assert_reported_once(rt)
    retried = [m for m in bus_messages(rt.state) if m["attempts"] > 1]
    assert len(retried) == 1 and retried[0]["attempts"] == 2
    assert "No space left on device" in retried[0]["last_error"]
    assert rt.state.list_dead_letters() == []


@pytest.mark.parametrize("kind", ["AnalyzeSession", "InvestigateSession", "RenderReport"])
def test_a_publish_failing_after_a_transition_does_not_strand_the_session(
        make_runtime: MakeRuntime, xplane_bytes: bytes, kind: str) -> None:
    # Each stage moves the session, then publishes the next message. If that publish fails,
    # the session must not be left in a state whose message was never sent (the sweeper's
    # deadline, 600 s by default, is far beyond the timeout here).
    rt = make_runtime()
    flaky = FlakyBus(rt.bus, kind)
    rt.services.bus = flaky  # type: ignore[assignment]
    rt.start()
    rt.storage.write_bytes(object_name("h0"), xplane_bytes)
    wait_state(rt, REPORTED, timeout=30)
    assert flaky.left == 0, "the fault was never injected"
    assert rt.wait_idle(30)
    assert_reported_once(rt)
    assert rt.state.list_dead_letters() == []


# Poison messages


def test_poison_messages_are_dead_lettered_with_their_reason(
        make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    rt.start()
    unsafe = ProfileObjectFinalized(bucket="local", generation="1", size=10,
                                    name="x/../run/plugins/profile/s/h.xplane.pb")
    sent = {
        ("analysis-requests", "{not json"): "poison message: not JSON",
        ("analysis-requests", AnalyzeSession(run="ghost", session="s", version=1).to_json()):
            "poison message: unknown run 'ghost'",
        ("report-requests", json.dumps({"run": "r", "session": "s"})):
            "poison message: RenderReport: missing field(s) version",
        ("profile-objects", unsafe.to_json()):
            "poison message: unsafe object name 'x/../run/plugins/profile/s/h.xplane.pb'",
        # The shared limits (mldiag.limits), with the message the CLI and the API give.
        ("capture-requests", CaptureProfile(run="r", session="s", duration_s=301).to_json()):
            "poison message: capture duration must be in (0, 300] s, not 301 s",
        ("capture-requests", ContinuousProfiling(run="r", action="start",
                                                 max_bytes=10**18).to_json()):
            "poison message: continuous max_bytes must be in [1.0 MiB, 64.00 GiB]",
    }
    for topic, payload in sent:
        rt.bus.publish_raw(topic, payload)
    dead = wait_until(lambda: len(rt.state.list_dead_letters()) == len(sent) and
                      rt.state.list_dead_letters(), what=f"{len(sent)} dead letters")
    assert [d["attempts"] for d in dead] == [1] * len(sent), "poison must not be retried"
    # Two workers deliver in parallel: match each letter to what was sent, not by order.
    for d in dead:
        assert d["reason"].startswith(sent[(d["topic"], d["payload"])]), d
    assert rt.state.list_runs() == [] and rt.state.list_sessions() == []


def test_a_poison_message_naming_a_session_fails_it_with_the_reason(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    rt = make_runtime()
    rt.state.ensure_run(RUN, discovered=False)
    rt.state.create_session(SessionRecord(run=RUN, session=SESSION, state=CAPTURING,
                                          expected_hosts=["h0", "h1"]))
    rt.start()
    rt.storage.write_bytes(object_name("h0"), xplane_bytes)
    wait_until(lambda: "h0" in hosts_of(rt), what="h0 registered")
    bad = {"kind": "AnalyzeSession", "run": RUN, "session": SESSION, "version": "one"}
    rt.bus.publish_raw("analysis-requests", json.dumps(bad))
    s = wait_state(rt, FAILED)
    (dead,) = rt.state.list_dead_letters()
    assert dead["reason"] == "poison message: AnalyzeSession.version: expected int, got 'one'"
    assert s.reason == dead["reason"]


def test_a_stage_that_keeps_failing_is_dead_lettered_and_fails_its_session(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    clock = SkewedClock()
    investigator = CountingInvestigator(error=RuntimeError("investigator crashed"))
    rt = make_runtime(investigator=investigator, clock=clock, stuck_after_s=60)
    rt.start()
    rt.storage.write_bytes(object_name("h0"), xplane_bytes)
    s = wait_state(rt, FAILED)
    assert investigator.calls == 3
    (dead,) = rt.state.list_dead_letters()
    assert dead["topic"] == "investigation-requests" and dead["attempts"] == 3
    assert dead["reason"] == "failed 3 times, last error: RuntimeError: investigator crashed"
    assert s.reason == dead["reason"]
    # No crash loop: past the sweeper's deadline nothing is re-queued.
    clock.advance(120)
    assert sweep(rt.services) == {"settled": 0, "requeued": 0, "failed": 0, "rescanned": 0,
                                  "list_fields": 0}
    assert rt.wait_idle(30)
    assert investigator.calls == 3 and len(rt.state.list_dead_letters()) == 1


# Bad profiles


def _truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


@pytest.mark.parametrize(("host", "make", "settings", "reason"), [
    ("h0.xplane.pb", lambda d: b"", {}, "h0: empty file (0 bytes)"),
    ("h0.xplane.pb", lambda d: b"\x00\xff not a protobuf " * 64, {},
     "h0.xplane.pb: not a readable XSpace"),
    ("h0.xplane.pb", _truncated, {}, "h0.xplane.pb: not a readable XSpace (truncated or corrupt"),
    ("h0.xplane.pb", lambda d: d, {"max_host_bytes": 100_000},
     "h0: 0.8 MiB exceeds the per-host cap of 0.1 MiB"),
    ("h0.xplane.pb", lambda d: d, {"max_session_bytes": 100_000},
     "the session's 1 host profile(s) hold 0.8 MiB, over the per-session cap of 0.1 MiB "
     "(MLDIAG_MAX_SESSION_BYTES)"),
    ("h0.xplane.riegeli", lambda d: d, {},
     "h0: cannot analyse .xplane.riegeli (continuous-profiling snapshot)"),
    ("h0.xplane.pb", lambda d: d, {"memory_budget": "64M"},
     "session of 0.8 MB (1 host(s)) needs about 0.34 GiB for xprof's op_stats build, over "
     "the memory budget of 0.06 GiB (MLDIAG_MEMORY_BUDGET)"),
], ids=["empty", "corrupt", "truncated", "oversized", "session-oversized", "riegeli",
        "over-budget"])
def test_a_bad_profile_fails_its_session_with_a_reason_and_no_retries(
        make_runtime: MakeRuntime, xplane_bytes: bytes, host: str, make: Any,
        settings: dict[str, Any], reason: str) -> None:
    rt = make_runtime(**settings)
    rt.start()
    rt.storage.write_bytes(f"{RUN}/plugins/profile/{SESSION}/{host}", make(xplane_bytes))
    s = wait_state(rt, FAILED)
    assert rt.wait_idle(30)
    assert reason in s.reason
    assert all(m["attempts"] == 1 and m["state"] == "done" for m in bus_messages(rt.state))
    assert rt.state.list_dead_letters() == []
    assert not (analysis_dir(rt) / "summary.html").exists()
    assert session_of(rt).state == FAILED


# Multi-host sessions and versions


def test_hosts_within_the_settle_window_form_one_session_and_later_ones_a_new_version(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    clock = SkewedClock()
    rt = make_runtime(clock=clock, settle_s=60)  # only the test's clock jumps settle it
    rt.start()
    rt.storage.write_bytes(object_name("h0"), xplane_bytes)
    rt.storage.write_bytes(object_name("h1"), xplane_bytes)
    wait_until(lambda: hosts_of(rt) == {"h0", "h1"}, what="both hosts registered")
    assert session_of(rt).state == CAPTURING
    clock.advance(60)
    wait_state(rt, REPORTED)
    assert_reported_once(rt)
    assert sorted(session_of(rt).hosts) == ["h0", "h1"]
    assert len(kinds(rt, "AnalyzeSession")) == 1
    snapshot = json.loads((analysis_dir(rt) / "health_snapshot.json").read_text())
    assert snapshot["session"]["hosts"] == ["h0", "h1"]

    # A third host after the report: version 2 covers all three, version 1 is kept.
    rt.storage.write_bytes(object_name("h2"), xplane_bytes)
    s = wait_state(rt, CAPTURING, version=2)
    assert s.reported_version == 1 and s.verdict is None
    clock.advance(60)
    wait_state(rt, REPORTED, version=2)
    assert_reported_once(rt, version=2)
    assert sorted(session_of(rt).hosts) == ["h0", "h1", "h2"]
    v2 = json.loads((analysis_dir(rt) / "v2/health_snapshot.json").read_text())
    assert v2["session"]["hosts"] == ["h0", "h1", "h2"]
    v1 = json.loads((analysis_dir(rt) / "v1/analysis.json").read_text())
    assert v1["session"]["version"] == 1
    assert [m["body"]["version"] for m in kinds(rt, "AnalyzeSession")] == [1, 2]
    # Version 1 is kept, marked superseded for the lifecycle (`mldiag gc` locally); nothing
    # of version 2, nor the latest copies, is.
    marks = rt.storage.superseded()
    names = [o.name for o in rt.storage.list("")]
    v1_names = {n for n in names if "/analysis/v1/" in n}
    assert v1_names and set(marks) == v1_names
    assert [n for n in names if "/analysis/v2/" in n]


class BlockingInvestigator(CountingInvestigator):
    """Holds its first call until the test lets it go, so a host can arrive mid-analysis."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def investigate(self, snapshot: Mapping[str, Any], triage: Triage,
                    follow_ups: FollowUps) -> dict[str, Any]:
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(60)
        return super().investigate(snapshot, triage, follow_ups)


def test_a_host_arriving_during_the_analysis_is_not_left_out(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    investigator = BlockingInvestigator()
    rt = make_runtime(investigator=investigator)
    rt.start()
    try:
        rt.storage.write_bytes(object_name("h0"), xplane_bytes)
        assert investigator.entered.wait(60), "the analysis never reached the investigator"
        assert session_of(rt).state == INVESTIGATING
        # A slow host lands after the settle window, while version 1 is being analysed.
        rt.storage.write_bytes(object_name("h1"), xplane_bytes)
        wait_until(lambda: "h1" in hosts_of(rt), what="h1 registered")
    finally:
        investigator.release.set()
    s = wait_state(rt, REPORTED, version=2)
    assert rt.wait_idle(30)
    assert_reported_once(rt, version=2)
    assert sorted(s.hosts) == ["h0", "h1"]
    for name in ("health_snapshot.json", "v2/health_snapshot.json"):
        snapshot = json.loads((analysis_dir(rt) / name).read_text())
        assert snapshot["session"]["hosts"] == ["h0", "h1"], name
        assert snapshot["session"]["version"] == 2


def test_a_session_is_analysed_as_soon_as_its_expected_hosts_arrive(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    rt = make_runtime(settle_s=3600)  # the settle window cannot be what completes it
    rt.state.ensure_run(RUN, discovered=False)
    rt.state.create_session(SessionRecord(run=RUN, session=SESSION, state=CAPTURING,
                                          expected_hosts=["h0", "h1"]))
    rt.start()
    rt.storage.write_bytes(object_name("h0"), xplane_bytes)
    wait_until(lambda: "h0" in hosts_of(rt), what="h0 registered")
    assert session_of(rt).state == CAPTURING
    rt.storage.write_bytes(object_name("h1"), xplane_bytes)
    wait_state(rt, REPORTED)
    assert_reported_once(rt)
    assert len(kinds(rt, "AnalyzeSession")) == 1


def test_a_new_session_waits_for_the_runs_registered_targets(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    rt = make_runtime(settle_s=3600)
    rt.state.ensure_run(RUN, discovered=False)
    for i, host in enumerate(("h0", "h1")):
        rt.state.upsert_target(TargetRecord(run=RUN, host=host, process_index=i,
                                            last_heartbeat=time.time()))
    # A target whose heartbeat stopped long ago (a previous job's process) is not waited for.
    rt.state.upsert_target(TargetRecord(run=RUN, host="gone", process_index=2,
                                        last_heartbeat=time.time() - 3600))
    rt.start()
    rt.storage.write_bytes(object_name("h0"), xplane_bytes)
    wait_until(lambda: "h0" in hosts_of(rt), what="h0 registered")
    assert session_of(rt).expected_hosts == ["h0", "h1"]
    assert session_of(rt).state == CAPTURING
    rt.storage.write_bytes(object_name("h1"), xplane_bytes)
    wait_state(rt, REPORTED)
    assert_reported_once(rt)


# Long stages, reused names, new versions


def test_stages_longer_than_their_lease_and_the_deadline_run_once(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    # Collection and investigation each take 1.5 s here, past the claim's lease (0.3 s) and
    # the sweeper's deadline (0.6 s): the claim is renewed and the session touched while
    # they work, so no redelivery takes the claim over and the sweeper re-queues nothing.
    rt = make_runtime(lease_s=0.3, stuck_after_s=0.6)
    rt.services.storage = SlowStorage(rt.storage, 1.5)  # type: ignore[assignment]
    rt.start()
    rt.storage.write_bytes(object_name("h0"), xplane_bytes)
    wait_state(rt, REPORTED, timeout=60)
    assert rt.wait_idle(30)
    assert_reported_once(rt)
    assert snapshot_writes(rt) == 1
    assert len(kinds(rt, "AnalyzeSession")) == 1 and len(kinds(rt, "InvestigateSession")) == 1
    assert session_of(rt).requeues == 0


def test_a_session_name_reused_under_another_prefix_is_rejected_not_merged(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    rt = make_runtime()
    rt.start()
    rt.storage.write_bytes(f"a/{object_name('h1')}", xplane_bytes)
    wait_state(rt, REPORTED)
    rt.storage.write_bytes(f"b/{object_name('h2')}", xplane_bytes)
    (dead,) = wait_until(rt.state.list_dead_letters, what="the other directory's dead letter")
    assert "already lives in a/myrun/plugins/profile/s1/" in dead["reason"]
    s = session_of(rt)
    assert s.state == REPORTED and s.version == 1 and sorted(s.hosts) == ["h1"]


def test_a_new_version_forgets_the_old_report_path(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    rt = make_runtime()
    rt.start()
    rt.storage.write_bytes(object_name("h0"), xplane_bytes)
    assert wait_state(rt, REPORTED).report_path
    rt.storage.write_bytes(object_name("h0"), b"\x00" * 5000)  # rewritten, now corrupt
    s = wait_state(rt, FAILED, version=2)
    assert s.report_path == "" and "not a readable XSpace" in s.reason


def test_a_large_host_s_state_says_how_many_time_windows_are_converted(
        make_runtime: MakeRuntime, tpu_eight_copies: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A host over the window threshold (here: any) is converted window by window, and the
    session's state says how far (`progress` "windows:<done>/<total>") while it runs."""
    from mldiag.analysis.collection import plan as plan_mod

    (xplane,) = tpu_eight_copies.glob("plugins/profile/*/*.xplane.pb")
    monkeypatch.setattr(plan_mod, "WINDOW_MIN_BYTES", 0)
    monkeypatch.setattr(plan_mod, "WINDOW_BYTES", xplane.stat().st_size // 4 + 1)
    rt = make_runtime()
    seen: list[str] = []
    transition = rt.state.transition

    def recording(*args: Any, **kwargs: Any) -> Any:
        out = transition(*args, **kwargs)
        if out is not None and str(kwargs.get("progress", "")).startswith("windows:"):
            seen.append(kwargs["progress"])
        return out

    monkeypatch.setattr(rt.state, "transition", recording)
    rt.start()
    rt.storage.write_bytes(object_name("h0"), xplane.read_bytes())
    wait_state(rt, REPORTED)
    assert seen == [f"windows:{k}/4" for k in range(1, 5)]
    snapshot = json.loads(rt.storage.read_bytes(
        f"{RUN}/plugins/profile/{SESSION}/analysis/health_snapshot.json"))
    assert snapshot["tools"]["get_xprof_overview"]["status"] == "DATA"
    # Combined exactly: recorded, and nothing degraded.
    assert snapshot["collection"]["op_stats_windows"] == 4
    assert snapshot["collection"]["degraded"] == []
