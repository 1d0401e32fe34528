"""The whole pipeline on Google Cloud's emulators, through the deployed functions.

A real TPU xplane is uploaded to fake-gcs-server; its finalize notification reaches the
Pub/Sub emulator; the relay delivers it to `on_profile_object` as Eventarc would, and every
message the stages publish to the function of its topic; state lands in the Firestore
emulator and `summary.html` in the bucket. The functions build their services themselves,
from MLDIAG_BACKEND=gcp and the emulator variables, as a deployed instance does.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests

from mldiag import entrypoints
from mldiag.adapters.gcp.bus import ensure_topology
from mldiag.adapters.gcp.state import FirestoreStateStore
from mldiag.adapters.gcp.storage import GcsStorage
from mldiag.entrypoints import PUBSUB_PUBLISHED
from mldiag.messages import (
    TOPIC_OF,
    AnalyzeSession,
    CaptureProfile,
    CollectHost,
    DegradationDetected,
    InvestigateSession,
    RenderReport,
)
from mldiag.model import ANALYZING, FAILED, REPORTED, HostRecord, SessionRecord
from tests.emulators import Emulators
from tests.gcp.relay import FunctionServer, Relay, Route
from tests.helpers.fixtures import REPO, TPU_XPLANE, team_fixture
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.emulator

FUNCTIONS = REPO / "functions"
# The function each pipeline topic is delivered to (as terraform's push subscriptions do).
FUNCTION_OF = {TOPIC_OF[AnalyzeSession]: "collect",
               TOPIC_OF[CollectHost]: "collect_host",
               TOPIC_OF[InvestigateSession]: "investigate",
               TOPIC_OF[RenderReport]: "render_report",
               TOPIC_OF[DegradationDetected]: "on_degradation_alert",
               TOPIC_OF[CaptureProfile]: "on_capture_request"}
_ids = itertools.count(1)
# How often a test looks at the emulators for what it waits on.
POLL_S = 0.1


@dataclass
class Deployment:
    """The emulated project: functions, relay, and direct handles on its state and bucket."""

    emu: Emulators
    prefix: str
    relay: Relay
    state: FirestoreStateStore
    storage: GcsStorage
    publisher: Any
    dead_letter_deliveries: Any

    def topic(self, name: str) -> str:
        return f"projects/{self.emu.project}/topics/{self.prefix}{name}"


@pytest.fixture(scope="module")
def deployment(emu: Emulators, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    team_fixture(TPU_XPLANE)
    n = next(_ids)
    prefix, database = f"gcp{n}-", f"pipeline-{n}"
    client = emu.storage_client()
    if client.lookup_bucket(emu.events_bucket) is None:
        client.create_bucket(emu.events_bucket)
    publisher, subscriber = emu.publisher(), emu.subscriber()
    # Fast retries, so a nacked message is redelivered in the test's time.
    topology = ensure_topology(emu.project, prefix, publisher=publisher, subscriber=subscriber,
                               ack_deadline_s=600, min_backoff_s=0.1, max_backoff_s=1.0)
    notifications = subscriber.create_subscription(
        name=subscriber.subscription_path(emu.project, f"{prefix}gcs-to-on-profile-object"),
        topic=publisher.topic_path(emu.project, emu.notification_topic),
        ack_deadline_seconds=600).name
    with pytest.MonkeyPatch.context() as mp:
        # What terraform sets on every function; clients find the emulators by their variables.
        for key, value in {"MLDIAG_BACKEND": "gcp", "MLDIAG_PROJECT": emu.project,
                           "MLDIAG_BUCKET": emu.events_bucket, "MLDIAG_TOPIC_PREFIX": prefix,
                           "MLDIAG_FIRESTORE_DATABASE": database, "MLDIAG_SETTLE_S": "0.5",
                           "MLDIAG_HOME": str(tmp_path_factory.mktemp("home")),
                           "MLDIAG_INVESTIGATOR": "rule-based",
                           # The workloads here are local processes: loopback, allowed
                           # explicitly (deployed, the capture stage refuses it).
                           "MLDIAG_CAPTURE_ALLOW_LOOPBACK": "1"}.items():
            mp.setenv(key, value)
        entrypoints.set_services(None)
        names = ["on_profile_object", "collect", "collect_host", "investigate", "render_report",
                 "dead_letters", "sweep", "on_degradation_alert", "on_capture_request"]
        servers = {name: FunctionServer(FUNCTIONS / name, name) for name in names}
        routes = [Route(notifications, publisher.topic_path(emu.project, emu.notification_topic),
                        servers["on_profile_object"], storage=True)]
        routes += [Route(topology.subscriptions[t], topology.topics[t], servers[f])
                   for t, f in FUNCTION_OF.items()]
        routes += [Route(topology.dead_letter_subscriptions[t], topology.dead_letter_topics[t],
                         servers["dead_letters"]) for t in topology.topics]
        relay = Relay(subscriber, routes, storage_copies=2)
        relay.start()
        stop = threading.Event()
        # Cloud Scheduler's part: a sweep tick every quarter second, to the sweep function.
        ticker = threading.Thread(target=_tick, args=(servers["sweep"].url, stop), daemon=True)
        ticker.start()
        try:
            yield Deployment(
                emu=emu, prefix=prefix, relay=relay,
                state=FirestoreStateStore(client=emu.firestore_client(database)),
                storage=GcsStorage(emu.events_bucket, client=client),
                publisher=publisher,
                dead_letter_deliveries=lambda: relay.to("dead_letters"))
        finally:
            stop.set()
            ticker.join(10)
            relay.stop()
            for server in servers.values():
                server.stop()
            subscriber.close()
            entrypoints.set_services(None)


def _tick(url: str, stop: threading.Event) -> None:
    for i in itertools.count():
        if stop.wait(0.25):
            return
        body = {"message": {"data": base64.b64encode(b"{}").decode(), "messageId": f"t{i}"},
                "subscription": "projects/p/subscriptions/sweep"}
        requests.post(url, json=body, timeout=60, headers={
            "ce-specversion": "1.0", "ce-type": PUBSUB_PUBLISHED, "ce-id": f"tick-{i}",
            "ce-source": "//pubsub.googleapis.com/projects/p/topics/sweep-ticks"})


@pytest.fixture(scope="module")
def reported(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A user's copy of a real xplane into the bucket, analysed to the end."""
    local = tmp_path_factory.mktemp("upload") / "host0.xplane.pb"
    shutil.copyfile(TPU_XPLANE, local)  # the team's fixture is read-only: upload a copy
    run = f"run-{deployment.prefix.rstrip('-')}"
    name = f"{run}/plugins/profile/s1/host0.xplane.pb"
    blob = deployment.storage.client.bucket(deployment.storage.bucket).blob(name)
    started = time.monotonic()
    blob.upload_from_filename(str(local))
    session = wait_until(
        lambda: (s := deployment.state.get_session(run, "s1")) and s.state in (REPORTED, FAILED)
        and s, what="the session to be REPORTED", timeout=180, interval=POLL_S)
    return {"run": run, "name": name, "generation": str(blob.generation),
            "size": local.stat().st_size, "session": session,
            "seconds": time.monotonic() - started}


