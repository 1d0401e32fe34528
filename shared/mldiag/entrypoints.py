"""What the Cloud Functions in `functions/` share: envelope parsing, services, dead letters.

Each function parses its CloudEvent once into a typed view and hands the message to
`mldiag.stages.handle`:

- a GCS `google.cloud.storage.object.v1.finalized` event becomes a `ProfileObjectFinalized`;
- a Pub/Sub `google.cloud.pubsub.topic.v1.messagePublished` event carries the message as
  base64 JSON in `data.message.data`, parsed by `mldiag.messages.parse`.

Errors follow DESIGN.md "Reliability": a bad envelope or a poison message is recorded as a dead
letter with its reason and acknowledged (the function returns, so the platform does not
redeliver it forever); a stage's permanent failure already ends as a FAILED session inside
`stages.handle`; anything else is transient and propagates, so the function answers 500 and
Pub/Sub or Eventarc redelivers.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from mldiag.bootstrap import bootstrap, gcp_services
from mldiag.bootstrap import registrar as bootstrap_registrar
from mldiag.errors import PoisonMessage
from mldiag.messages import TOPIC_OF, Message, ProfileObjectFinalized, parse
from mldiag.registration import Registrar, RegistrationError, authenticate
from mldiag.registration import handle as handle_registration
from mldiag.settings import Settings
from mldiag.stages import Services, dead_lettered

log = logging.getLogger(__name__)

STORAGE_FINALIZED = "google.cloud.storage.object.v1.finalized"
PUBSUB_PUBLISHED = "google.cloud.pubsub.topic.v1.messagePublished"
_PUBSUB_SOURCE = re.compile(r"^//pubsub\.googleapis\.com/projects/[^/]+/topics/([^/]+)$")


class CloudEventLike(Protocol):
    """The part of `cloudevents.http.CloudEvent` (what functions-framework passes) we use."""

    def get(self, key: str, default: Any = None) -> Any: ...

    def get_data(self) -> Any: ...


# Envelopes


def _data_object(event: CloudEventLike) -> dict[str, Any]:
    data = event.get_data()
    if isinstance(data, bytes | str):
        # A sender that did not say `application/json` still sends JSON.
        try:
            data = json.loads(data)
        except ValueError as e:
            raise PoisonMessage(f"{event.get('type')} event data is not JSON: {e}") from e
    if not isinstance(data, dict):
        raise PoisonMessage(
            f"{event.get('type')} event data must be a JSON object, got {type(data).__name__}")
    return data


def _expect_type(event: CloudEventLike, want: str) -> None:
    got = event.get("type")
    if got != want:
        raise PoisonMessage(f"expected a {want} CloudEvent, got type {got!r}")


def profile_object_finalized(event: CloudEventLike) -> ProfileObjectFinalized:
    """The GCS finalize event as a message; PoisonMessage when the envelope is malformed."""
    _expect_type(event, STORAGE_FINALIZED)
    data = _data_object(event)
    values: dict[str, str] = {}
    for key in ("bucket", "name", "generation", "size"):
        value = data.get(key)
        # GCS sends int64 fields (generation, size) as JSON strings; accept numbers too.
        if isinstance(value, int) and not isinstance(value, bool) and key in ("generation",
                                                                                "size"):
            value = str(value)
        if not isinstance(value, str) or not value:
            raise PoisonMessage(f"storage object event: {key} missing or not a string "
                                f"(got {value!r})")
        values[key] = value
    if not values["size"].isdigit():
        raise PoisonMessage(f"storage object event: size {values['size']!r} is not a byte count")
    # Composite objects have no md5Hash; every object has a crc32c.
    digest = next((f"{k}:{data[key]}" for k, key in (("md5", "md5Hash"), ("crc32c", "crc32c"))
                   if isinstance(data.get(key), str) and data[key]), "")
    return ProfileObjectFinalized(bucket=values["bucket"], name=values["name"],
                                  generation=values["generation"], size=int(values["size"]),
                                  content_hash=digest)


def foreign_bucket(msg: ProfileObjectFinalized, settings: Settings) -> bool:
    """Whether a finalize event comes from a bucket other than ours (then it is ignored).

    A trigger on the wrong bucket, or a copied event, must not register objects this
    deployment cannot read. Without a configured bucket (the embedded runtime) none is foreign.
    """
    if settings.bucket and msg.bucket != settings.bucket:
        log.warning("ignored finalize of gs://%s/%s: not the profile bucket %s", msg.bucket,
                    msg.name, settings.bucket)
        return True
    return False


def pubsub_topic(event: CloudEventLike) -> str | None:
    """The topic id in the event source `//pubsub.googleapis.com/projects/P/topics/T`."""
    match = _PUBSUB_SOURCE.match(str(event.get("source") or ""))
    return match.group(1) if match else None


@dataclass(frozen=True)
class PubSubDelivery:
    """A Pub/Sub messagePublished CloudEvent: the message bytes and their metadata."""

    topic: str | None
    subscription: str
    message_id: str
    publish_time: str
    data: bytes
    attributes: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_cloud_event(cls, event: CloudEventLike) -> PubSubDelivery:
        """Parse the envelope; PoisonMessage when it is not a messagePublished event."""
        _expect_type(event, PUBSUB_PUBLISHED)
        envelope = _data_object(event)
        message = envelope.get("message")
        if not isinstance(message, dict):
            raise PoisonMessage("Pub/Sub event: no message object in data")
        encoded = message.get("data")
        if not isinstance(encoded, str) or not encoded:
            raise PoisonMessage("Pub/Sub event: message.data missing (an empty message)")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as e:
            raise PoisonMessage(f"Pub/Sub event: message.data is not base64: {e}") from e
        attributes = message.get("attributes") or {}
        if not isinstance(attributes, dict):
            raise PoisonMessage("Pub/Sub event: message.attributes is not an object")
        return cls(
            topic=pubsub_topic(event),
            subscription=str(envelope.get("subscription") or ""),
            message_id=str(message.get("messageId") or message.get("message_id") or ""),
            publish_time=str(message.get("publishTime") or message.get("publish_time") or ""),
            data=raw,
            attributes={str(k): str(v) for k, v in attributes.items()},
        )

    def message[M: Message](self, expect: type[M]) -> M:
        """The message, which must travel on the topic of the type the function handles."""
        # The receiving function's own topic decides a message without `kind`: deployed topic
        # names may carry a prefix, the function's message type does not change.
        message = parse(self.data, TOPIC_OF[expect])
        if TOPIC_OF[type(message)] != TOPIC_OF[expect]:
            raise PoisonMessage(
                f"{message.kind} delivered to the {expect.kind} function (topic "
                f"{self.topic!r}); it belongs on topic {TOPIC_OF[type(message)]!r}")
        return message  # type: ignore[return-value]  # same topic: the function handles it


def pubsub_message[M: Message](event: CloudEventLike, expect: type[M]) -> M:
    """Parse a Pub/Sub CloudEvent into the message type its function handles."""
    return PubSubDelivery.from_cloud_event(event).message(expect)


# Services: built once per function instance, on first use


_services: Services | None = None
_services_lock = threading.Lock()


def services() -> Services:
    """This instance's services, built from `Settings.from_env()` on the first call."""
    global _services
    with _services_lock:
        if _services is None:
            # The bootstrap is the one place adapters are chosen.
            settings = Settings.from_env()
            if settings.backend == "gcp":
                _services = gcp_services(settings)
            else:
                _services = bootstrap(settings).services
        return _services


