"""The Bus port: InProcessBus and PubSubBus (on the Pub/Sub emulator) keep one contract.

A published message is durably on its topic when `publish` returns, with its attributes; a
message its consumer keeps failing is delivered `max attempts` times, then dead-lettered.
What "on its topic" means differs by adapter, so each has a probe: the in-process bus's queue
table, or a subscription pulled from the emulator.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

from mldiag.adapters.local.bus import InProcessBus
from mldiag.adapters.local.state import SqliteStateStore
from mldiag.messages import (
    TOPIC_OF,
    AnalyzeSession,
    CaptureProfile,
    ContinuousProfiling,
    DegradationDetected,
    InvestigateSession,
    Message,
    ProfileObjectFinalized,
    RenderReport,
)
from tests.contract.conftest import unique
from tests.emulators import Emulators

MAX_ATTEMPTS = 5
ONE_OF_EACH: list[Message] = [
    DegradationDetected(alert_id="a1", run="r"),
    CaptureProfile(run="r", session="s"),
    ContinuousProfiling(run="r", action="start"),
    ProfileObjectFinalized(bucket="b", name="r/plugins/profile/s/h.xplane.pb", generation="1"),
    AnalyzeSession(run="r", session="s", version=1),
    InvestigateSession(run="r", session="s", version=1),
    RenderReport(run="r", session="s", version=1),
]


class Probe(Protocol):
    def received(self, topic: str, n: int) -> list[tuple[str, dict[str, str]]]:
        """The first `n` messages on `topic` (payload, attributes), waiting for them."""
        ...

    def fail_until_dead(self, topic: str) -> tuple[int, list[str]]:
        """Consume `topic` with a consumer that always fails, until the message is
        dead-lettered: (delivery attempts seen, dead-lettered payloads)."""
        ...


@dataclass
class Subject:
    name: str
    bus: Any
    probe: Probe


def wait[T](fn: Any, what: str, timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value  # type: ignore[no-any-return]
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class InProcessProbe:
    """The in-process bus's topics are rows of its queue table in state.db."""

    def __init__(self, bus: InProcessBus, store: SqliteStateStore) -> None:
        self.bus, self.store = bus, store

    def received(self, topic: str, n: int) -> list[tuple[str, dict[str, str]]]:
        rows = self.store.connection().execute(
            "SELECT payload, attributes FROM messages WHERE topic = ? ORDER BY id",
            (topic,)).fetchall()
        assert len(rows) >= n, f"{len(rows)} message(s) on {topic}, expected {n}"
        return [(p, json.loads(a)) for p, a in rows[:n]]

    def fail_until_dead(self, topic: str) -> tuple[int, list[str]]:
        def always_fail(t: str, payload: str, attributes: Mapping[str, str]) -> None:
            raise RuntimeError("transient forever")

        self.bus.start(always_fail)
        try:
            letters = wait(self.store.list_dead_letters, "a dead letter")
        finally:
            self.bus.stop()
        (attempts,) = self.store.connection().execute(
            "SELECT attempts FROM messages WHERE topic = ?", (topic,)).fetchone()
        return attempts, [d["payload"] for d in letters]


class PubSubProbe:
    """Pulls the subscriptions that ensure_topology made on the emulator."""

    def __init__(self, subscriber: Any, topology: Any) -> None:
        self.subscriber, self.topology = subscriber, topology

    def _pull(self, subscription: str, timeout: float = 5.0) -> list[Any]:
        from google.api_core import exceptions as gexc

        try:
            # The emulator holds an empty pull open until the timeout.
            resp = self.subscriber.pull(subscription=subscription, max_messages=50,
                                        timeout=timeout, retry=None)
        except gexc.DeadlineExceeded:
            return []
        return list(resp.received_messages)

    def received(self, topic: str, n: int) -> list[tuple[str, dict[str, str]]]:
        sub = self.topology.subscriptions[topic]
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            batch = self._pull(sub)
            if batch:
                self.subscriber.acknowledge(subscription=sub, ack_ids=[m.ack_id for m in batch])
            got += batch
        assert len(got) >= n, f"{len(got)} message(s) on {topic}, expected {n}"
        # Pub/Sub does not promise order across a topic's messages.
        return sorted(((m.message.data.decode(), dict(m.message.attributes)) for m in got),
                      key=lambda pa: pa[0])[:n]

    def fail_until_dead(self, topic: str) -> tuple[int, list[str]]:
        sub, dead_sub = (self.topology.subscriptions[topic],
                         self.topology.dead_letter_subscriptions[topic])
        attempts, dead = 0, []
        deadline = time.monotonic() + 60
        while not dead and time.monotonic() < deadline:
            for m in self._pull(sub, timeout=0.5):
                attempts = max(attempts, m.delivery_attempt)
                # A nack: the consumer failed; Pub/Sub redelivers, then dead-letters.
                self.subscriber.modify_ack_deadline(subscription=sub, ack_ids=[m.ack_id],
                                                    ack_deadline_seconds=0)
            dead = [m.message.data.decode() for m in self._pull(dead_sub, timeout=0.2)]
        return attempts, dead