def test_a_dropped_xplane_is_analysed_and_its_report_lands_in_the_bucket(
        deployment: Deployment, reported: dict[str, Any]) -> None:
    run, session = reported["run"], reported["session"]
    assert session.state == REPORTED, session.reason
    assert session.verdict in ("OPTIMAL", "NEEDS_ATTENTION") and session.version == 1
    base = f"{run}/plugins/profile/s1/analysis"
    assert session.report_path == f"gs://{deployment.emu.events_bucket}/{base}/summary.html"
    html = deployment.storage.read_bytes(f"{base}/summary.html").decode()
    assert html.lstrip().lower().startswith("<!doctype html") and run in html
    analysis = json.loads(deployment.storage.read_bytes(f"{base}/analysis.json"))
    assert analysis["status"] == session.verdict
    assert deployment.storage.stat(f"{base}/v1/health_snapshot.json") is not None
    stored_run = deployment.state.get_run(run)
    assert stored_run is not None and stored_run.discovered, "a dropped file registers its run"
    assert session.hosts["host0"].generation == reported["generation"]
    assert session.hosts["host0"].size == reported["size"]


def test_a_finalize_delivered_twice_gives_one_session_and_one_analysis(
        deployment: Deployment, reported: dict[str, Any]) -> None:
    run = reported["run"]
    relay = deployment.relay
    finalizes = [d for d in relay.to("on_profile_object", name=reported["name"])]
    assert len(finalizes) == 2 and all(d.status == 204 or d.status == 200 for d in finalizes)
    assert len({d.message_id for d in finalizes}) == 1, "the same event, twice"
    assert [s.session for s in deployment.state.list_sessions(run=run)] == ["s1"]
    analyses = relay.to("collect", kind="AnalyzeSession", run=run, session="s1", version=1)
    assert len(analyses) == 1
    # A late redelivery of the same event, after the report: a duplicate, acknowledged.
    (route,) = [r for r in relay.routes if r.storage]
    first = finalizes[0]
    status = relay.post(route, *_finalize_event(deployment, first), first.message_id, 3,
                        first.data, first.attributes)
    assert 200 <= status < 300
    # The function has answered, so what it wrote is in Firestore: the session untouched.
    after = deployment.state.get_session(run, "s1")
    assert after is not None and (after.state, after.version) == (REPORTED, 1)
    # What it published would reach collect before a request published after its answer
    # (the emulator delivers a subscription in publish order): a stale analysis request,
    # which collect answers as a duplicate.
    stale = AnalyzeSession(run=run, session="s1", version=0)
    marker = deployment.publisher.publish(deployment.topic(TOPIC_OF[AnalyzeSession]),
                                          stale.to_json().encode(),
                                          kind=stale.kind).result(timeout=30)
    (answered,) = wait_until(lambda: relay.of_message(marker), what="the stale request answered",
                             timeout=60, interval=POLL_S)
    assert answered.function == "collect" and 200 <= answered.status < 300
    assert len(relay.to("collect", kind="AnalyzeSession", run=run, session="s1", version=1)) == 1


