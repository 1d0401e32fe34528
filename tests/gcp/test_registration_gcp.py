"""Tenancy on the emulators: workloads register and upload only through the `register` function.

The function runs under functions-framework on loopback, over Firestore (emulator) and GCS
(fake-gcs-server, whose XML API takes the V4 signed PUTs). Callers sign in with Google ID
tokens signed by a test RSA key, whose JWK set is served on loopback as Google serves its
own; the test plays the metadata server that would mint them for each workload's service
account.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import functions_framework
import pytest
from werkzeug.serving import make_server

from mldiag import entrypoints
from mldiag.adapters.gcp.registrar import (
    RegistrationClient,
    RegistrationRefused,
    RegistrationStateStore,
    SignedUrlStorage,
    WorkloadRefused,
)
from mldiag.adapters.gcp.registration import FirestoreRunOwners, GcsUploadSigner
from mldiag.adapters.gcp.state import FirestoreStateStore
from mldiag.bootstrap import control_plane
from mldiag.model import (
    CAPTURING,
    ControlRequest,
    HostRecord,
    MetricPoint,
    RunRecord,
    SessionRecord,
    TargetRecord,
)
from mldiag.registration import Registrar
from mldiag.settings import Settings
from tests.emulators import Emulators
from tests.gcp.conftest import jwks_endpoint
from tests.helpers.fixtures import REPO

pytestmark = pytest.mark.emulator
BUCKET = "mldiag-tenancy"
ALICE = "train-a@proj.iam.gserviceaccount.com"
BOB = "train-b@proj.iam.gserviceaccount.com"
SIGNER = "mldiag-fn-register@proj.iam.gserviceaccount.com"


def _rsa() -> Any:
    from cryptography.hazmat.primitives.asymmetric import rsa

    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def google_keys() -> Iterator[dict[str, Any]]:
    """An RS256 key and a loopback endpoint serving its JWK set, as Google serves its own."""
    key = _rsa()
    with jwks_endpoint(key.public_key(), kid="g1", alg="RS256") as url:
        yield {"key": key, "url": url, "other": _rsa()}


def id_token(key: Any, email: str, audience: str, *, kid: str = "g1", verified: bool = True,
             issuer: str = "https://accounts.google.com", expires_in: int = 600) -> str:
    """A Google ID token as the metadata server mints it for a service account."""
    import jwt

    now = int(time.time())
    return jwt.encode({"iss": issuer, "aud": audience, "azp": "1", "sub": "1", "email": email,
                       "email_verified": verified, "iat": now - 5, "exp": now + expires_in},
                      key, algorithm="RS256", headers={"kid": kid})


def _signing_credentials() -> Any:
    """The registration function's identity, with a key so that it signs locally."""
    from cryptography.hazmat.primitives import serialization
    from google.oauth2 import service_account

    pem = _rsa().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption()).decode()
    return service_account.Credentials.from_service_account_info({
        "type": "service_account", "client_email": SIGNER, "private_key": pem,
        "private_key_id": "s1", "token_uri": "https://oauth2.googleapis.com/token",
        "project_id": "proj"})


@pytest.fixture(scope="module")
def function(emu: Emulators, google_keys: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """functions/register served on loopback, over the emulators."""
    database = f"tenancy-{int(time.time() * 1000) % 10**8}"
    storage_client = emu.storage_client()
    if storage_client.lookup_bucket(BUCKET) is None:
        storage_client.create_bucket(BUCKET)
    app = functions_framework.create_app(
        target="register", source=str(REPO / "functions" / "register" / "main.py"),
        signature_type="http")
    server = make_server("127.0.0.1", 0, app, threaded=True)
    url = f"http://127.0.0.1:{server.server_port}/"
    settings = Settings(backend="gcp", project=emu.project, bucket=BUCKET,
                        firestore_database=database, registration_url=url,
                        id_token_certs_url=google_keys["url"])
    state = FirestoreStateStore(client=emu.firestore_client(database))
    entrypoints.set_registrar(Registrar(
        settings=settings, state=state,
        owners=FirestoreRunOwners(client=emu.firestore_client(database)),
        uploads=GcsUploadSigner(BUCKET, client=storage_client,
                                credentials=_signing_credentials())))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"url": url, "settings": settings, "state": state, "storage": storage_client,
           "keys": google_keys}
    server.shutdown()
    entrypoints.set_registrar(None)