def set_services(services: Services | None) -> None:
    """Use these services from now on (tests); None makes the next call build them anew."""
    global _services
    with _services_lock:
        _services = services


_registrar: Registrar | None = None


def registrar() -> Registrar:
    """The registration function's services, built once per instance."""
    global _registrar
    with _services_lock:
        if _registrar is None:
            _registrar = bootstrap_registrar(Settings.from_env())
        return _registrar


def set_registrar(services: Registrar | None) -> None:
    """Use these registration services (tests), or build them again on next use (None)."""
    global _registrar
    with _services_lock:
        _registrar = services


def register(authorization: str, body: bytes, services: Registrar) -> tuple[dict[str, Any], int]:
    """One HTTP request to the registration function: (JSON answer, status).

    A refused request (not signed in, not the caller's run, bad input) is answered with its
    4xx and the reason; anything else propagates (500), and the SDK retries it."""
    try:
        caller = authenticate(authorization, services.settings)
        try:
            request = json.loads(body or b"null")
        except ValueError as e:
            raise RegistrationError(f"the request body is not JSON: {e}") from e
        answer = handle_registration(request, caller, services)
    except RegistrationError as e:
        log.info("registration refused (%d): %s", e.status, e)
        return {"error": str(e)}, e.status
    log.info("registration %s by %s", request.get("op"), caller)
    return answer, 200