def _finalize_event(deployment: Deployment, delivery: Any) -> tuple[dict[str, str], bytes]:
    obj = json.loads(delivery.data)
    return ({"ce-specversion": "1.0", "ce-type": "google.cloud.storage.object.v1.finalized",
             "ce-source": f"//storage.googleapis.com/projects/_/buckets/{obj['bucket']}",
             "ce-subject": f"objects/{obj['name']}", "ce-id": delivery.message_id,
             "Content-Type": "application/json"}, delivery.data)


def test_a_poison_message_is_dead_lettered_once_and_the_session_is_untouched(
        deployment: Deployment, reported: dict[str, Any]) -> None:
    run = reported["run"]
    topic = deployment.topic(TOPIC_OF[AnalyzeSession])
    garbage = deployment.publisher.publish(topic, b"\xff\x00 not json").result(timeout=30)
    wrong = json.dumps({"kind": "AnalyzeSession", "run": run, "session": "s1",
                        "version": "one"}).encode()
    mistyped = deployment.publisher.publish(topic, wrong).result(timeout=30)
    letters = wait_until(lambda: [d for d in deployment.state.list_dead_letters()
                                  if d["reason"].startswith("poison message")
                                  and d["topic"].endswith(TOPIC_OF[AnalyzeSession])]
                         if len(deployment.relay.of_message(mistyped)) else None,
                         what="the dead letters", timeout=60, interval=POLL_S)
    wait_until(lambda: len([d for d in deployment.state.list_dead_letters()
                            if d["reason"].startswith("poison message")]) >= 2,
               what="both dead letters", timeout=60, interval=POLL_S)
    # The relay records a delivery once the function has answered it. Answered 2xx at the
    # first delivery, each is acknowledged: Pub/Sub never delivers it again.
    for message_id in (garbage, mistyped):
        deliveries = wait_until(lambda m=message_id: deployment.relay.of_message(m),
                                what=f"message {message_id}'s delivery answered", timeout=60,
                                interval=POLL_S)
        assert len(deliveries) == 1 and 200 <= deliveries[0].status < 300, deliveries
    reasons = [d["reason"] for d in deployment.state.list_dead_letters()]
    assert any("not JSON" in r for r in reasons) and any("version" in r for r in reasons)
    assert letters
    assert deployment.dead_letter_deliveries() == [], "acknowledged: never reached the DLQ"
    session = deployment.state.get_session(run, "s1")
    assert session is not None and (session.state, session.version) == (REPORTED, 1)