def workload(function: dict[str, Any], email: str) -> tuple[RegistrationStateStore,
                                                               SignedUrlStorage]:
    """The SDK's adapters in a workload whose service account is `email`."""
    key = function["keys"]["key"]
    client = RegistrationClient(function["url"],
                                token_source=lambda audience: id_token(key, email, audience))
    return RegistrationStateStore(client), SignedUrlStorage(client, BUCKET)


def target(run: str, host: str = "host0") -> TargetRecord:
    return TargetRecord(run=run, host=host, port=9999, address="10.0.0.7", control_port=9100,
                        control_token="secret-of-" + run, last_heartbeat=time.time(), pid=42)


def _download(function: dict[str, Any], name: str) -> bytes:
    return bytes(function["storage"].bucket(BUCKET).blob(name).download_as_bytes())


def test_a_workload_registers_its_run_targets_sessions_and_uploads(
        function: dict[str, Any]) -> None:
    state, storage = workload(function, ALICE)
    run = state.register_run(RunRecord(name="alice-run", run_group="g", storage_prefix="team"))
    assert run.name == "alice-run" and not run.discovered
    assert state.set_auto_capture("alice-run", {"enabled": True}) is not None
    state.upsert_target(target("alice-run"))
    beat = time.time()
    updated = state.update_target("alice-run", "host0", 9999, last_heartbeat=beat,
                                  continuous="RING", continuous_since=beat)
    assert updated is not None and updated.continuous == "RING"
    assert [t.host for t in state.list_targets("alice-run")] == ["host0"]
    session, created = state.create_session(SessionRecord(
        run="alice-run", session="s1", state=CAPTURING, kind="programmatic",
        expected_hosts=["host0", "host1"], created_at=beat, updated_at=beat))
    assert created and session.expected_hosts == ["host0", "host1"]

    name = "team/alice-run/plugins/profile/s1/host0.xplane.pb"
    info = storage.write_bytes(name, b"xplane bytes of host0")
    assert info.name == name and info.size == len(b"xplane bytes of host0")
    assert _download(function, name) == b"xplane bytes of host0"
    # A host whose capture failed is recorded with its reason, so the session goes on.
    failed, _ = state.register_host("alice-run", "s1", "host1", HostRecord(
        object_name="", generation="", size=0, arrived_at=beat, status="FAILED",
        reason="host1: the profiler wrote an empty trace"), beat)
    assert failed.hosts["host1"].status == "FAILED"
    stored = function["state"].get_session("alice-run", "s1")
    assert stored is not None and stored.hosts["host1"].reason.endswith("empty trace")
    assert function["state"].get_run("alice-run").policy.enabled  # type: ignore[union-attr]
    # Its recorded metrics, through the function into the run's Firestore record.
    state.record_metrics("alice-run", [MetricPoint(name="loss", at=beat, value=0.5, step=1,
                                                   host="host0")])
    assert [(m.name, m.value, m.step) for m in function["state"].list_metrics("alice-run")] == [
        ("loss", 0.5, 1)]


def test_a_job_s_processes_join_one_session_through_the_function_whenever_they_start(
        function: dict[str, Any]) -> None:
    state, storage = workload(function, ALICE)
    state.register_run(RunRecord(name="job-run"))
    now = time.time()
    job = SessionRecord(run="job-run", session="s1", state=CAPTURING, kind="programmatic",
                        created_at=now, updated_at=now, process_count=2)
    got, created = state.join_session(job, "vm-0", 0)
    assert created and got.processes == {"vm-0": 0} and got.process_count == 2
    # Process 0's trace arrives and is analysed before process 1 even starts ...
    store = function["state"]
    store.register_host("job-run", "s1", "vm-0", HostRecord(
        object_name="job-run/plugins/profile/s1/vm-0.xplane.pb", generation="1", size=3,
        arrived_at=now), now)
    store.transition("job-run", "s1", "REPORTED", now=now, verdict="OPTIMAL")
    # ... which then joins the same session through the function, as the SDK does.
    got, created = state.join_session(job, "vm-1", 1)
    assert not created and got.processes == {"vm-0": 0, "vm-1": 1}
    stored = store.get_session("job-run", "s1")
    assert stored is not None and stored.processes == {"vm-0": 0, "vm-1": 1}
    assert (stored.state, stored.version) == ("REPORTED", 1)
    assert [x.session for x in store.list_sessions(run="job-run")] == ["s1"]
    # What a workload may not say about a session is refused with the reason.
    for bad, index, why in (
            (job, 2, "process_index 2 is not in [0, 2)"),
            (SessionRecord(run="job-run", session="s1", state="REPORTED",
                           kind="programmatic"), 0, "joins only programmatic sessions"),
            (SessionRecord(run="job-run", session="s1", state=CAPTURING, kind="programmatic",
                           process_count=2, process_indices=[5]), 0, "process_indices")):
        with pytest.raises(RegistrationRefused) as refused:
            state.join_session(bad, "vm-9", index)
        assert refused.value.status == 400 and why in str(refused.value), why


