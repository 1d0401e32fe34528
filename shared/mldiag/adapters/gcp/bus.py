"""PubSubBus: the bus port on Cloud Pub/Sub, and the topology it expects.

Each message type travels on `projects/<project>/topics/<topic_prefix><TOPIC_OF[type]>`.
Delivery, retries and dead-lettering are Pub/Sub's: every topic has a subscription (an
Eventarc trigger in production) with a retry policy and a dead-letter policy that moves a
message to `<topic>-dead-letter` after `max_delivery_attempts`. Terraform creates all of it
in production; `ensure_topology` creates the same for tests and emulators.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud.pubsub_v1 import PublisherClient, SubscriberClient

from mldiag.messages import TOPIC_OF, Message, topic_of

DEAD_LETTER_SUFFIX = "-dead-letter"
MAX_DELIVERY_ATTEMPTS = 5


class PubSubBus:
    """Publish messages to Pub/Sub, waiting for the server's acknowledgement.

    `publisher` is a `PublisherClient` (built on first use when omitted, with the
    ambient credentials).
    """

    def __init__(self, project: str, topic_prefix: str = "mldiag-", *,
                 publisher: PublisherClient | None = None,
                 timeout_s: float = 60.0) -> None:
        if not project:
            raise ValueError("PubSubBus needs a project (MLDIAG_PROJECT)")
        self.project = project
        self.topic_prefix = topic_prefix
        self.timeout_s = timeout_s
        self._publisher = publisher
        self._lock = threading.Lock()

    @property
    def publisher(self) -> PublisherClient:
        # Built on first use, not in the constructor: nothing connects at bootstrap.
        with self._lock:
            if self._publisher is None:
                self._publisher = PublisherClient()
            return self._publisher

    def topic_path(self, topic: str) -> str:
        """The full path of a pipeline topic (`analysis-requests` → its deployed name)."""
        return f"projects/{self.project}/topics/{self.topic_prefix}{topic}"

    def publish(self, message: Message, attributes: Mapping[str, str] | None = None) -> str:
        """Publish `message` as JSON with a `kind` attribute; returns the Pub/Sub message id.

        Waits for the server: a stage acknowledges its own message only after what follows
        it is durably published (a failure raises, and the stage's message is redelivered).
        """
        return self.publish_raw(topic_of(message), message.to_json(),
                                {**(attributes or {}), "kind": message.kind})

    def publish_raw(self, topic: str, payload: str,
                    attributes: Mapping[str, str] | None = None) -> str:
        """Publish an already-serialised payload on a pipeline topic."""
        future = self.publisher.publish(self.topic_path(topic), payload.encode(),
                                        **dict(attributes or {}))
        return str(future.result(timeout=self.timeout_s))


@dataclass(frozen=True)
class Topology:
    """What `ensure_topology` created: topic paths and subscription paths, by topic id."""

    topics: dict[str, str]
    subscriptions: dict[str, str]
    dead_letter_topics: dict[str, str]
    dead_letter_subscriptions: dict[str, str]


def ensure_topology(
    project: str,
    topic_prefix: str = "mldiag-",
    *,
    publisher: PublisherClient,
    subscriber: SubscriberClient,
    topics: Iterable[str] | None = None,
    ack_deadline_s: int = 60,
    max_delivery_attempts: int = MAX_DELIVERY_ATTEMPTS,
    min_backoff_s: float = 10.0,
    max_backoff_s: float = 600.0,
) -> Topology:
    """Create (if absent) each topic, its `-dead-letter` topic, and their subscriptions.

    Topics default to every pipeline topic of `TOPIC_OF`. The subscription of a topic is
    named like the topic; it retries with exponential backoff between `min_backoff_s` and
    `max_backoff_s` and dead-letters after `max_delivery_attempts`. The dead-letter topic gets
    a subscription too (named like it), so that dead letters are kept to be read.

    For tests and emulators: in production terraform owns this topology (and grants the
    Pub/Sub service agent publish on the dead-letter topics and subscribe on the sources).
    """
    names = sorted(set(topics if topics is not None else TOPIC_OF.values()))
    made = Topology({}, {}, {}, {})
    for name in names:
        full = f"{topic_prefix}{name}"
        topic = _create_topic(publisher, publisher.topic_path(project, full))
        dead = _create_topic(publisher, publisher.topic_path(project, full + DEAD_LETTER_SUFFIX))
        sub = _create_subscription(subscriber, {
            "name": subscriber.subscription_path(project, full),
            "topic": topic,
            "ack_deadline_seconds": ack_deadline_s,
            "dead_letter_policy": {"dead_letter_topic": dead,
                                   "max_delivery_attempts": max_delivery_attempts},
            "retry_policy": {"minimum_backoff": _duration(min_backoff_s),
                             "maximum_backoff": _duration(max_backoff_s)},
        })
        dead_sub = _create_subscription(subscriber, {
            "name": subscriber.subscription_path(project, full + DEAD_LETTER_SUFFIX),
            "topic": dead,
            "ack_deadline_seconds": ack_deadline_s,
        })
        made.topics[name], made.dead_letter_topics[name] = topic, dead
        made.subscriptions[name], made.dead_letter_subscriptions[name] = sub, dead_sub
    return made


def _duration(seconds: float) -> dict[str, int]:
    whole = int(seconds)
    return {"seconds": whole, "nanos": int(round((seconds - whole) * 1e9))}


def _create_topic(publisher: PublisherClient, path: str) -> str:
    try:
        publisher.create_topic(name=path)
    except gexc.AlreadyExists:
        pass
    return path


def _create_subscription(subscriber: SubscriberClient,
                         request: dict[str, Any]) -> str:
    try:
        subscriber.create_subscription(request=request)
    except gexc.AlreadyExists:
        pass
    return str(request["name"])
