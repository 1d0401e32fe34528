"""The console on the GCP adapters against the emulators: Firestore (state and access), GCS
(profiles, reports, viewer caches) and Pub/Sub (captures), signed in with IAP JWTs checked
against keys served on loopback, as IAP's public keys would be."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from mldiag import stages
from mldiag.access import Grant, create_link, share_path
from mldiag.adapters.gcp.access import FirestoreAccessStore
from mldiag.adapters.gcp.bus import PubSubBus
from mldiag.adapters.gcp.state import FirestoreStateStore
from mldiag.adapters.gcp.storage import GcsStorage
from mldiag.bootstrap import ControlPlane
from mldiag.console.app import create_app
from mldiag.console.context import build_console
from mldiag.messages import Message, ProfileObjectFinalized, parse
from mldiag.model import REPORTED
from mldiag.settings import Settings
from mldiag.stages import Services
from mldiag.viewer_cache import MANIFEST, cache_prefix
from tests.emulators import Emulators
from tests.gcp.conftest import jwks_endpoint
from tests.helpers.fixtures import SHARED_FIXTURES, team_fixture

pytestmark = pytest.mark.emulator
TPU_XPLANE_NAME = "tpu_inference_2/plugins/profile/run1/tpu_inference_2.xplane.pb"
AUDIENCE = "/projects/123/global/backendServices/456"
RUN, SESSION, HOST = "gcprun", "s1", "host0"


class Queue:
    """Pub/Sub's part in this test: each published message is delivered to its stage."""

    def __init__(self) -> None:
        self.items: deque[str] = deque()

    def publish(self, message: Message, attributes: Any = None) -> str:
        self.items.append(message.to_json())
        return str(len(self.items))


@pytest.fixture(scope="module")
def keys() -> Iterator[dict[str, Any]]:
    """An ES256 key pair and a loopback endpoint serving its public JWK set."""
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    with jwks_endpoint(key.public_key(), kid="k1", alg="ES256") as url:
        yield {"key": key, "url": url, "other": ec.generate_private_key(ec.SECP256R1())}


def iap_jwt(key: Any, email: str, *, audience: str = AUDIENCE, kid: str = "k1") -> str:
    import jwt

    now = int(time.time())
    return jwt.encode({"iss": "https://cloud.google.com/iap", "aud": audience, "email": email,
                       "sub": "accounts.google.com:1", "iat": now, "exp": now + 600},
                      key, algorithm="ES256", headers={"kid": kid})


@pytest.fixture(scope="module")
def gcp_console(emu: Emulators, keys: dict[str, Any], tmp_path_factory: pytest.TempPathFactory,
                shared_fixtures: Any) -> Iterator[dict[str, Any]]:
    database = f"console-{int(time.time() * 1000) % 10**8}"
    client = emu.storage_client()
    if client.lookup_bucket(emu.events_bucket) is None:
        client.create_bucket(emu.events_bucket)
    storage = GcsStorage(emu.events_bucket, client=client)
    state = FirestoreStateStore(client=emu.firestore_client(database))
    access = FirestoreAccessStore(client=emu.firestore_client(database))
    home = tmp_path_factory.mktemp("gcp-console")
    settings = Settings(backend="gcp", project=emu.project, bucket=emu.events_bucket,
                        firestore_database=database, home=home, settle_s=0.0,
                        topic_prefix="console-", console_auth="iap", iap_audience=AUDIENCE,
                        iap_certs_url=keys["url"], console_secret="k" * 32,
                        viewer_cache_dir=str(home / "viewer"))
    queue = Queue()
    services = Services(settings=settings, storage=storage, state=state, bus=queue)
    from mldiag.bootstrap import make_investigator

    services.investigator = make_investigator(settings)
    # A user's upload, and the chain it starts, one stage after the other.
    name = f"{RUN}/plugins/profile/{SESSION}/{HOST}.xplane.pb"
    info = storage.write_bytes(name, (shared_fixtures / TPU_XPLANE_NAME).read_bytes())
    stages.handle(ProfileObjectFinalized(bucket=storage.bucket, name=name,
                                         generation=info.generation, size=info.size), services)
    stages.sweep(services)
    while queue.items:
        stages.handle(parse(queue.items.popleft()), services)
    s = state.get_session(RUN, SESSION)
    assert s is not None and s.state == REPORTED
    publisher = emu.publisher()
    for topic_id in ("capture-requests", "viewer-requests"):
        topic = publisher.topic_path(emu.project, f"console-{topic_id}")
        try:
            publisher.create_topic(name=topic)
        except Exception:  # noqa: BLE001 - it exists from an earlier run of this module
            pass
    plane = ControlPlane(settings=settings, state=state, storage=storage,
                         bus=PubSubBus(emu.project, "console-", publisher=publisher))
    console = build_console(settings, plane=plane, access=access)
    yield {"client": TestClient(create_app(console)), "console": console, "session": s,
           "storage": storage, "keys": keys, "services": services, "client_gcs": client}


