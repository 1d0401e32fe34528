"""The Cloud Functions under functions-framework, fed real CloudEvents over HTTP.

Each function runs in this process on embedded services over a temp MLDIAG_HOME (the bucket
directory and SQLite), as the bootstrap builds them. Only the infrastructure between the
functions is played by doubles, as GCP would play it:

- `FakePubSub` is the bus: it keeps what the stages publish, and `Pipeline.drain` pushes each
  message to the function of its topic as an Eventarc messagePublished CloudEvent (the
  recorded envelope in `tests/events/`), redelivering after a 5xx;
- the bucket's own finalize events (artifacts written by the stages) are delivered to
  `on_profile_object` as GCS finalize CloudEvents, as Eventarc would.

Nothing runs a sweeper: Cloud Scheduler's part is `Pipeline.sweep`, called where a test needs
a session without expected hosts to settle.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import functions_framework
import pytest
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from mldiag import entrypoints, stages
from mldiag.bootstrap import bootstrap
from mldiag.messages import TOPIC_OF, Message, ProfileObjectFinalized, topic_of
from mldiag.ports import ObjectInfo
from mldiag.settings import Settings
from mldiag.stages import Services
from tests.helpers.fixtures import REPO, TPU_XPLANE, team_fixture

EVENTS = REPO / "tests" / "events"
FUNCTIONS = REPO / "functions"
XPLANE_NAME = "run1/plugins/profile/s1/host0.xplane.pb"
PROJECT = "mldiag-demo"
# Each function is named after the stage it calls: the function of a topic is the one whose
# stage handles that topic's message type.
STORAGE_FUNCTION = stages.HANDLERS[ProfileObjectFinalized].__name__
FUNCTION_OF_TOPIC = {TOPIC_OF[t]: handler.__name__ for t, handler in stages.HANDLERS.items()
                     if t is not ProfileObjectFinalized}

_ids = itertools.count(17000000000000001)


def recorded(name: str) -> dict[str, Any]:
    """A recorded CloudEvent from tests/events/, structured form (attributes + data)."""
    return dict(json.loads((EVENTS / f"{name}.json").read_text()))


def storage_event(name: str, *, size: int | str, generation: int | str = "1767225600123456",
                  event_id: str | None = None) -> dict[str, Any]:
    """The recorded GCS finalize event, about object `name` of the recorded bucket."""
    event = recorded("storage_object_finalized")
    data = event["data"]
    bucket, encoded = data["bucket"], quote(name, safe="")
    event["id"] = event_id or str(next(_ids))
    event["subject"] = f"objects/{name}"
    data.update(
        name=name, size=str(size), generation=str(generation),
        id=f"{bucket}/{name}/{generation}",
        selfLink=f"https://www.googleapis.com/storage/v1/b/{bucket}/o/{encoded}",
        mediaLink=(f"https://storage.googleapis.com/download/storage/v1/b/{bucket}/o/{encoded}"
                   f"?generation={generation}&alt=media"))
    return event


def pubsub_event(payload: bytes | str, topic: str, *, message_id: str | None = None,
                 attributes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The recorded messagePublished event, carrying `payload` on `topic`."""
    event = recorded("pubsub_message_published")
    raw = payload.encode() if isinstance(payload, str) else payload
    message = event["data"]["message"]
    message_id = message_id or str(next(_ids))
    event["id"] = message["messageId"] = message["message_id"] = message_id
    event["source"] = f"//pubsub.googleapis.com/projects/{PROJECT}/topics/{topic}"
    message["data"] = base64.b64encode(raw).decode()
    if attributes:
        message["attributes"] = dict(attributes)
    return event


def post(client: FlaskClient, event: Mapping[str, Any], *, mode: str = "binary") -> TestResponse:
    """POST a CloudEvent: binary mode (ce-* headers, as Eventarc sends) or structured."""
    if mode == "binary":
        headers = {f"ce-{k}": str(v) for k, v in event.items()
                   if k not in ("data", "datacontenttype")}
        return client.post("/", headers=headers, data=json.dumps(event["data"]),
                           content_type=event.get("datacontenttype", "application/json"))
    assert mode == "structured"
    return client.post("/", data=json.dumps(event),
                       content_type="application/cloudevents+json; charset=utf-8")