def test_another_workload_cannot_read_or_change_that_run(function: dict[str, Any]) -> None:
    alice, alice_storage = workload(function, ALICE)
    alice.register_run(RunRecord(name="shared-name"))
    alice.upsert_target(target("shared-name"))
    alice_storage.write_bytes("shared-name/plugins/profile/s1/host0.xplane.pb", b"alice's")
    function["state"].put_request(ControlRequest(
        id="alice-req", run="shared-name", host="host0", action="snapshot", session="s5",
        created_at=time.time(), expires_at=time.time() + 600), time.time())
    bob, bob_storage = workload(function, BOB)

    attempts: dict[str, Callable[[], Any]] = {
        "register": lambda: bob.register_run(RunRecord(name="shared-name", configs={"x": 1})),
        "auto-capture": lambda: bob.set_auto_capture("shared-name", {"enabled": True}),
        "read targets (and their control tokens)": lambda: bob.list_targets("shared-name"),
        "add a target": lambda: bob.upsert_target(target("shared-name", "evil")),
        "heartbeat": lambda: bob.update_target("shared-name", "host0", 9999,
                                               last_heartbeat=0.0),
        "create a session": lambda: bob.create_session(SessionRecord(
            run="shared-name", session="s9", state=CAPTURING, kind="programmatic")),
        "join a session": lambda: bob.join_session(SessionRecord(
            run="shared-name", session="s9", state=CAPTURING, kind="programmatic",
            process_count=2), "bob", 1),
        "fail a host": lambda: bob.register_host("shared-name", "s1", "host0", HostRecord(
            "", "", 0, 0.0, status="FAILED", reason="x"), 0.0),
        "overwrite a profile": lambda: bob_storage.write_bytes(
            "shared-name/plugins/profile/s1/host0.xplane.pb", b"bob's"),
        "upload a new host": lambda: bob_storage.write_bytes(
            "shared-name/plugins/profile/s2/bob.xplane.pb", b"bob's"),
        "record metrics": lambda: bob.record_metrics("shared-name", [
            MetricPoint(name="loss", at=0.0, value=1.0)]),
        "take its capture requests": lambda: bob.take_requests("shared-name", "host0", 0.0),
    }
    for what, attempt in attempts.items():
        with pytest.raises(RegistrationRefused) as refused:
            attempt()
        assert refused.value.status == 403, what
        assert "not registered by " + BOB in str(refused.value), what
    # Nothing of Alice's run changed, and her target still has its own fields.
    state = function["state"]
    assert state.get_run("shared-name").configs == {}  # type: ignore[union-attr]
    assert [(t.host, t.last_heartbeat > 0) for t in state.list_targets("shared-name")] == [
        ("host0", True)]
    assert state.get_session("shared-name", "s9") is None
    assert state.list_metrics("shared-name") == []
    # Alice's request still waits for her, and only she takes it.
    assert [r.id for r in alice.take_requests("shared-name", "host0", 0.0)] == ["alice-req"]
    assert _download(function, "shared-name/plugins/profile/s1/host0.xplane.pb") == b"alice's"
    # Bob's own run works as Alice's does.
    bob.register_run(RunRecord(name="bob-run"))
    bob_storage.write_bytes("bob-run/plugins/profile/s1/host0.xplane.pb", b"bob's")
    with pytest.raises(RegistrationRefused):
        alice.list_targets("bob-run")