@pytest.fixture(scope="module")
def shared_fixtures() -> Any:
    team_fixture(SHARED_FIXTURES / TPU_XPLANE_NAME)
    return SHARED_FIXTURES


def test_iap_principals_get_their_role_bindings_and_nothing_else(gcp_console: Any) -> None:
    client, console, keys = gcp_console["client"], gcp_console["console"], gcp_console["keys"]
    console.access.grant(Grant(principal="vi@example.com", role="viewer", run=RUN))
    viewer = {"X-Goog-IAP-JWT-Assertion": iap_jwt(keys["key"], "vi@example.com")}
    assert client.get("/").status_code == 401
    runs = client.get("/api/v1/runs", headers=viewer).json()
    assert [r["name"] for r in runs] == [RUN] and runs[0]["last_verdict"]
    page = client.get(f"/runs/{RUN}/sessions/{SESSION}", headers=viewer)
    assert page.status_code == 200 and "vi@example.com" in page.text
    nobody = {"X-Goog-IAP-JWT-Assertion": iap_jwt(keys["key"], "nobody@example.com")}
    assert client.get(f"/runs/{RUN}", headers=nobody).status_code == 403
    for bad in (iap_jwt(keys["other"], "vi@example.com"),  # not IAP's key
                iap_jwt(keys["key"], "vi@example.com", audience="/projects/1/other"),
                iap_jwt(keys["key"], "vi@example.com", kid="unknown"), "not-a-jwt"):
        r = client.get("/api/v1/runs", headers={"X-Goog-IAP-JWT-Assertion": bad})
        assert r.status_code == 401
    # An IAP-signed browser changing state needs the page's CSRF token.
    console.access.grant(Grant(principal="ed@example.com", role="editor", run=RUN))
    editor = {"X-Goog-IAP-JWT-Assertion": iap_jwt(keys["key"], "ed@example.com")}
    url = f"/api/v1/runs/{RUN}/sessions/{SESSION}/share"
    assert client.post(url, json={}, headers=editor).status_code == 403
    html = client.get(f"/runs/{RUN}/sessions/{SESSION}", headers=editor).text
    csrf = html.split('name="csrf-token" content="', 1)[1].split('"', 1)[0]
    assert client.post(url, json={}, headers={**editor, "X-CSRF-Token": csrf}).status_code == 201


def test_the_viewer_reads_the_session_and_its_prebuilt_caches_from_gcs(
        gcp_console: Any) -> None:
    client, console, s = gcp_console["client"], gcp_console["console"], gcp_console["session"]
    assert gcp_console["storage"].stat(f"{cache_prefix(s)}/{MANIFEST}") is not None
    console.access.grant(Grant(principal="vi@example.com", role="viewer", run=RUN))
    viewer = {"X-Goog-IAP-JWT-Assertion": iap_jwt(gcp_console["keys"]["key"],
                                                  "vi@example.com")}
    xp = f"/runs/{RUN}/sessions/{SESSION}/xprof/data/plugin/profile"
    assert client.get(f"{xp}/runs", headers=viewer).json() == [SESSION]
    r = client.get(f"{xp}/data?run={SESSION}&tag=trace_viewer@&host={HOST}", headers=viewer)
    assert r.status_code == 200 and len(r.content) > 1000
    report = client.get(f"/runs/{RUN}/sessions/{SESSION}/report", headers=viewer)
    assert report.status_code == 200 and "<!DOCTYPE html>" in report.text[:50]
    download = client.get(f"/runs/{RUN}/sessions/{SESSION}/hosts/{HOST}/xplane.pb",
                          headers=viewer)
    assert download.status_code == 200 and len(download.content) == s.hosts[HOST].size