@dataclass
class Published:
    topic: str
    payload: str
    message_id: str


@dataclass
class FakePubSub:
    """The bus as Pub/Sub: publishing queues a message for push delivery."""

    queue: deque[Published] = field(default_factory=deque)
    published: list[Published] = field(default_factory=list)

    def publish(self, message: Message, attributes: Mapping[str, str] | None = None) -> str:
        item = Published(topic_of(message), message.to_json(), str(next(_ids)))
        self.queue.append(item)
        self.published.append(item)
        return item.message_id

    def kinds(self) -> list[str]:
        return [json.loads(p.payload)["kind"] for p in self.published]


@dataclass
class Delivery:
    function: str
    status: int


@dataclass
class Pipeline:
    """Embedded services behind the functions, and the platform's part around them."""

    home: Path
    services: Services
    pubsub: FakePubSub
    clients: Mapping[str, FlaskClient]
    objects: deque[ObjectInfo] = field(default_factory=deque)
    deliveries: list[Delivery] = field(default_factory=list)

    @property
    def bucket(self) -> Path:
        return self.home / "bucket"

    def drop_xplane(self, name: str = XPLANE_NAME) -> int:
        """Copy the real TPU trace into the bucket as `name`; returns its size."""
        path = self.bucket / name
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(TPU_XPLANE, path)
        path.chmod(0o644)
        return path.stat().st_size

    def post(self, function: str, event: Mapping[str, Any], *,
             mode: str = "binary") -> TestResponse:
        response = post(self.clients[function], event, mode=mode)
        self.deliveries.append(Delivery(function, response.status_code))
        return response

    def sweep(self) -> dict[str, int]:
        """What the Cloud Scheduler sweeper does: settle and re-queue sessions."""
        return stages.sweep(self.services)

    def drain(self, limit: int = 100) -> None:
        """Deliver everything published and written until quiet; a 5xx is redelivered."""
        for _ in range(limit):
            if self.objects:
                info = self.objects.popleft()
                event = storage_event(info.name, size=info.size, generation=info.generation)
                if self.post(STORAGE_FUNCTION, event).status_code >= 500:
                    self.objects.append(info)
            elif self.pubsub.queue:
                item = self.pubsub.queue.popleft()
                event = pubsub_event(item.payload, item.topic, message_id=item.message_id)
                if self.post(FUNCTION_OF_TOPIC[item.topic], event).status_code >= 500:
                    self.pubsub.queue.append(item)
            else:
                return
        raise AssertionError(f"still delivering after {limit} deliveries: {self.deliveries}")


@pytest.fixture(scope="session")
def clients() -> dict[str, FlaskClient]:
    """A functions-framework test client per function, each loaded from functions/<name>."""
    # The stages' functions, plus the two that no message type routes to: the sweeper (Cloud
    # Scheduler) and the dead-letter topics' function.
    names = sorted({handler.__name__ for handler in stages.HANDLERS.values()}
                   | {"sweep", "dead_letters"})
    return {
        name: functions_framework.create_app(
            target=name, source=str(FUNCTIONS / name / "main.py"),
            signature_type="cloudevent").test_client()
        for name in names
    }


@pytest.fixture
def pipeline(tmp_path: Path, clients: dict[str, FlaskClient]) -> Iterator[Pipeline]:
    team_fixture(TPU_XPLANE)
    # No rescan in the sweep: the tests post finalize events with recorded generations,
    # which a listing of the bucket would not match (tests/pipeline tests the rescan).
    services = bootstrap(Settings(home=tmp_path, settle_s=0.0, rescan_interval_s=0)).services
    pubsub = FakePubSub()
    services.bus = pubsub
    p = Pipeline(home=tmp_path, services=services, pubsub=pubsub, clients=clients)
    services.storage.on_finalize = p.objects.append
    entrypoints.set_services(services)
    yield p
    entrypoints.set_services(None)