@pytest.fixture(params=["inprocess", pytest.param("pubsub", marks=pytest.mark.emulator)])
def bus(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    if request.param == "inprocess":
        store = SqliteStateStore(tmp_path / "state.db")
        local = InProcessBus(store, max_attempts=MAX_ATTEMPTS, backoff_s=0.01, workers=1,
                             poll_s=0.01)
        yield Subject("InProcessBus", local, InProcessProbe(local, store))
        local.stop()
        return
    from mldiag.adapters.gcp.bus import PubSubBus, ensure_topology

    emu: Emulators = request.getfixturevalue("emu")
    prefix = unique("contract-")
    publisher, subscriber = emu.publisher(), emu.subscriber()
    topology = ensure_topology(emu.project, prefix, publisher=publisher, subscriber=subscriber,
                               max_delivery_attempts=MAX_ATTEMPTS, min_backoff_s=0.0,
                               max_backoff_s=0.1)
    yield Subject("PubSubBus", PubSubBus(emu.project, prefix, publisher=publisher),
                  PubSubProbe(subscriber, topology))
    subscriber.close()


def test_a_published_message_is_on_its_topic_with_its_attributes(bus: Subject) -> None:
    msg = AnalyzeSession(run="r", session="s", version=2)
    message_id = bus.bus.publish(msg, {"origin": "test"})
    assert isinstance(message_id, str) and message_id
    ((payload, attributes),) = bus.probe.received("analysis-requests", 1)
    assert payload == msg.to_json()
    assert attributes["origin"] == "test"


def test_every_message_type_travels_on_its_own_topic(bus: Subject) -> None:
    ids = {bus.bus.publish(m) for m in ONE_OF_EACH}
    assert len(ids) == len(ONE_OF_EACH), "message ids are distinct"
    for topic in sorted(set(TOPIC_OF.values())):
        want = sorted(m.to_json() for m in ONE_OF_EACH if TOPIC_OF[type(m)] == topic)
        got = [p for p, _ in bus.probe.received(topic, len(want))]
        assert sorted(got) == want, topic


def test_a_message_that_always_fails_is_dead_lettered_after_max_attempts(
        bus: Subject) -> None:
    msg = RenderReport(run="r", session="s", version=1)
    bus.bus.publish(msg)
    attempts, dead = bus.probe.fail_until_dead("report-requests")
    assert attempts == MAX_ATTEMPTS
    assert dead == [msg.to_json()]


@pytest.mark.emulator
def test_pubsub_messages_carry_their_kind_for_subscription_filters(emu: Emulators) -> None:
    from mldiag.adapters.gcp.bus import PubSubBus, ensure_topology

    prefix = unique("contract-")
    publisher, subscriber = emu.publisher(), emu.subscriber()
    topology = ensure_topology(emu.project, prefix, publisher=publisher, subscriber=subscriber,
                               topics=["capture-requests"])
    pubsub = PubSubBus(emu.project, prefix, publisher=publisher)
    pubsub.publish(ContinuousProfiling(run="r", action="stop"), {"kind": "spoofed", "x": "1"})
    ((_, attributes),) = PubSubProbe(subscriber, topology).received("capture-requests", 1)
    assert attributes == {"kind": "ContinuousProfiling", "x": "1"}
    assert topology.topics["capture-requests"] == (
        f"projects/{emu.project}/topics/{prefix}capture-requests")
    assert topology.dead_letter_topics["capture-requests"].endswith(
        f"{prefix}capture-requests-dead-letter")