def test_an_expired_cache_in_gcs_is_rebuilt_through_pub_sub_on_the_next_open(
        gcp_console: Any, emu: Emulators, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bucket's lifecycle deleted the session's cache: the console says it rebuilds it
    and publishes the order on viewer-requests; prebuild_viewer, given that message from
    Pub/Sub, rebuilds it in GCS; the console then opens the session from it."""
    from mldiag import viewer_cache
    from mldiag.messages import PrebuildViewer

    client, s, storage = gcp_console["client"], gcp_console["session"], gcp_console["storage"]
    gcp_console["console"].access.grant(Grant(principal="vi@example.com", role="viewer",
                                              run=RUN))
    viewer = {"X-Goog-IAP-JWT-Assertion": iap_jwt(gcp_console["keys"]["key"],
                                                  "vi@example.com")}
    subscriber = emu.subscriber()
    subscription = subscriber.subscription_path(emu.project,
                                                f"rebuilds-{int(time.time() * 1000)}")
    subscriber.create_subscription(name=subscription, topic=emu.publisher().topic_path(
        emu.project, "console-viewer-requests"))
    prefix = cache_prefix(s)
    bucket = gcp_console["client_gcs"].bucket(storage.bucket)
    for blob in list(bucket.list_blobs(prefix=f"{prefix}/")):
        blob.delete()
    gcp_console["console"].viewers.lost(s, viewer_cache.CacheExpired("expired"))
    monkeypatch.setattr(viewer_cache, "EXPIRED_AFTER_S", 0.0)
    xp = f"/runs/{RUN}/sessions/{SESSION}/xprof/data/plugin/profile"
    page = client.get(f"{xp}/", headers=viewer)
    assert page.status_code == 503 and "Rebuilding the viewer cache (expired)" in page.text
    pulled = subscriber.pull(subscription=subscription, max_messages=10, timeout=30)
    orders = [parse(m.message.data.decode()) for m in pulled.received_messages]
    assert len(orders) == 1 and isinstance(orders[0], PrebuildViewer) and orders[0].rebuild
    stages.handle(orders[0], gcp_console["services"])
    assert storage.stat(f"{prefix}/{MANIFEST}") is not None
    assert client.get(f"{xp}/", headers=viewer).status_code == 200
    r = client.get(f"{xp}/data?run={SESSION}&tag=trace_viewer@&host={HOST}", headers=viewer)
    assert r.status_code == 200 and len(r.content) > 1000


def test_share_links_in_firestore(gcp_console: Any) -> None:
    client, console = gcp_console["client"], gcp_console["console"]
    made = console.plane.state.get_session(RUN, SESSION)
    assert made is not None
    secret, link = create_link(console.access, RUN, SESSION, created_by="t", now=time.time(),
                               anyone=True, session_created_at=made.created_at)
    path = share_path(secret, RUN, SESSION)
    assert client.get(path).status_code == 200
    assert console.access.list_access(link.id)[0].principal == "anonymous"
    console.access.revoke_link(link.id, time.time())
    assert client.get(path).status_code == 404


def test_a_capture_from_the_console_is_refused_with_the_reason(gcp_console: Any) -> None:
    client, console, keys = gcp_console["client"], gcp_console["console"], gcp_console["keys"]
    console.access.grant(Grant(principal="ed@example.com", role="editor", run=RUN))
    # A bearer-less IAP caller with CSRF: the run has no targets, so nothing is published.
    editor = {"X-Goog-IAP-JWT-Assertion": iap_jwt(keys["key"], "ed@example.com")}
    html = client.get(f"/runs/{RUN}", headers=editor).text
    csrf = html.split('name="csrf-token" content="', 1)[1].split('"', 1)[0]
    r = client.post(f"/api/v1/runs/{RUN}/captures", json={"session": "c1"},
                    headers={**editor, "X-CSRF-Token": csrf})
    assert r.status_code == 409 and "no profiler targets" in r.json()["detail"]
