"""InProcessBus: durable publish, retries with backoff, dead letters, recovery after a crash."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from mldiag.adapters.local.bus import InProcessBus
from mldiag.adapters.local.state import SqliteStateStore
from mldiag.errors import PoisonMessage
from mldiag.messages import AnalyzeSession
from tests.helpers.pipeline import bus_messages
from tests.helpers.wait import wait_until

MSG = AnalyzeSession(run="r", session="s", version=1)


class Recorder:
    """A dispatch callback: records deliveries, and fails the first `fail` of them."""

    def __init__(self, fail: int = 0, error: Exception | None = None) -> None:
        self.fail = fail
        self.error = error or RuntimeError("disk on fire")
        self.calls: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, topic: str, payload: str, attributes: Mapping[str, str]) -> None:
        with self._lock:
            self.calls.append((time.monotonic(), topic, payload))
            n = len(self.calls)
        if n <= self.fail:
            raise self.error


@pytest.fixture
def buses(tmp_path: Path) -> Iterator[list[InProcessBus]]:
    made: list[InProcessBus] = []
    yield made
    for bus in made:
        bus.stop()


def make_bus(path: Path, made: list[InProcessBus], workers: int = 2) -> InProcessBus:
    bus = InProcessBus(SqliteStateStore(path / "state.db"), max_attempts=3, backoff_s=0.05,
                       workers=workers, poll_s=0.02)
    made.append(bus)
    return bus


def test_publish_is_durable_before_any_worker_runs(tmp_path: Path,
                                                   buses: list[InProcessBus]) -> None:
    first = make_bus(tmp_path, buses)
    first.publish(MSG, {"origin": "test"})
    # Another process opening the same state.db sees the message and delivers it.
    second = make_bus(tmp_path, buses)
    assert second.pending() == 1
    got = Recorder()
    second.start(got)
    wait_until(lambda: second.stats().get("done") == 1, what="delivery")
    assert [(t, p) for _, t, p in got.calls] == [("analysis-requests", MSG.to_json())]


def test_a_failing_handler_is_retried_with_backoff_then_succeeds(
        tmp_path: Path, buses: list[InProcessBus]) -> None:
    bus = make_bus(tmp_path, buses)
    got = Recorder(fail=2)
    bus.publish(MSG)
    bus.start(got)
    wait_until(lambda: bus.stats().get("done") == 1, what="delivery after two failures")
    (row,) = bus_messages(bus._store)
    assert row["attempts"] == 3 and row["last_error"] == "RuntimeError: disk on fire"
    gaps = [b[0] - a[0] for a, b in zip(got.calls, got.calls[1:], strict=False)]
    assert gaps[0] >= 0.05 and gaps[1] >= 0.10, f"backoff not exponential: {gaps}"
    assert bus._store.list_dead_letters() == []


def test_after_max_attempts_the_message_is_dead_lettered_with_the_reason(
        tmp_path: Path, buses: list[InProcessBus]) -> None:
    bus = make_bus(tmp_path, buses)
    got = Recorder(fail=99)
    bus.publish(MSG)
    bus.start(got)
    (dead,) = wait_until(bus._store.list_dead_letters, what="a dead letter")
    assert dead["topic"] == "analysis-requests" and dead["payload"] == MSG.to_json()
    assert dead["attempts"] == 3
    assert dead["reason"] == "failed 3 times, last error: RuntimeError: disk on fire"
    assert len(got.calls) == 3
    assert bus.stats() == {"dead": 1} and bus.pending() == 0


def test_a_poison_message_is_dead_lettered_at_once(tmp_path: Path,
                                                    buses: list[InProcessBus]) -> None:
    bus = make_bus(tmp_path, buses)
    got = Recorder(fail=99, error=PoisonMessage("unknown run 'ghost'"))
    bus.publish(MSG)
    bus.start(got)
    (dead,) = wait_until(bus._store.list_dead_letters, what="a dead letter")
    assert dead["reason"] == "poison message: unknown run 'ghost'" and dead["attempts"] == 1
    assert len(got.calls) == 1


def test_recover_puts_messages_in_flight_back(tmp_path: Path,
                                              buses: list[InProcessBus]) -> None:
    # One worker, stuck in the handler: it stands in for a process that died mid-delivery.
    crashed = make_bus(tmp_path, buses, workers=1)
    crashed.publish(MSG)
    release = threading.Event()
    started = threading.Event()

    def stuck(topic: str, payload: str, attributes: Mapping[str, str]) -> None:
        started.set()
        release.wait(30)

    crashed.start(stuck)
    assert started.wait(30)
    assert crashed.stats() == {"inflight": 1}
    restarted = make_bus(tmp_path, buses)
    assert restarted.recover() == 1
    assert restarted.recover() == 0
    got = Recorder()
    restarted.start(got)
    wait_until(lambda: got.calls, what="redelivery after recover()")
    release.set()
    assert [p for _, _, p in got.calls] == [MSG.to_json()]


def test_many_publishers_and_workers_deliver_every_message_once(
        tmp_path: Path, buses: list[InProcessBus]) -> None:
    bus = make_bus(tmp_path, buses)
    got = Recorder()
    bus.start(got)

    def publish(i: int) -> None:
        for v in range(25):
            bus.publish(AnalyzeSession(run=f"r{i}", session="s", version=v + 1))

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    wait_until(lambda: bus.stats().get("done") == 100, what="100 deliveries")
    payloads = [p for _, _, p in got.calls]
    assert len(payloads) == len(set(payloads)) == 100


def test_topic_priorities_order_delivery_then_age(tmp_path: Path,
                                                  buses: list[InProcessBus]) -> None:
    bus = InProcessBus(SqliteStateStore(tmp_path / "state.db"), workers=1, poll_s=0.02,
                       priorities={"report-requests": 0, "analysis-requests": 1})
    buses.append(bus)
    for i in range(3):
        bus.publish_raw("analysis-requests", f"a{i}")
        bus.publish_raw("other", f"o{i}")
        bus.publish_raw("report-requests", f"r{i}")
    got = Recorder()
    bus.start(got)
    wait_until(lambda: bus.stats().get("done") == 9, what="9 deliveries")
    assert [p for _, _, p in got.calls] == ["r0", "r1", "r2", "a0", "a1", "a2", "o0", "o1",
                                            "o2"]


def test_a_message_the_process_keeps_dying_on_is_dead_lettered_at_restart(
        tmp_path: Path, buses: list[InProcessBus]) -> None:
    store = SqliteStateStore(tmp_path / "state.db")
    dead_seen: list[tuple[str, str, str]] = []
    release = threading.Event()  # set only at the end: until then each "process" is dead
    try:
        for attempt in (1, 2):
            started = threading.Event()

            def dies(topic: str, payload: str, attributes: Mapping[str, str],
                     started: threading.Event = started) -> None:
                started.set()
                release.wait(30)

            # Each "process" takes the message and never finishes it (killed mid-delivery).
            bus = InProcessBus(SqliteStateStore(tmp_path / "state.db"), max_attempts=2,
                               workers=1, poll_s=0.02, on_dead=lambda *a: dead_seen.append(a))
            buses.append(bus)
            if attempt == 1:
                bus.publish(MSG)
            else:
                assert bus.recover() == 1
            bus.start(dies)
            assert started.wait(30)
            bus._stop.set()  # its worker takes nothing more
        restarted = InProcessBus(SqliteStateStore(tmp_path / "state.db"), max_attempts=2,
                                 on_dead=lambda *a: dead_seen.append(a))
        assert restarted.recover() == 0
        (dead,) = store.list_dead_letters()
        assert dead["reason"] == (
            "the runtime stopped 2 times while handling it (a crash or a kill)")
        assert dead_seen == [("analysis-requests", MSG.to_json(), dead["reason"])]
        assert restarted.pending() == 0
    finally:
        release.set()


def test_stop_waits_for_the_messages_in_progress_within_one_deadline(
        tmp_path: Path, buses: list[InProcessBus]) -> None:
    # Two workers, both stuck in their handler: stop() gives up on them after its timeout in
    # all (not once per worker), and the messages stay in flight for the next start.
    bus = make_bus(tmp_path, buses, workers=2)
    bus.publish(MSG)
    bus.publish(AnalyzeSession(run="r", session="t", version=1))
    release = threading.Event()
    started: list[str] = []

    def stuck(topic: str, payload: str, attributes: Mapping[str, str]) -> None:
        started.append(payload)
        release.wait(30)

    bus.start(stuck)
    wait_until(lambda: len(started) == 2, what="both workers busy")
    t0 = time.monotonic()
    bus.stop(timeout=1.0)
    waited = time.monotonic() - t0
    # Read before the handlers are let go: one that finishes afterwards acknowledges its
    # message (seen once in CI: {'done': 1, 'inflight': 1}).
    stats = bus.stats()
    release.set()
    assert 0.9 <= waited < 1.9, waited  # one deadline: 1 s, not 2 s
    assert stats == {"inflight": 2}
