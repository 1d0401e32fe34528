"""SqliteStateStore: claims, conditional transitions under contention, host registration."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from mldiag.adapters.local.state import SqliteStateStore
from mldiag.model import ANALYZING, CAPTURED, CAPTURING, FAILED, REPORTED, HostRecord, SessionRecord


@pytest.fixture
def store(tmp_path: Path) -> SqliteStateStore:
    return SqliteStateStore(tmp_path / "state.db")


def host(name: str, generation: str = "1", size: int = 10) -> HostRecord:
    return HostRecord(object_name=f"r/plugins/profile/s/{name}.xplane.pb", generation=generation,
                      size=size, arrived_at=0.0)


# Claims


def test_claim_is_a_conditional_create(store: SqliteStateStore) -> None:
    assert store.claim("k", "a", lease_s=10, now=0)
    assert not store.claim("k", "b", lease_s=10, now=1)
    assert not store.claim("k", "a", lease_s=10, now=2), "the holder cannot take it twice"


def test_an_expired_claim_can_be_taken_over(store: SqliteStateStore) -> None:
    assert store.claim("k", "a", lease_s=10, now=0)
    assert not store.claim("k", "b", lease_s=10, now=9.9)
    assert store.claim("k", "b", lease_s=10, now=10.1)
    # The previous holder's release no longer touches a claim it lost.
    store.release("k", "a")
    assert not store.claim("k", "c", lease_s=10, now=11)


def test_a_released_claim_can_be_taken_again(store: SqliteStateStore) -> None:
    assert store.claim("k", "a", lease_s=10, now=0)
    store.release("k", "a")
    assert store.claim("k", "b", lease_s=10, now=1)


def test_a_completed_claim_never_expires_and_cannot_be_released(store: SqliteStateStore) -> None:
    assert store.claim("k", "a", lease_s=10, now=0)
    store.complete("k", "a")
    store.release("k", "a")
    assert not store.claim("k", "b", lease_s=10, now=1e9)


def test_restart_drops_claims_held_by_the_dead_process_only(store: SqliteStateStore) -> None:
    store.claim("held", "dead", lease_s=300, now=0)
    store.claim("done", "dead", lease_s=300, now=0)
    store.complete("done", "dead")
    assert store.release_all_held() == 1
    assert store.claim("held", "new", lease_s=300, now=1)
    assert not store.claim("done", "new", lease_s=300, now=1)


def test_eight_threads_claiming_the_same_key_give_one_winner(tmp_path: Path) -> None:
    store = SqliteStateStore(tmp_path / "state.db")
    barrier = threading.Barrier(8)
    wins: list[str] = []

    def contend(owner: str) -> None:
        barrier.wait()
        if store.claim("event#1", owner, lease_s=60, now=0):
            wins.append(owner)

    threads = [threading.Thread(target=contend, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(wins) == 1


# Transitions


def test_transition_checks_expected_state_and_version(store: SqliteStateStore) -> None:
    store.register_host("r", "s", "h0", host("h0"), now=1)
    assert store.transition("r", "s", CAPTURED, expect=[ANALYZING], now=2) is None
    assert store.transition("r", "s", CAPTURED, expect=[CAPTURING], version=2, now=2) is None
    moved = store.transition("r", "s", CAPTURED, expect=[CAPTURING], version=1, now=3)
    assert moved is not None and moved.state == CAPTURED
    assert store.get_session("r", "s").state == CAPTURED  # type: ignore[union-attr]
    assert store.transition("r", "nope", CAPTURED, now=4) is None


def test_eight_concurrent_transitions_have_exactly_one_winner(tmp_path: Path) -> None:
    store = SqliteStateStore(tmp_path / "state.db")
    store.register_host("r", "s", "h0", host("h0"), now=1)
    barrier = threading.Barrier(8)
    results: list[SessionRecord | None] = []
    lock = threading.Lock()

    def contend() -> None:
        barrier.wait()
        moved = store.transition("r", "s", CAPTURED, expect=[CAPTURING], version=1, now=2)
        with lock:
            results.append(moved)

    threads = [threading.Thread(target=contend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 8
    assert sum(r is not None for r in results) == 1


def test_transition_records_when_a_state_was_entered_not_last_touched(
        store: SqliteStateStore) -> None:
    store.register_host("r", "s", "h0", host("h0"), now=1)
    store.transition("r", "s", ANALYZING, now=2)
    # A progress update within the same state (and the sweeper's touch) keeps the entry time.
    store.transition("r", "s", ANALYZING, expect=[ANALYZING], now=5, progress="collected:x")
    s = store.get_session("r", "s")
    assert s is not None
    assert s.timings[ANALYZING] == 2
    assert s.updated_at == 5 and s.progress == "collected:x"


def test_failed_carries_its_reason_and_listeners_see_each_change(
        store: SqliteStateStore) -> None:
    seen: list[tuple[str, str]] = []
    store.add_listener(lambda s: seen.append((s.state, s.reason)))
    store.register_host("r", "s", "h0", host("h0"), now=1)
    store.transition("r", "s", FAILED, now=2, reason="h0: empty file (0 bytes)")
    assert seen == [(CAPTURING, ""), (FAILED, "h0: empty file (0 bytes)")]


# Host registration


def test_register_host_creates_the_session_and_dedupes_by_generation(
        store: SqliteStateStore) -> None:
    s, new = store.register_host("r", "s", "h0", host("h0", "g1"), now=1)
    assert new and s.state == CAPTURING and s.version == 1 and list(s.hosts) == ["h0"]
    s, new = store.register_host("r", "s", "h0", host("h0", "g1"), now=2)
    assert not new and s.last_arrival_at == 1
    s, new = store.register_host("r", "s", "h1", host("h1", "g1"), now=3)
    assert new and sorted(s.hosts) == ["h0", "h1"] and s.last_arrival_at == 3


def test_a_host_after_the_report_starts_the_next_version(store: SqliteStateStore) -> None:
    store.register_host("r", "s", "h0", host("h0"), now=1)
    store.transition("r", "s", REPORTED, now=2, verdict="OPTIMAL", progress="investigated")
    # The same object again (a duplicate event) changes nothing.
    s, new = store.register_host("r", "s", "h0", host("h0"), now=3)
    assert not new and s.state == REPORTED and s.version == 1
    s, new = store.register_host("r", "s", "h1", host("h1"), now=4)
    assert new
    assert (s.state, s.version, s.reported_version) == (CAPTURING, 2, 1)
    assert s.verdict is None and s.progress == "" and sorted(s.hosts) == ["h0", "h1"]
    # A rewrite of a host already seen (new generation) is new data too.
    store.transition("r", "s", REPORTED, now=5, verdict="OPTIMAL")
    s, new = store.register_host("r", "s", "h0", host("h0", "2"), now=6)
    assert new and (s.state, s.version, s.reported_version) == (CAPTURING, 3, 2)


def test_state_survives_reopening_the_database(tmp_path: Path) -> None:
    first = SqliteStateStore(tmp_path / "state.db")
    first.ensure_run("r", discovered=True)
    first.register_host("r", "s", "h0", host("h0"), now=1)
    first.record_dead_letter("t", "{}", "poison message: x", 1, now=2)
    again = SqliteStateStore(tmp_path / "state.db")
    run = again.get_run("r")
    assert run is not None and run.discovered
    assert again.get_session("r", "s") is not None
    assert [d["reason"] for d in again.list_dead_letters()] == ["poison message: x"]


def test_list_sessions_filters_by_run_and_state(store: SqliteStateStore) -> None:
    store.register_host("a", "s1", "h", host("h"), now=1)
    store.register_host("a", "s2", "h", host("h"), now=1)
    store.register_host("b", "s1", "h", host("h"), now=1)
    store.transition("a", "s2", FAILED, now=2, reason="x")
    assert [s.key for s in store.list_sessions(run="a")] == ["a/s1", "a/s2"]
    assert [s.key for s in store.list_sessions(state=CAPTURING)] == ["a/s1", "b/s1"]
    assert [s.key for s in store.list_sessions(run="a", state=FAILED)] == ["a/s2"]


@pytest.mark.parametrize("state", [CAPTURED, ANALYZING, "INVESTIGATING"])
def test_a_host_during_the_analysis_starts_the_next_version(store: SqliteStateStore,
                                                            state: str) -> None:
    store.register_host("r", "s", "h0", host("h0"), now=1)
    store.transition("r", "s", state, now=2, progress="collected:NEEDS_ATTENTION")
    s, new = store.register_host("r", "s", "h0", host("h0"), now=3)
    assert not new and (s.state, s.version) == (state, 1)
    s, new = store.register_host("r", "s", "h1", host("h1"), now=4)
    assert new and (s.state, s.version, s.progress) == (CAPTURING, 2, "")
    # Work still in flight for version 1 no longer matches.
    assert store.transition("r", "s", REPORTED, expect=[state], version=1, now=5) is None


def test_the_first_host_of_a_requested_session_starts_capturing(
        store: SqliteStateStore) -> None:
    store.create_session(SessionRecord(run="r", session="s", state="REQUESTED",
                                       expected_hosts=["h0", "h1"]))
    s, new = store.register_host("r", "s", "h0", host("h0"), now=1)
    assert new and (s.state, s.version) == (CAPTURING, 1) and not s.complete()
    s, _ = store.register_host("r", "s", "h1", host("h1"), now=2)
    assert s.complete()