def test_signed_urls_cover_one_object_of_the_callers_own_run(function: dict[str, Any]) -> None:
    state, _ = workload(function, ALICE)
    state.register_run(RunRecord(name="url-run", storage_prefix="p"))
    grant = state.client.call("upload_url", run="url-run", session="s1", host="h0")
    assert grant["object"] == "p/url-run/plugins/profile/s1/h0.xplane.pb"
    parts = urlsplit(grant["url"])
    assert parts.path == f"/{BUCKET}/p/url-run/plugins/profile/s1/h0.xplane.pb"
    assert "X-Goog-Signature=" in parts.query and "X-Goog-Expires=3600" in parts.query
    assert grant["method"] == "PUT"
    # Names that would leave the layout are refused before anything is signed.
    for host in ("../../other-run/plugins/profile/s1/h0", "a/b", "", ".."):
        with pytest.raises(RegistrationRefused) as refused:
            state.client.call("upload_url", run="url-run", session="s1", host=host)
        assert refused.value.status == 400, host
    # And the workload's storage writes nothing but its hosts' xplanes.
    storage = SignedUrlStorage(state.client, BUCKET)
    for name in ("url-run/plugins/profile/s1/analysis/summary.html", "p/url-run/x.txt"):
        with pytest.raises(WorkloadRefused):
            storage.write_bytes(name, b"x")


def test_only_valid_google_id_tokens_for_this_function_get_in(
        function: dict[str, Any]) -> None:
    keys, url = function["keys"], function["url"]

    def status(authorization: str | None) -> tuple[int, str]:
        headers = {"Content-Type": "application/json"}
        if authorization is not None:
            headers["Authorization"] = authorization
        request = urllib.request.Request(url, data=json.dumps(
            {"op": "register_run", "run": {"name": "token-run"}}).encode(), headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as f:
                return f.status, ""
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())["error"]

    refused = {
        "no header": None,
        "not a bearer": "Basic eDp5",
        "another audience": "Bearer " + id_token(keys["key"], BOB, "https://other.example/"),
        "another key": "Bearer " + id_token(keys["other"], BOB, url),
        "unknown key id": "Bearer " + id_token(keys["key"], BOB, url, kid="nope"),
        "expired": "Bearer " + id_token(keys["key"], BOB, url, expires_in=-60),
        "unverified email": "Bearer " + id_token(keys["key"], BOB, url, verified=False),
        "another issuer": "Bearer " + id_token(keys["key"], BOB, url,
                                               issuer="https://evil.example"),
        "garbage": "Bearer mldiag_not-a-jwt",
    }
    for what, header in refused.items():
        code, error = status(header)
        assert code == 401, (what, code, error)
    assert status("Bearer " + id_token(keys["key"], BOB, url)) == (200, "")
    assert function["state"].get_run("token-run") is not None


def test_bad_requests_get_a_clear_400(function: dict[str, Any]) -> None:
    state, _ = workload(function, ALICE)
    state.register_run(RunRecord(name="bad-run"))
    state.upsert_target(target("bad-run"))
    cases = {
        "unknown op": ({"op": "drop_database"}, "unknown op"),
        "unknown run field": ({"op": "register_run", "run": {"name": "x", "owner": "me"}},
                              "unknown field(s) owner"),
        "a field a workload may not change": (
            {"op": "update_target", "run": "bad-run", "host": "host0", "port": 9999,
             "fields": {"address": "169.254.169.254"}}, "may not change address"),
        "a condition on something but the owner": (
            {"op": "update_target", "run": "bad-run", "host": "host0", "port": 9999,
             "fields": {"last_heartbeat": 0.0}, "expect": {"address": "10.0.0.1"}},
            "expect must be a JSON object of pid, registered_at"),
        "a prefix that leaves the layout": (
            {"op": "register_run", "run": {"name": "bad-run", "storage_prefix": "a/../b"}},
            "bad storage prefix segment name '..'"),
        "a session the pipeline owns": (
            {"op": "create_session", "session": {"run": "bad-run", "session": "s1",
                                                 "state": "REPORTED"}},
            "only programmatic sessions"),
    }
    for what, (body, message) in cases.items():
        with pytest.raises(RegistrationRefused) as refused:
            state.client.call(**body)
        assert refused.value.status == 400 and message in str(refused.value), what