def test_a_message_that_keeps_failing_is_given_up_by_its_function(
        deployment: Deployment, reported: dict[str, Any]) -> None:
    # A session being analysed whose health snapshot is missing: its report request fails
    # (a transient error, as far as the function can tell) at every delivery. The function
    # counts its own failures in Firestore by event id and gives up after MLDIAG_MAX_ATTEMPTS
    # (5): it records the dead letter, fails the session and acknowledges, so Pub/Sub's own
    # dead-letter limit (100 in terraform, sized for throttled pushes) is never reached.
    run = reported["run"]
    deployment.state.create_session(SessionRecord(
        # Touched now: the sweeper would otherwise take it for stuck and re-queue its analysis.
        run=run, session="s-dlq", state=ANALYZING, created_at=time.time(),
        updated_at=time.time(),
        hosts={"host0": HostRecord(object_name=f"{run}/plugins/profile/s-dlq/host0.xplane.pb",
                                   generation="1", size=1, arrived_at=time.time())}))
    msg = RenderReport(run=run, session="s-dlq", version=1)
    message_id = deployment.publisher.publish(
        deployment.topic(TOPIC_OF[RenderReport]), msg.to_json().encode(),
        kind=msg.kind).result(timeout=30)

    def settled() -> Any:
        s = deployment.state.get_session(run, "s-dlq")
        return s if s is not None and s.state == FAILED else None

    session = wait_until(settled, what="the session FAILED", timeout=90, interval=POLL_S)

    def delivered() -> Any:
        # The relay records a delivery when the function has answered it, a moment after the
        # fifth one failed the session.
        tries = [d for d in deployment.relay.of_message(message_id)
                 if d.function == "render_report"]
        return tries if len(tries) >= 5 else None

    tries = wait_until(delivered, what="the fifth delivery answered", timeout=30,
                       interval=POLL_S)
    assert sorted(d.attempt for d in tries) == [1, 2, 3, 4, 5]
    assert [d.status >= 500 for d in sorted(tries, key=lambda d: d.attempt)] == [
        True, True, True, True, False]
    assert session.reason.startswith("failed 5 times, last error: ")
    assert any(d["reason"] == session.reason and d["topic"] == "report-requests"
               for d in deployment.state.list_dead_letters())
    assert deployment.dead_letter_deliveries() == []
    other = deployment.state.get_session(run, "s1")
    assert other is not None and other.state == REPORTED, "other sessions are untouched"


