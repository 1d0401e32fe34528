"""Alerts, the auto-capture policy and capture requests through the embedded runtime.

Targets here are registered records whose profiler port has nobody listening, so every
capture fails fast with "unreachable": these tests are about what gets captured and when; the
captures themselves run against real JAX processes in tests/e2e/test_capture_e2e.py.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from mldiag import stages
from mldiag.capture.alerts import parse_alert
from mldiag.errors import PoisonMessage
from mldiag.messages import CaptureProfile, DegradationDetected, ProfileObjectFinalized
from mldiag.model import (
    CAPTURED,
    CAPTURING,
    FAILED,
    AutoCapturePolicy,
    SessionRecord,
    TargetRecord,
)
from mldiag.sdk.monitor import StepTimeMonitor
from tests.helpers.clock import SkewedClock
from tests.helpers.pipeline import MakeRuntime, bus_messages
from tests.helpers.wait import wait_until

RUN = "train"

MONITORED_EVENT = {
    "analyzerReports": [
        {"analyzer": "Step Time Analyzer", "detectionState": "DETECTED",
         "details": "Step time regressed by 38% on 4 hosts"},
        {"analyzer": "ICI Link Analyzer", "detectionState": "NOT_DETECTED"},
    ],
    "displayName": "Performance degradation - 2026-11-29T12:00:00Z",
    "endTime": "2026-11-29T12:10:00Z",
    "name": f"projects/p/locations/us-central1/machineLearningRuns/{RUN}/monitoredEvents/e-42",
    "startTime": "2026-11-29T12:00:00Z",
    "type": "PERFORMANCE_DEGRADATION",
    "labels": {"target": "host-3"},
}

INCIDENT = {
    "incident": {
        "incident_id": "0.nxk2p9q",
        "scoping_project_id": "p",
        "url": "https://console.cloud.google.com/monitoring/alerting/incidents/0.nxk2p9q",
        "started_at": 1795953600,
        "ended_at": None,
        "state": "open",
        "summary": "step_time for train above 0.25 s for 5 minutes",
        "policy_name": "train step time",
        "condition_name": "step time high",
        "metric": {"type": "custom.googleapis.com/mldiag/step_time",
                   "displayName": "step time", "labels": {"run": RUN}},
        "resource": {"type": "generic_node", "labels": {"node_id": "host-0"}},
        "metadata": {"system_labels": {}, "user_labels": {}},
    },
    "version": "1.2",
}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Parsing


def test_a_workload_monitoring_event_parses_with_run_target_and_id() -> None:
    alert = parse_alert(json.dumps(MONITORED_EVENT))
    assert alert is not None
    assert (alert.run, alert.alert_id, alert.targets) == (RUN, "monitored-event:e-42",
                                                          ["host-3"])
    assert "Step Time Analyzer: Step time regressed by 38%" in alert.summary
    assert "ICI" not in alert.summary


def test_a_cloud_monitoring_incident_parses_and_a_closed_one_asks_for_nothing() -> None:
    alert = parse_alert(json.dumps(INCIDENT).encode())
    assert alert is not None
    assert (alert.run, alert.alert_id, alert.source) == (RUN, "incident:0.nxk2p9q",
                                                         "cloud-monitoring")
    closed = {"incident": {**INCIDENT["incident"], "state": "closed"}, "version": "1.2"}
    assert parse_alert(closed) is None
    nothing = {**MONITORED_EVENT, "analyzerReports": [{"detectionState": "NOT_DETECTED"}]}
    assert parse_alert(nothing) is None


def test_our_own_alert_message_round_trips() -> None:
    sent = DegradationDetected(alert_id="m1", run=RUN, summary="slow", targets=["h0"])
    assert parse_alert(sent.to_json()) == sent


@pytest.mark.parametrize("payload, reason", [
    (b"\xff\xfe", "not JSON"),
    ("[1, 2]", "JSON object"),
    ('{"hello": "world"}', "unrecognised alert"),
    (json.dumps({**MONITORED_EVENT, "type": "HARDWARE_FAILURE"}), "PERFORMANCE_DEGRADATION"),
    (json.dumps({**MONITORED_EVENT, "name": "x", "labels": {}}), "names no run"),
    (json.dumps({"incident": {"incident_id": "i", "state": "open"}}), "names no run"),
])
def test_bad_alerts_are_poison_with_the_reason(payload: str | bytes, reason: str) -> None:
    with pytest.raises(PoisonMessage, match=reason):
        parse_alert(payload)


# Auto-capture policy


def _run_with_target(rt: object, **policy: object) -> None:
    from mldiag.bootstrap import LocalRuntime
    assert isinstance(rt, LocalRuntime)
    rt.state.ensure_run(RUN, discovered=False)
    rt.state.upsert_target(TargetRecord(run=RUN, host="h0", port=closed_port(),
                                        last_heartbeat=time.time() + 3600))
    rt.state.set_auto_capture(RUN, AutoCapturePolicy(**policy).to_dict())  # type: ignore[arg-type]


def test_an_alert_storm_gives_one_capture(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    _run_with_target(rt, enabled=True, kind="on_demand", duration_s=0.5, cooldown_s=300)
    rt.start()
    for i in range(100):  # 100 distinct alerts within a second, each delivered twice
        alert = DegradationDetected(alert_id=f"storm-{i}", run=RUN, summary="slow")
        rt.services.bus.publish(alert)
        rt.services.bus.publish(alert)
    assert rt.wait_idle(timeout=60)
    captures = [m for m in bus_messages(rt.state, "capture-requests")]
    assert len(captures) == 1
    (session,) = rt.state.list_sessions(run=RUN)
    assert (session.trigger, session.kind, session.request_id) == (
        "alert", "on_demand", captures[0]["body"]["request_id"])
    # The one capture ran: its only target is down, so it failed with that reason.
    assert session.state == FAILED and "every target failed" in session.reason
    assert "unreachable" in session.reason


def test_the_hourly_cap_limits_captures_even_without_a_cooldown(
        make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    _run_with_target(rt, enabled=True, kind="on_demand", duration_s=0.5, cooldown_s=0,
                     max_per_hour=3)
    # The bus is not started: the captures asked for have not run (nor failed) yet.
    for i in range(10):
        stages.on_degradation_alert(DegradationDetected(alert_id=f"a{i}", run=RUN),
                                    rt.services)
    assert len(bus_messages(rt.state, "capture-requests")) == 3


def test_failed_automatic_captures_give_their_quota_back(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    _run_with_target(rt, enabled=True, kind="on_demand", duration_s=0.5, cooldown_s=0,
                     max_per_hour=1)
    rt.start()
    for i in range(3):  # one at a time: each capture fails (nobody listens) before the next
        rt.services.bus.publish(DegradationDetected(alert_id=f"a{i}", run=RUN))
        assert rt.wait_idle(timeout=60)
    sessions = rt.state.list_sessions(run=RUN)
    assert len(sessions) == 3 and all(s.state == FAILED for s in sessions)
    # Without the give-back, the hourly cap of 1 would have stopped the second.
    assert len(bus_messages(rt.state, "capture-requests")) == 3


def test_a_disabled_policy_captures_nothing_and_an_unknown_run_is_dead_lettered(
        make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    _run_with_target(rt, enabled=False)
    rt.start()
    rt.services.bus.publish(DegradationDetected(alert_id="a1", run=RUN))
    rt.services.bus.publish(DegradationDetected(alert_id="a2", run="ghost"))
    assert rt.wait_idle(timeout=30)
    assert bus_messages(rt.state, "capture-requests") == []
    (dead,) = rt.state.list_dead_letters()
    assert "unknown run 'ghost'" in dead["reason"]


@pytest.mark.parametrize("payload, alert_id", [
    (MONITORED_EVENT, "monitored-event:e-42"),
    (INCIDENT, "incident:0.nxk2p9q"),
    ({"kind": "DegradationDetected", "alert_id": "ours-1", "run": RUN}, "ours-1"),
    # Published by another tool without `kind`: the topic says what it is.
    ({"alert_id": "bare-1", "run": RUN}, "bare-1"),
])
def test_every_alert_format_starts_a_capture_on_the_local_alerts_topic(
        make_runtime: MakeRuntime, payload: dict[str, object], alert_id: str) -> None:
    rt = make_runtime()
    _run_with_target(rt, enabled=True, kind="on_demand", duration_s=0.5)
    rt.start()
    rt.bus.publish_raw("degradation-alerts", json.dumps(payload))
    assert rt.wait_idle(timeout=30)
    assert rt.state.list_dead_letters() == []
    (capture,) = bus_messages(rt.state, "capture-requests")
    assert capture["body"]["request_id"] == f"alert:{alert_id}"


def test_alerts_that_ask_for_nothing_or_name_nothing_on_the_local_topic(
        make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    _run_with_target(rt, enabled=True, kind="on_demand", duration_s=0.5)
    rt.start()
    closed = {"incident": {**INCIDENT["incident"], "state": "closed"}, "version": "1.2"}
    rt.bus.publish_raw("degradation-alerts", json.dumps(closed))
    rt.bus.publish_raw("degradation-alerts", json.dumps({"hello": "world"}))
    assert rt.wait_idle(timeout=30)
    assert bus_messages(rt.state, "capture-requests") == []
    (dead,) = rt.state.list_dead_letters()
    assert "unrecognised alert" in dead["reason"]


def test_auto_kind_snapshots_when_continuous_profiling_is_on(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    _run_with_target(rt, enabled=True, kind="auto", duration_s=1.0)
    (target,) = rt.state.list_targets(RUN)
    rt.state.update_target(RUN, target.host, target.port, continuous="RING")
    rt.start()
    rt.services.bus.publish(DegradationDetected(alert_id="a1", run=RUN))
    wait_until(lambda: bus_messages(rt.state, "capture-requests"), what="a capture request")
    assert bus_messages(rt.state, "capture-requests")[0]["body"]["capture"] == "snapshot"


# Capture requests


def test_a_capture_request_for_a_run_without_targets_is_a_failed_session(
        make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    rt.state.ensure_run(RUN, discovered=False)
    rt.start()
    rt.services.bus.publish(CaptureProfile(run=RUN, session="c1"))
    s = wait_until(lambda: rt.state.get_session(RUN, "c1"), what="session c1")
    assert s.state == FAILED and "no live profiler targets" in s.reason


def test_a_capture_request_naming_an_existing_session_does_not_touch_it(
        make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    _run_with_target(rt)
    # A programmatic session still waiting for its host (the SDK created it).
    rt.state.create_session(SessionRecord(run=RUN, session="prog", state=CAPTURING,
                                          kind="programmatic", expected_hosts=["h0"],
                                          created_at=time.time(), updated_at=time.time()))
    rt.start()
    rt.services.bus.publish(CaptureProfile(run=RUN, session="prog", duration_s=0.2))
    wait_until(rt.state.list_dead_letters, what="the colliding request to be dead-lettered")
    assert "already exists" in rt.state.list_dead_letters()[0]["reason"]
    s = rt.state.get_session(RUN, "prog")
    assert s is not None and s.state == CAPTURING and s.reason == ""


def test_a_redelivered_alert_whose_publish_failed_still_gets_its_capture(
        make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    _run_with_target(rt, enabled=True, kind="on_demand", cooldown_s=300)
    real_publish, calls = rt.services.bus.publish, []

    def flaky(message: object, attributes: object = None) -> str:
        calls.append(message)
        if isinstance(message, CaptureProfile) and len(calls) == 1:
            raise ConnectionError("pubsub down")
        return real_publish(message)  # type: ignore[arg-type]

    rt.services.bus.publish = flaky  # type: ignore[method-assign]
    alert = DegradationDetected(alert_id="a1", run=RUN)
    with pytest.raises(ConnectionError):
        stages.on_degradation_alert(alert, rt.services)
    stages.on_degradation_alert(alert, rt.services)  # the redelivery
    (capture,) = bus_messages(rt.state, "capture-requests")
    assert capture["body"]["session"] == "auto-" + capture["body"]["session"][5:]
    # Another alert inside the cooldown still gets nothing.
    stages.on_degradation_alert(DegradationDetected(alert_id="a2", run=RUN), rt.services)
    assert len(bus_messages(rt.state, "capture-requests")) == 1


def test_the_sweeper_fails_a_capture_that_never_produced_anything(
        make_runtime: MakeRuntime) -> None:
    clock = SkewedClock()
    rt = make_runtime(clock=clock, stuck_after_s=60)
    rt.state.ensure_run(RUN, discovered=False)
    now = clock()
    rt.state.create_session(SessionRecord(run=RUN, session="lost", state=CAPTURING,
                                          kind="on_demand", expected_hosts=["h0", "h1"],
                                          created_at=now, updated_at=now))
    assert stages.sweep(rt.services)["failed"] == 0
    clock.advance(61)
    assert stages.sweep(rt.services)["failed"] == 1
    s = rt.state.get_session(RUN, "lost")
    assert s is not None and s.state == FAILED and "no host's profile arrived" in s.reason


def test_the_sweeper_records_the_hosts_that_never_arrived(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    clock = SkewedClock()
    rt = make_runtime(clock=clock, stuck_after_s=60)
    rt.state.ensure_run(RUN, discovered=False)
    now = clock()
    rt.state.create_session(SessionRecord(run=RUN, session="half", state=CAPTURING,
                                          kind="on_demand", expected_hosts=["h0", "h1"],
                                          created_at=now, updated_at=now))
    name = f"{RUN}/plugins/profile/half/h0.xplane.pb"
    info = rt.storage.write_bytes(name, xplane_bytes)
    stages.on_profile_object(ProfileObjectFinalized(
        bucket=rt.storage.bucket, name=name, generation=info.generation, size=info.size),
        rt.services)
    clock.advance(61)
    assert stages.sweep(rt.services)["settled"] == 1
    s = rt.state.get_session(RUN, "half")
    assert s is not None and s.state == CAPTURED
    assert s.hosts["h1"].status == "FAILED" and "did not arrive" in s.hosts["h1"].reason


@pytest.mark.parametrize("body, reason", [
    ({"kind": "CaptureProfile", "run": "ghost", "session": "s"}, "unknown run"),
    ({"kind": "CaptureProfile", "run": RUN, "session": "s", "capture": "x"}, "on_demand or"),
    ({"kind": "CaptureProfile", "run": RUN, "session": "../s"}, "bad session name"),
    ({"kind": "CaptureProfile", "run": RUN, "session": "s", "targets": ["nope"]},
     "no target(s) nope"),
    ({"kind": "CaptureProfile", "run": RUN, "session": "s", "duration_s": -1}, "duration"),
    ({"kind": "ContinuousProfiling", "run": RUN, "action": "pause"}, "start or stop"),
])
def test_bad_capture_requests_are_dead_lettered_with_the_reason(
        make_runtime: MakeRuntime, body: dict[str, object], reason: str) -> None:
    rt = make_runtime()
    _run_with_target(rt)
    rt.start()
    rt.bus.publish_raw("capture-requests", json.dumps(body))
    wait_until(rt.state.list_dead_letters, what="a dead letter")
    (dead,) = rt.state.list_dead_letters()
    assert reason in dead["reason"]


# The SDK's step-time monitor


def test_the_monitor_alerts_once_per_sustained_degradation_and_rearms() -> None:
    alerts = []
    m = StepTimeMonitor(alerts.append, warmup=2, min_baseline=10, recent=5, sustain_s=3.0)
    t = 0.0
    for _ in range(40):  # healthy: 10 ms steps with jitter
        t += 0.01
        m.observe(0.010 + (0.001 if int(t * 100) % 2 else 0.0), t)
    for _ in range(5):  # one slow checkpoint step is not a degradation
        t += 0.01
        m.observe(0.5 if _ == 0 else 0.010, t)
    assert alerts == []
    for _ in range(200):  # degraded by 50% for 4 s
        t += 0.02
        m.observe(0.015, t)
    assert len(alerts) == 1
    assert alerts[0].baseline_s == pytest.approx(0.0105, abs=0.001)
    assert alerts[0].at - alerts[0].since >= 3.0
    # Its baseline says what it is: the demo's alert and its diff quote two baselines.
    assert "above the baseline 10.0 ms (the running median of recorded step times)" in (
        alerts[0].summary()), alerts[0].summary()
    for _ in range(50):  # recovery, then a second episode alerts again
        t += 0.01
        m.observe(0.010, t)
    for _ in range(200):
        t += 0.02
        m.observe(0.02, t)
    assert len(alerts) == 2


def test_the_monitor_does_not_learn_a_degradation_as_its_baseline() -> None:
    m = StepTimeMonitor(lambda d: None, warmup=0, min_baseline=5, recent=3, sustain_s=1000)
    for i in range(20):
        m.observe(0.01, i * 0.01)
    for i in range(500):
        m.observe(0.05, 1 + i * 0.05)
    assert m.baseline_s == pytest.approx(0.01)