# Dead letters


def _dead_letter_view(event: CloudEventLike, topic_prefix: str) -> tuple[str, str]:
    """(topic, payload) to record for an event that could not be processed; never raises.

    The topic is named as TOPIC_OF names it (`analysis-requests`), without the deployment's
    prefix or a dead-letter topic's suffix, as the local runtime records it.
    """
    source = str(event.get("source") or "")
    topic = pubsub_topic(event)
    if topic is not None:
        topic = topic.removesuffix("-dead-letter").removeprefix(topic_prefix)
    topic = topic or (
        TOPIC_OF[ProfileObjectFinalized] if source.startswith("//storage.googleapis.com/")
        else source or "unknown")
    data = event.get_data()
    message = data.get("message") if isinstance(data, dict) else None
    encoded = message.get("data") if isinstance(message, dict) else None
    if isinstance(encoded, str):
        # The Pub/Sub message as published: its text, or its base64 when it is not text.
        try:
            return topic, base64.b64decode(encoded, validate=True).decode()
        except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
            return topic, encoded
    if isinstance(data, bytes):
        return topic, data.decode(errors="replace")
    if isinstance(data, str):
        return topic, data
    return topic, json.dumps(data, sort_keys=True, default=str)


@contextmanager
def dead_letters(event: CloudEventLike, services: Services) -> Iterator[None]:
    """Record a PoisonMessage raised inside as a dead letter and acknowledge the event.

    Every other exception propagates (the function fails and the platform redelivers) until
    this event has failed `MLDIAG_MAX_ATTEMPTS` times here: then it is recorded as a dead
    letter, its session FAILED with the last error, and the event acknowledged.

    The count is kept in the state store by event id, not taken from the platform's delivery
    attempts: a push that Cloud Run refuses while it scales (429) counts as a Pub/Sub delivery
    attempt without ever running the function, so Pub/Sub's own dead-lettering (set far
    higher, terraform's pubsub.tf) is only the last resort for work that never got to run.
    """
    try:
        yield
    except PoisonMessage as e:
        topic, payload = _dead_letter_view(event, services.settings.topic_prefix)
        reason = f"poison message: {e}"
        log.warning("dead-lettered event %s from %s: %s", event.get("id"), topic, reason)
        services.state.record_dead_letter(topic, payload, reason, 1, services.clock())
    except Exception as e:
        event_id = str(event.get("id") or "")
        if not event_id:
            raise
        try:
            failures = services.state.count_failure(f"event:{event_id}", services.clock())
        except Exception:  # noqa: BLE001 - the store is down too: let the platform retry
            log.exception("could not count the failure of event %s", event_id)
            raise e from None
        if failures < services.settings.max_attempts:
            raise
        topic, payload = _dead_letter_view(event, services.settings.topic_prefix)
        reason = f"failed {failures} times, last error: {type(e).__name__}: {e}"
        log.exception("gave up on event %s from %s: %s", event_id, topic, reason)
        services.state.record_dead_letter(topic, payload, reason, failures, services.clock())
        dead_lettered(services, topic, payload, reason)


def record_dead_letter(event: CloudEventLike, services: Services) -> None:
    """A message Pub/Sub gave up on (forwarded to a dead-letter topic): record it, and fail
    the session it names while that session still waits on it."""
    original, payload = _dead_letter_view(event, services.settings.topic_prefix)
    data = event.get_data()
    message = data.get("message") if isinstance(data, dict) else None
    attributes = message.get("attributes") if isinstance(message, dict) else None
    # Pub/Sub stamps forwarded messages with where they came from and how often they failed.
    attempts = (attributes or {}).get("CloudPubSubDeadLetterSourceDeliveryCount", "")
    reason = f"dead-lettered after {attempts or 'several'} delivery attempt(s) on {original}"
    log.warning("%s: %s", reason, payload[:200])
    services.state.record_dead_letter(original, payload, reason,
                                      int(attempts) if str(attempts).isdigit() else 0,
                                      services.clock())
    dead_lettered(services, original, payload, reason)