def test_the_sdk_on_gcp_goes_through_the_function_when_configured(
        function: dict[str, Any]) -> None:
    settings = Settings(backend="gcp", project="proj", bucket=BUCKET,
                        registration_url=function["url"])
    plane = control_plane(settings)
    assert isinstance(plane.state, RegistrationStateStore)
    assert isinstance(plane.storage, SignedUrlStorage)
    # The workload has no other way into the state store or the bucket.
    for attempt in (lambda: plane.state.list_runs(), lambda: plane.storage.read_bytes("x"),
                    lambda: plane.state.transition("r", "s", "REPORTED", now=0.0)):
        with pytest.raises(WorkloadRefused, match="through the registration function"):
            attempt()


def test_the_sdk_registers_heartbeats_and_uploads_through_the_function(
        function: dict[str, Any], emu: Emulators, monkeypatch: pytest.MonkeyPatch) -> None:
    """`machinelearning_run` in a workload whose identity is Alice's, end to end."""
    import mldiag.adapters.gcp.registrar as registrar
    from mldiag.sdk import machinelearning_run, metrics
    from mldiag.sdk.metrics import flush_to

    key = function["keys"]["key"]
    # The metadata server's part: an ID token of the workload's service account.
    monkeypatch.setattr(registrar, "_fetch_id_token",
                        lambda audience: id_token(key, ALICE, audience))
    monkeypatch.setenv("MLDIAG_TARGET_ADDRESS", "127.0.0.1")
    settings = Settings(backend="gcp", project=emu.project, bucket=BUCKET,
                        topic_prefix="tenancy-", registration_url=function["url"],
                        pull_poll_s=0.2)
    run = machinelearning_run("sdk-run", gcs_path=f"gs://{BUCKET}/team", settings=settings,
                              host_name="worker0", monitor=False, heartbeat_s=0.2)
    try:
        state = function["state"]
        assert state.get_run("sdk-run").storage_prefix == "team"  # type: ignore[union-attr]
        first = state.list_targets("sdk-run")[0].last_heartbeat
        name = run.upload("s1", b"a programmatic capture").result(timeout=60)
        assert name == "team/sdk-run/plugins/profile/s1/worker0.xplane.pb"
        assert _download(function, name) == b"a programmatic capture"
        metrics.record("loss", 0.25, step=3)
        flush_to(run)
        assert [(m.name, m.value) for m in state.list_metrics("sdk-run")] == [("loss", 0.25)]
        deadline = time.time() + 10
        while state.list_targets("sdk-run")[0].last_heartbeat == first:
            assert time.time() < deadline, "no heartbeat reached the state store"
            time.sleep(0.1)
        # A pulled request, taken through the function and answered on the target.
        now = time.time()
        assert state.put_request(ControlRequest(
            id="start-1", run="sdk-run", host="worker0", action="continuous_start",
            created_at=now, expires_at=now + 60, options={"window_s": 0.5}), now)
        deadline = time.time() + 30
        while (t := state.list_targets("sdk-run")[0]).last_request != "start-1":
            assert time.time() < deadline, "the SDK did not take its request"
            time.sleep(0.1)
        assert (t.continuous, t.last_error, t.control_token) == ("RING", "", "")
    finally:
        run.close()
    assert state.list_targets("sdk-run")[0].last_heartbeat == 0.0  # marked stopped
    # Another workload cannot take the run over by registering it again.
    bob, _ = workload(function, BOB)
    with pytest.raises(RegistrationRefused):
        bob.register_run(RunRecord(name="sdk-run"))


def test_unreachable_google_keys_are_a_transient_error_not_a_refusal(
        function: dict[str, Any]) -> None:
    """The function answers 500 (the SDK retries), never 401, when it cannot check tokens."""
    from dataclasses import replace

    from mldiag.identity import KeysUnavailable

    services = entrypoints.registrar()
    broken = replace(services, settings=replace(
        services.settings, id_token_certs_url="http://127.0.0.1:9/certs"))
    token = id_token(function["keys"]["key"], ALICE, function["url"])
    with pytest.raises(KeysUnavailable, match="cannot fetch the signing keys"):
        entrypoints.register(f"Bearer {token}", b'{"op": "list_targets", "run": "x"}', broken)