def test_an_alert_captures_a_live_sdk_workload_and_reports_in_the_bucket(
        deployment: Deployment) -> None:
    """The SDK on MLDIAG_BACKEND=gcp registers its run and target in Firestore; a workload-
    monitoring alert on degradation-alerts becomes, through the functions, an on-demand
    capture request that the process takes from Firestore, runs, and uploads to the bucket,
    where it is analysed."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    from mldiag.model import AutoCapturePolicy

    run = f"live-{deployment.prefix.rstrip('-')}"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "MLDIAG_HOST_NAME": "w0", "MLDIAG_TARGET_ADDRESS": "127.0.0.1",
           "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.Popen([sys.executable, str(REPO / "tests/e2e/sdk_workload.py"),
                             "--run", run, "--port", str(port)], env=env,
                            start_new_session=True)
    try:
        target = wait_until(lambda: next((t for t in deployment.state.list_targets(run)
                                          if t.pid == proc.pid), None),
                            what="the SDK to register its target in Firestore", timeout=120,
                            interval=POLL_S)
        # It takes its capture requests from Firestore itself: no endpoint, no token stored.
        assert (target.host, target.platform, target.delivery) == ("w0", "cpu", "pull")
        assert (target.control_port, target.control_token) == (0, "")
        deployment.state.set_auto_capture(run, AutoCapturePolicy(
            enabled=True, kind="on_demand", duration_s=1.0).to_dict())
        alert = {"type": "PERFORMANCE_DEGRADATION", "startTime": "2026-11-29T12:00:00Z",
                 "name": f"projects/p/locations/l/machineLearningRuns/{run}/monitoredEvents/e1",
                 "analyzerReports": [{"analyzer": "Step Time Analyzer",
                                      "detectionState": "DETECTED", "details": "slower"}]}
        data = json.dumps(alert).encode()
        for _ in range(3):  # an alert storm, delivered thrice: one capture
            deployment.publisher.publish(deployment.topic("degradation-alerts"), data).result()
        session = wait_until(lambda: next(
            (s for s in deployment.state.list_sessions(run=run)
             if s.state in (REPORTED, FAILED)), None),
            what="the auto-captured session's report", timeout=180, interval=POLL_S)
        assert session.state == REPORTED, session.reason
        assert (session.trigger, session.kind, sorted(session.hosts)) == (
            "alert", "on_demand", ["w0"])
        base = f"{run}/plugins/profile/{session.session}"
        assert deployment.storage.stat(f"{base}/w0.xplane.pb") is not None
        assert deployment.storage.stat(f"{base}/analysis/summary.html") is not None
        assert [s.session for s in deployment.state.list_sessions(run=run)] == [session.session]
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        # Its exit hook marked the target stopped (no waiting for the heartbeat to go stale).
        [stopped] = deployment.state.list_targets(run)
        assert (stopped.pid, stopped.last_heartbeat, stopped.continuous) == (proc.pid, 0.0, "OFF")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_a_workload_on_firestore_exits_after_a_stream_failed_at_shutdown(
        deployment: Deployment) -> None:
    """At exit (Python 3.12) gRPC can no longer start the thread a streaming call needs; the
    failed start leaves the channel waiting on a call that never ends. A workload whose exit
    hook (or the SDK's heartbeat, firing as the interpreter finalizes) streamed once must
    still exit at once, with its target marked stopped: the SDK reads and writes single
    documents by unary calls and lists nothing at exit. (CI once waited 30 s on it.)"""
    import os
    import subprocess
    import sys

    run = f"exit-{deployment.prefix.rstrip('-')}"
    env = {**os.environ, "MLDIAG_HOST_NAME": "w0", "JAX_PLATFORMS": "cpu",
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, str(REPO / "tests/e2e/sdk_workload.py"), "--run", run,
                           "--no-server", "--seconds", "1", "--stream-at-exit"],
                          env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "can't create new thread at interpreter shutdown" in proc.stdout, (
        "the hook's second listing failed as a stream does at shutdown", proc.stdout)
    [target] = deployment.state.list_targets(run)
    assert (target.last_heartbeat, target.continuous) == (0.0, "OFF"), proc.stderr[-2000:]
    assert "could not mark the target stopped" not in proc.stderr


def test_an_eight_host_session_fans_out_to_collect_host_and_is_combined(
        deployment: Deployment, tmp_path: Any) -> None:
    """Eight hosts: one collect_host delivery each, then one combined analysis and report."""
    from concurrent.futures import ThreadPoolExecutor

    run = f"fan-{deployment.prefix.rstrip('-')}"
    hosts = [f"host-{i}" for i in range(8)]
    local = tmp_path / "h.xplane.pb"
    shutil.copyfile(TPU_XPLANE, local)
    bucket = deployment.storage.client.bucket(deployment.storage.bucket)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda h: bucket.blob(f"{run}/plugins/profile/s8/{h}.xplane.pb")
                      .upload_from_filename(str(local)), hosts))
    session = wait_until(
        lambda: (s := deployment.state.get_session(run, "s8")) and s.state in (REPORTED, FAILED)
        and len(s.hosts) == 8 and s, what="the 8-host session to be REPORTED", timeout=300,
        interval=POLL_S)
    assert session.state == REPORTED, session.reason
    per_host = deployment.relay.to("collect_host", kind="CollectHost", run=run, session="s8")
    assert sorted({json.loads(d.data)["host"] for d in per_host}) == hosts
    base = f"{run}/plugins/profile/s8/analysis"
    snapshot = json.loads(deployment.storage.read_bytes(f"{base}/health_snapshot.json"))
    assert snapshot["session"]["hosts"] == hosts
    assert snapshot["collection"]["fanned_out"]["hosts"] == 8
    assert sorted(snapshot["tools"]["get_memory_profile"]["data"]["per_host_peak_gib"]) == hosts
    for h in hosts:
        assert deployment.storage.stat(f"{base}/v{session.version}/hosts/{h}.json") is not None
