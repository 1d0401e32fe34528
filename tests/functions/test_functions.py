"""The Cloud Functions, posted real CloudEvents through functions-framework."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import functions_framework
import pytest

from mldiag import entrypoints
from mldiag.model import ANALYZING, CAPTURING, FAILED, REPORTED
from tests.functions.conftest import (
    FUNCTIONS,
    XPLANE_NAME,
    Pipeline,
    post,
    pubsub_event,
    storage_event,
)

ANALYSIS = "run1/plugins/profile/s1/analysis"


def test_finalize_of_a_real_xplane_creates_the_run_and_its_session(pipeline: Pipeline):
    size = pipeline.drop_xplane()

    response = pipeline.post("on_profile_object", storage_event(XPLANE_NAME, size=size))

    assert response.status_code == 200
    state = pipeline.services.state
    run = state.get_run("run1")
    assert run is not None and run.discovered
    session = state.get_session("run1", "s1")
    assert session is not None and session.state == CAPTURING
    assert list(session.hosts) == ["host0"]
    assert session.hosts["host0"].status == "ARRIVED"
    assert session.hosts["host0"].size == size == 862_707
    assert session.hosts["host0"].generation == "1767225600123456"
    assert state.list_dead_letters() == []


def test_the_published_messages_drive_the_session_to_its_report(pipeline: Pipeline):
    size = pipeline.drop_xplane()
    pipeline.post("on_profile_object", storage_event(XPLANE_NAME, size=size), mode="structured")

    assert pipeline.sweep()["settled"] == 1  # no expected hosts: the settle window decides
    pipeline.drain()

    session = pipeline.services.state.get_session("run1", "s1")
    assert session is not None and session.state == REPORTED, session
    # The TPU trace spends most of its time in copy-done: triage sends it to investigation.
    assert session.verdict == "NEEDS_ATTENTION"
    html = pipeline.bucket / ANALYSIS / "summary.html"
    assert html.is_file() and html.read_text().lstrip().lower().startswith("<!doctype html")
    assert session.report_path == html.resolve().as_uri()
    analysis = json.loads((pipeline.bucket / ANALYSIS / "analysis.json").read_text())
    assert analysis["status"] == "NEEDS_ATTENTION" and analysis["findings"]
    assert (pipeline.bucket / ANALYSIS / "investigation.json").is_file()
    # Each stage ran once, in its own function, and acknowledged its message.
    assert pipeline.pubsub.kinds() == ["AnalyzeSession", "InvestigateSession", "RenderReport",
                                       "PrebuildViewer"]
    stage_runs = [(d.function, d.status) for d in pipeline.deliveries
                  if d.function != "on_profile_object"]
    assert stage_runs == [("collect", 200), ("investigate", 200), ("render_report", 200),
                          ("prebuild_viewer", 200)]
    # After the report, the XProf viewer's caches of this version were built into the bucket.
    manifests = list((pipeline.bucket / "xprof-cache" / ANALYSIS).glob("*/manifest.json"))
    assert len(manifests) == 1
    built = json.loads(manifests[0].read_text())["built"]
    assert any("trace_viewer" in b for b in built) and any("overview_page" in b for b in built)
    # The artifacts' own finalize events reached on_profile_object and were ignored.
    artifacts = [d for d in pipeline.deliveries if d.function == "on_profile_object"][1:]
    assert artifacts and {d.status for d in artifacts} == {200}
    assert [s.session for s in pipeline.services.state.list_sessions()] == ["s1"]
    assert pipeline.services.state.list_dead_letters() == []


@pytest.mark.parametrize("name", [
    "run1/notes.txt",
    "run1/plugins/profile/s1/analysis/summary.html",
    "run1/plugins/profile/s1/host0.trace.json.gz",
])
def test_a_finalize_for_a_non_profile_object_is_ignored(pipeline: Pipeline, name: str):
    response = pipeline.post("on_profile_object", storage_event(name, size=1234))

    assert response.status_code == 200
    assert pipeline.services.state.list_runs() == []
    assert pipeline.services.state.list_sessions() == []
    assert pipeline.services.state.list_dead_letters() == []
    assert pipeline.pubsub.published == []


@pytest.mark.parametrize("name", ["host0.xplane.pb", "run1/host0.xplane.pb",
                                  "run1/plugins/profile/s1/sub/host0.xplane.pb"])
def test_a_profile_outside_a_session_directory_is_a_dead_letter(pipeline: Pipeline, name: str):
    response = pipeline.post("on_profile_object", storage_event(name, size=1234))

    assert response.status_code == 200
    assert pipeline.services.state.list_sessions() == []
    (dead,) = pipeline.services.state.list_dead_letters()
    assert name in dead["reason"] and "not in a session directory" in dead["reason"]


def test_fifty_duplicate_finalize_events_give_one_session_and_one_analysis(pipeline: Pipeline):
    size = pipeline.drop_xplane()
    # Redeliveries keep the event id; a second notification of the same generation does not.
    events = [storage_event(XPLANE_NAME, size=size, event_id=f"1681423193840923{i % 2}")
              for i in range(50)]
    modes = ["binary", "structured"] * 25

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(
            lambda em: post(pipeline.clients["on_profile_object"], em[0], mode=em[1])
            .status_code, zip(events, modes, strict=True)))
    pipeline.sweep()
    pipeline.sweep()

    assert statuses == [200] * 50
    sessions = pipeline.services.state.list_sessions()
    assert [(s.run, s.session) for s in sessions] == [("run1", "s1")]
    assert list(sessions[0].hosts) == ["host0"]
    assert pipeline.pubsub.kinds() == ["AnalyzeSession"]


@pytest.mark.parametrize(("payload", "function", "reason"), [
    ("this is not JSON{", "collect", "not JSON"),
    (b"\xff\xfe\x00garbage", "collect", "not JSON"),
    ('["AnalyzeSession"]', "collect", "expected a JSON object"),
    ('{"kind": "CaptureEverything", "run": "run1"}', "collect", "unknown message kind"),
    ('{"kind": "AnalyzeSession", "run": "ghost", "session": "s1", "version": 1}', "collect",
     "unknown run 'ghost'"),
    ('{"kind": "AnalyzeSession", "run": "run1", "session": "s1"}', "collect",
     "missing field(s) version"),
    ('{"kind": "RenderReport", "run": "run1", "session": "s1", "version": 1}', "collect",
     "RenderReport delivered to the AnalyzeSession function"),
    ('{"kind": "InvestigateSession", "run": "nope", "session": "s1", "version": 1}',
     "investigate", "unknown run 'nope'"),
    ('{"kind": "RenderReport", "run": "nope", "session": "s1", "version": 1}',
     "render_report", "unknown run 'nope'"),
])
def test_a_poison_pubsub_message_is_dead_lettered_and_acknowledged(
        pipeline: Pipeline, payload: bytes | str, function: str, reason: str):
    event = pubsub_event(payload, "analysis-requests")

    response = pipeline.post(function, event)

    assert 200 <= response.status_code < 300
    [dead] = pipeline.services.state.list_dead_letters()
    assert reason in dead["reason"] and dead["reason"].startswith("poison message: ")
    assert dead["topic"] == "analysis-requests"
    # The payload as published: its text, or its base64 when it is not text.
    published = payload if isinstance(payload, str) else event["data"]["message"]["data"]
    assert dead["payload"] == published
    assert pipeline.pubsub.published == []


def test_a_message_without_kind_is_typed_by_the_function_that_receives_it(pipeline: Pipeline):
    # Topic names in a deployment may carry a prefix; the function still knows its type.
    body = '{"run": "ghost", "session": "s1", "version": 1}'
    response = pipeline.post("collect", pubsub_event(body, "prod-analysis-requests"))

    assert response.status_code == 200
    [dead] = pipeline.services.state.list_dead_letters()
    assert dead["topic"] == "prod-analysis-requests" and "unknown run 'ghost'" in dead["reason"]


@pytest.mark.parametrize(("mutate", "reason"), [
    (lambda e: e["data"]["message"].update(data="%%% not base64 %%%"), "not base64"),
    (lambda e: e["data"]["message"].pop("data"), "message.data missing"),
    (lambda e: e["data"].pop("message"), "no message object"),
    (lambda e: e.update(type="google.cloud.storage.object.v1.finalized"),
     "expected a google.cloud.pubsub.topic.v1.messagePublished CloudEvent"),
])
def test_a_malformed_pubsub_envelope_is_dead_lettered(pipeline: Pipeline, mutate, reason: str):
    event = pubsub_event('{"kind": "AnalyzeSession"}', "analysis-requests")
    mutate(event)

    response = pipeline.post("collect", event)

    assert response.status_code == 200
    [dead] = pipeline.services.state.list_dead_letters()
    assert reason in dead["reason"]


@pytest.mark.parametrize(("mutate", "reason"), [
    (lambda e: e["data"].pop("name"), "name missing"),
    (lambda e: e["data"].update(size="lots"), "not a byte count"),
    (lambda e: e["data"].update(name="run1/plugins/profile/../host0.xplane.pb"),
     "unsafe object name"),
    (lambda e: e.update(type="google.cloud.storage.object.v1.deleted"),
     "expected a google.cloud.storage.object.v1.finalized CloudEvent"),
])
def test_a_malformed_storage_event_is_dead_lettered(pipeline: Pipeline, mutate, reason: str):
    event = storage_event(XPLANE_NAME, size=862_707)
    mutate(event)

    response = pipeline.post("on_profile_object", event)

    assert response.status_code == 200
    [dead] = pipeline.services.state.list_dead_letters()
    assert reason in dead["reason"] and dead["topic"] == "profile-objects"
    assert pipeline.services.state.list_sessions() == []


class FlakyStorage:
    """The bucket, failing the first `failures` downloads like a dropped connection."""

    def __init__(self, inner: object, failures: int = 1) -> None:
        self.inner = inner
        self.failures = failures

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def local_files(self, names, **pins):
        if self.failures:
            self.failures -= 1
            raise OSError(104, "Connection reset by peer")
        return self.inner.local_files(names, **pins)


def test_a_transient_failure_answers_5xx_and_the_redelivery_succeeds(pipeline: Pipeline):
    size = pipeline.drop_xplane()
    pipeline.post("on_profile_object", storage_event(XPLANE_NAME, size=size))
    pipeline.sweep()
    pipeline.services.storage = FlakyStorage(pipeline.services.storage)
    [analyze] = list(pipeline.pubsub.queue)
    event = pubsub_event(analyze.payload, analyze.topic, message_id=analyze.message_id)

    failed = pipeline.post("collect", event)

    assert failed.status_code == 500  # Pub/Sub will redeliver
    session = pipeline.services.state.get_session("run1", "s1")
    assert session is not None and session.state == ANALYZING and session.reason == ""
    assert pipeline.services.state.list_dead_letters() == []

    pipeline.drain()  # the same AnalyzeSession first, as Pub/Sub redelivers it

    assert pipeline.deliveries[2].function == "collect"
    assert pipeline.deliveries[2].status == 200
    session = pipeline.services.state.get_session("run1", "s1")
    assert session is not None and session.state == REPORTED
    assert (pipeline.bucket / ANALYSIS / "summary.html").is_file()
    assert pipeline.services.state.list_dead_letters() == []


def test_a_delivery_that_keeps_failing_is_given_up_after_max_attempts(pipeline: Pipeline):
    """The function counts its own failures by event id: after MLDIAG_MAX_ATTEMPTS it records
    the dead letter, fails the session and acknowledges, whatever Pub/Sub's own (much higher,
    throttling-sized) delivery limit is."""
    size = pipeline.drop_xplane()
    pipeline.post("on_profile_object", storage_event(XPLANE_NAME, size=size))
    pipeline.sweep()
    pipeline.services.storage = FlakyStorage(pipeline.services.storage, failures=100)
    [analyze] = list(pipeline.pubsub.queue)
    event = pubsub_event(analyze.payload, analyze.topic, message_id=analyze.message_id)
    attempts = pipeline.services.settings.max_attempts

    codes = [pipeline.post("collect", event).status_code for _ in range(attempts)]

    assert codes == [500] * (attempts - 1) + [200]
    [dead] = pipeline.services.state.list_dead_letters()
    assert dead["topic"] == "analysis-requests" and dead["attempts"] == attempts
    assert dead["reason"] == (f"failed {attempts} times, last error: ConnectionResetError: "
                              "[Errno 104] Connection reset by peer")
    session = pipeline.services.state.get_session("run1", "s1")
    assert session is not None and session.state == FAILED and session.reason == dead["reason"]
    # Another message's failures are its own.
    other = pubsub_event(analyze.payload, analyze.topic)
    assert pipeline.post("collect", other).status_code == 200  # the session is FAILED: no-op


def test_an_empty_profile_fails_its_session_with_the_reason(pipeline: Pipeline):
    path = pipeline.bucket / XPLANE_NAME
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")

    response = pipeline.post("on_profile_object", storage_event(XPLANE_NAME, size=0))

    assert response.status_code == 200
    session = pipeline.services.state.get_session("run1", "s1")
    assert session is not None and session.state == FAILED
    assert "empty file (0 bytes)" in session.reason


def test_services_are_built_from_the_environment_on_first_invocation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path / "home"
    monkeypatch.setenv("MLDIAG_HOME", str(home))
    entrypoints.set_services(None)
    try:
        client = functions_framework.create_app(
            target="on_profile_object", source=str(FUNCTIONS / "on_profile_object/main.py"),
            signature_type="cloudevent").test_client()
        assert not home.exists()  # loading the function opens nothing

        first = post(client, storage_event("run1/notes.txt", size=3))
        built = entrypoints.services()
        second = post(client, storage_event("run1/other.txt", size=3))

        assert first.status_code == second.status_code == 200
        assert (home / "state.db").is_file() and (home / "bucket").is_dir()
        assert entrypoints.services() is built
    finally:
        entrypoints.set_services(None)


# Capture, alerts, sweeper and dead letters


MONITORED_EVENT = {
    "analyzerReports": [{"analyzer": "Step Time Analyzer", "detectionState": "DETECTED",
                         "details": "step time up 40%"}],
    "name": "projects/p/locations/us-central1/machineLearningRuns/run1/monitoredEvents/ev-1",
    "startTime": "2026-11-29T12:00:00Z",
    "type": "PERFORMANCE_DEGRADATION",
}


def _run_with_live_target(pipeline: Pipeline) -> None:
    import socket
    import time

    from mldiag.model import AutoCapturePolicy, TargetRecord

    with socket.socket() as s:  # a port nobody listens on: the capture fails fast
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = pipeline.services.state
    state.ensure_run("run1", discovered=False)
    state.upsert_target(TargetRecord(run="run1", host="h0", port=port,
                                     last_heartbeat=time.time() + 3600))
    state.set_auto_capture("run1", AutoCapturePolicy(enabled=True, kind="on_demand",
                                                     duration_s=0.5).to_dict())


def test_a_workload_monitoring_alert_becomes_one_capture(pipeline: Pipeline) -> None:
    _run_with_live_target(pipeline)
    for _ in range(3):  # redelivered: still one capture
        response = pipeline.post("on_degradation_alert",
                                 pubsub_event(json.dumps(MONITORED_EVENT), "degradation-alerts"))
        assert response.status_code == 200
    assert pipeline.pubsub.kinds() == ["CaptureProfile"]
    pipeline.drain()
    (session,) = pipeline.services.state.list_sessions(run="run1")
    assert session.trigger == "alert" and "Step Time Analyzer" in session.note
    # Its only target is down: the session says so instead of waiting forever.
    assert session.state == FAILED and "unreachable" in session.reason


def test_a_closed_incident_is_acknowledged_and_captures_nothing(pipeline: Pipeline) -> None:
    _run_with_live_target(pipeline)
    closed = {"incident": {"incident_id": "i-1", "state": "closed",
                           "metric": {"labels": {"run": "run1"}}}, "version": "1.2"}
    response = pipeline.post("on_degradation_alert",
                             pubsub_event(json.dumps(closed), "degradation-alerts"))
    assert response.status_code == 200
    assert pipeline.pubsub.published == []


def test_a_dead_lettered_message_fails_its_session(pipeline: Pipeline) -> None:
    pipeline.drop_xplane()
    pipeline.services.state.ensure_run("run1", discovered=True)
    pipeline.post("on_profile_object", storage_event(XPLANE_NAME, size=1000))
    pipeline.sweep()
    payload = next(p.payload for p in pipeline.pubsub.published if p.topic == "analysis-requests")
    event = pubsub_event(payload, "mldiag-analysis-requests-dead-letter", attributes={
        "CloudPubSubDeadLetterSourceDeliveryCount": "5",
        "CloudPubSubDeadLetterSourceSubscription": "mldiag-collect"})
    assert pipeline.post("dead_letters", event).status_code == 200
    session = pipeline.services.state.get_session("run1", "s1")
    assert session is not None and session.state == FAILED
    assert session.reason == "dead-lettered after 5 delivery attempt(s) on analysis-requests"
    (dead,) = pipeline.services.state.list_dead_letters()
    assert dead["topic"] == "analysis-requests" and dead["attempts"] == 5


def test_the_sweep_function_settles_a_quiet_session(pipeline: Pipeline) -> None:
    pipeline.drop_xplane()
    pipeline.post("on_profile_object", storage_event(XPLANE_NAME, size=1000))
    assert pipeline.pubsub.kinds() == []  # no expected hosts: waits for the settle window
    tick = pubsub_event("{}", "mldiag-sweep-ticks")
    assert pipeline.post("sweep", tick).status_code == 200
    assert pipeline.pubsub.kinds() == ["AnalyzeSession"]
