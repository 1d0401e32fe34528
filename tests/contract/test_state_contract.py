"""The StateStore port: SqliteStateStore and FirestoreStateStore (on the Firestore emulator)
keep one contract: conditional creates, transactions that exactly one contender wins, host
registration with versions, capture reservations and dead letters."""

from __future__ import annotations

from typing import Any

import pytest

from mldiag.model import (
    ANALYZING,
    CAPTURED,
    CAPTURING,
    FAILED,
    INVESTIGATING,
    MAX_PENDING_REQUESTS,
    REPORTED,
    REQUESTED,
    ControlRequest,
    HostRecord,
    MetricPoint,
    RunRecord,
    SessionRecord,
    TargetRecord,
)
from tests.contract.conftest import Subject
from tests.helpers.threads import contend


def host(name: str, generation: str = "1", size: int = 10) -> HostRecord:
    return HostRecord(object_name=f"r/plugins/profile/s/{name}.xplane.pb", generation=generation,
                      size=size, arrived_at=0.0)


# Runs


def test_ensure_run_creates_once_and_keeps_the_first(state: Subject) -> None:
    s = state.adapter
    first = s.ensure_run("r1", discovered=True, now=5)
    again = s.ensure_run("r1", discovered=False, now=9)
    assert (first.discovered, first.created_at) == (True, 5)
    assert (again.discovered, again.created_at) == (True, 5)
    s.ensure_run("r0", discovered=False)
    assert [r.name for r in s.list_runs()] == ["r0", "r1"]
    assert s.get_run("nope") is None


def test_register_run_updates_the_registration_and_keeps_the_rest(state: Subject) -> None:
    s = state.adapter
    s.ensure_run("r", discovered=True, now=5)
    s.set_auto_capture("r", {"enabled": True, "cooldown_s": 60.0})
    s.set_baseline("r", "healthy")
    stored = s.register_run(RunRecord(name="r", run_group="g", configs={"lr": 0.1, "": 1},
                                      storage_prefix="p", on_demand=True, discovered=True,
                                      created_at=99, auto_capture={}))
    assert (stored.run_group, stored.configs, stored.storage_prefix, stored.on_demand) == (
        "g", {"lr": 0.1, "": 1}, "p", True)
    assert not stored.discovered and stored.created_at == 5
    assert stored.auto_capture == {"enabled": True, "cooldown_s": 60.0}
    assert stored.baseline == "healthy"
    assert s.get_run("r") == stored
    fresh = s.register_run(RunRecord(name="new", created_at=7, discovered=True))
    assert not fresh.discovered and fresh.created_at == 7 and s.get_run("new") == fresh


def test_set_auto_capture_replaces_the_policy_of_a_known_run(state: Subject) -> None:
    s = state.adapter
    assert s.set_auto_capture("ghost", {"enabled": True}) is None
    s.ensure_run("r", discovered=False)
    s.set_auto_capture("r", {"enabled": True, "kind": "snapshot"})
    run = s.set_auto_capture("r", {"enabled": False})
    assert run is not None and run.auto_capture == {"enabled": False}
    assert s.get_run("r").auto_capture == {"enabled": False}  # type: ignore[union-attr]


def test_set_baseline_pins_and_unpins_a_session_of_a_known_run(state: Subject) -> None:
    s = state.adapter
    assert s.set_baseline("ghost", "s1") is None
    s.ensure_run("r", discovered=False)
    assert s.get_run("r").baseline == ""  # type: ignore[union-attr]
    run = s.set_baseline("r", "s1")
    assert run is not None and run.baseline == "s1"
    # Another process (function instance) sees it, and the policy is untouched.
    assert state.twin.get_run("r").baseline == "s1"
    s.set_auto_capture("r", {"enabled": True})
    assert s.get_run("r").baseline == "s1"  # type: ignore[union-attr]
    assert s.set_baseline("r", "").baseline == ""  # type: ignore[union-attr]
    assert s.get_run("r").auto_capture == {"enabled": True}  # type: ignore[union-attr]


def test_names_with_separators_and_reserved_forms_stay_apart(state: Subject) -> None:
    s = state.adapter
    names = ["a/b", "a%2Fb", "a~b", "..", "__x__", "r 1", "ü"]
    for n in names:
        s.ensure_run(n, discovered=True)
    assert sorted(r.name for r in s.list_runs()) == sorted(names)
    s.register_host("a~b", "c", "h", host("h"), now=1)
    s.register_host("a", "b~c", "h", host("h"), now=2)
    assert [x.key for x in s.list_sessions()] == ["a/b~c", "a~b/c"]


# Capture reservations


def test_reserve_capture_applies_the_cooldown_and_the_hourly_cap(state: Subject) -> None:
    s = state.adapter
    assert s.reserve_capture("r", 1000.0, cooldown_s=100, max_per_hour=3)
    assert not s.reserve_capture("r", 1050.0, cooldown_s=100, max_per_hour=3), "cooldown"
    assert s.reserve_capture("r", 1100.0, cooldown_s=100, max_per_hour=3)
    assert s.reserve_capture("r", 1200.0, cooldown_s=100, max_per_hour=3)
    assert not s.reserve_capture("r", 1300.0, cooldown_s=100, max_per_hour=3), "3 per hour"
    assert s.reserve_capture("r", 4601.0, cooldown_s=100, max_per_hour=3), "an hour later"
    assert s.reserve_capture("other", 1050.0, cooldown_s=100, max_per_hour=3), "per run"
    # A cooldown longer than the hour still counts from the newest capture.
    assert not s.reserve_capture("r", 8000.0, cooldown_s=7200, max_per_hour=3)


def test_a_redelivered_alert_keeps_its_reservation(state: Subject) -> None:
    s = state.adapter
    assert s.reserve_capture("r", 1000.0, cooldown_s=300, max_per_hour=1, key="alert-1")
    assert s.reserve_capture("r", 1010.0, cooldown_s=300, max_per_hour=1, key="alert-1")
    assert not s.reserve_capture("r", 1010.0, cooldown_s=300, max_per_hour=1, key="alert-2")
    assert not s.reserve_capture("r", 1010.0, cooldown_s=300, max_per_hour=1)
    assert s.reserve_capture("other", 1010.0, cooldown_s=300, max_per_hour=1, key="alert-1")


def test_a_released_reservation_leaves_the_hourly_cap_but_not_the_cooldown(
        state: Subject) -> None:
    s = state.adapter
    assert s.reserve_capture("r", 1000.0, cooldown_s=0, max_per_hour=1, key="alert-1")
    assert not s.reserve_capture("r", 1010.0, cooldown_s=0, max_per_hour=1, key="alert-2")
    s.release_capture("r", "alert-1")  # its capture failed
    s.release_capture("r", "alert-unknown")
    assert s.reserve_capture("r", 1020.0, cooldown_s=0, max_per_hour=1, key="alert-2")
    s.release_capture("r", "alert-2")
    # The cooldown still runs from the failed attempt.
    assert not s.reserve_capture("r", 1030.0, cooldown_s=300, max_per_hour=5, key="alert-3")
    assert s.reserve_capture("r", 1321.0, cooldown_s=300, max_per_hour=5, key="alert-3")
    # A released key is no longer a standing reservation.
    assert not s.reserve_capture("r", 1322.0, cooldown_s=300, max_per_hour=5, key="alert-2")


def test_an_alert_storm_reserves_one_capture(state: Subject) -> None:
    stores = (state.adapter, state.twin)
    won = contend(8, lambda i: stores[i % 2].reserve_capture("r", 1000.0 + i / 100,
                                                             cooldown_s=300, max_per_hour=4))
    assert sum(won) == 1


# Targets


def test_targets_upsert_list_and_update(state: Subject) -> None:
    s = state.adapter
    s.upsert_target(TargetRecord(run="r", host="h1", port=9999, process_index=1))
    s.upsert_target(TargetRecord(run="r", host="h0", port=9999))
    s.upsert_target(TargetRecord(run="r", host="h0", port=9998))
    s.upsert_target(TargetRecord(run="other", host="h9"))
    assert [(t.host, t.port) for t in s.list_targets("r")] == [
        ("h0", 9998), ("h0", 9999), ("h1", 9999)]
    updated = s.update_target("r", "h1", 9999, last_heartbeat=42.0, continuous="RING")
    assert updated is not None and (updated.last_heartbeat, updated.continuous) == (42.0, "RING")
    assert updated.process_index == 1, "other fields are kept"
    assert [t for t in s.list_targets("r") if t.host == "h1"] == [updated]
    assert s.update_target("r", "h7", 9999, last_heartbeat=1.0) is None
    s.upsert_target(TargetRecord(run="r", host="h1", port=9999, process_index=5))
    assert [t.process_index for t in s.list_targets("r") if t.host == "h1"] == [5]


def test_a_conditional_target_update_leaves_a_newer_owners_record(state: Subject) -> None:
    """A process marking its own target stopped (`expect` its pid and registration) must not
    touch the record a newer process of that host and port wrote since."""
    s = state.adapter
    s.upsert_target(TargetRecord(run="r", host="h0", port=9999, pid=11, registered_at=5.0,
                                 last_heartbeat=7.0))
    assert s.update_target("r", "h0", 9999, expect={"pid": 12, "registered_at": 5.0},
                           last_heartbeat=0.0) is None
    assert s.update_target("r", "h0", 9999, expect={"pid": 11, "registered_at": 6.0},
                           last_heartbeat=0.0) is None
    assert [t.last_heartbeat for t in s.list_targets("r")] == [7.0], "the newer owner's"
    stopped = s.update_target("r", "h0", 9999, expect={"pid": 11, "registered_at": 5.0},
                              last_heartbeat=0.0, continuous="OFF")
    assert stopped is not None and (stopped.last_heartbeat, stopped.continuous) == (0.0, "OFF")
    assert s.update_target("r", "h1", 9999, expect={"pid": 11}, last_heartbeat=0.0) is None


def test_a_deleted_run_takes_its_targets_and_sessions_and_leaves_the_others(
        state: Subject) -> None:
    s = state.adapter
    for run in ("gone", "kept"):
        s.ensure_run(run, discovered=False, now=1.0)
        s.upsert_target(TargetRecord(run=run, host="h0"))
        s.create_session(SessionRecord(run=run, session="s1", state="CAPTURING",
                                       created_at=1.0, updated_at=1.0))
    assert s.reserve_capture("gone", 10.0, cooldown_s=0, max_per_hour=1)
    assert s.delete_run("gone") is True
    assert s.get_run("gone") is None and s.list_targets("gone") == []
    assert s.list_sessions(run="gone") == []
    assert s.delete_run("gone") is False
    # A run of that name registered again starts afresh: no reservation counts against it.
    s.ensure_run("gone", discovered=False, now=20.0)
    assert s.reserve_capture("gone", 20.0, cooldown_s=0, max_per_hour=1)
    assert [r.name for r in s.list_runs()] == ["gone", "kept"]
    assert [t.host for t in s.list_targets("kept")] == ["h0"]
    assert [x.session for x in s.list_sessions(run="kept")] == ["s1"]


def test_a_deleted_target_is_gone_on_one_port_or_all(state: Subject) -> None:
    s = state.adapter
    for host, port in (("h0", 9998), ("h0", 9999), ("h1", 9999)):
        s.upsert_target(TargetRecord(run="r", host=host, port=port))
    s.upsert_target(TargetRecord(run="other", host="h0", port=9999))
    assert s.delete_target("r", "h0", 9998) == 1
    assert [(t.host, t.port) for t in s.list_targets("r")] == [("h0", 9999), ("h1", 9999)]
    assert s.delete_target("r", "h0", 9998) == 0, "already gone"
    s.upsert_target(TargetRecord(run="r", host="h0", port=9997))
    assert s.delete_target("r", "h0") == 2
    assert [(t.host, t.port) for t in s.list_targets("r")] == [("h1", 9999)]
    assert s.delete_target("r", "nobody") == 0
    assert [t.host for t in s.list_targets("other")] == ["h0"], "another run's is kept"


@pytest.mark.parametrize("bad", [{"host": "x/y"}, {"host": ".."}, {"host": ""},
                                 {"port": 0}, {"port": 70000}, {"control_port": -1}])
def test_a_target_that_would_write_outside_the_layout_is_refused(
        state: Subject, bad: dict[str, Any]) -> None:
    s = state.adapter
    with pytest.raises(ValueError, match="bad (host name|port|control_port)"):
        s.upsert_target(TargetRecord(**{"run": "r", "host": "h0", **bad}))
    assert s.list_targets("r") == []


# Sessions


def test_create_session_inserts_once(state: Subject) -> None:
    s = state.adapter
    rec = SessionRecord(run="r", session="s", state=REQUESTED, kind="on_demand",
                        expected_hosts=["h0", "h1"], created_at=1)
    stored, created = s.create_session(rec)
    assert created and stored == rec
    other = SessionRecord(run="r", session="s", state=CAPTURING, kind="snapshot")
    stored, created = s.create_session(other)
    assert not created and stored == rec
    assert s.get_session("r", "s") == rec


def test_register_host_creates_the_session_and_dedupes_by_generation(state: Subject) -> None:
    s = state.adapter
    got, new = s.register_host("r", "s", "h0", host("h0", "g1"), now=1,
                               expected_hosts=["h0", "h1"])
    assert new and (got.state, got.version, list(got.hosts)) == (CAPTURING, 1, ["h0"])
    assert got.expected_hosts == ["h0", "h1"] and got.timings == {CAPTURING: 1}
    got, new = s.register_host("r", "s", "h0", host("h0", "g1"), now=2)
    assert not new and got.last_arrival_at == 1
    got, new = s.register_host("r", "s", "h1", host("h1", "g1"), now=3, expected_hosts=["x"])
    assert new and got.complete() and got.expected_hosts == ["h0", "h1"]
    assert s.get_session("r", "s") == got


def test_the_first_host_of_a_requested_session_starts_capturing(state: Subject) -> None:
    s = state.adapter
    s.create_session(SessionRecord(run="r", session="s", state=REQUESTED,
                                   expected_hosts=["h0", "h1"]))
    got, new = s.register_host("r", "s", "h0", host("h0"), now=1)
    assert new and (got.state, got.version) == (CAPTURING, 1) and not got.complete()


@pytest.mark.parametrize("during", [CAPTURED, ANALYZING, INVESTIGATING, REPORTED])
def test_a_new_host_after_capture_starts_the_next_version(state: Subject, during: str) -> None:
    s = state.adapter
    s.register_host("r", "s", "h0", host("h0"), now=1)
    s.transition("r", "s", during, now=2, verdict="OPTIMAL", progress="collected:OPTIMAL",
                 report_path="gs://b/x.html")
    got, new = s.register_host("r", "s", "h0", host("h0"), now=3)
    assert not new and (got.state, got.version) == (during, 1)
    got, new = s.register_host("r", "s", "h1", host("h1"), now=4)
    assert new and (got.state, got.version) == (CAPTURING, 2)
    assert (got.verdict, got.progress, got.report_path, got.reason) == (None, "", "", "")
    assert got.reported_version == (1 if during == REPORTED else 0)
    assert s.transition("r", "s", FAILED, expect=[during], version=1, now=5) is None
    # A rewrite of a known host (a new generation) is new data too.
    got, new = s.register_host("r", "s", "h0", host("h0", "2"), now=6)
    assert new and (got.state, got.version) == (CAPTURING, 2), "still capturing: same version"


def test_a_job_s_processes_join_one_session_whenever_they_start(state: Subject) -> None:
    s = state.adapter
    job = SessionRecord(run="r", session="s", state=CAPTURING, kind="programmatic",
                        created_at=1, process_count=3, process_indices=[0, 2])
    got, created = s.join_session(job, "vm-0", 0)
    assert created and (got.process_count, got.process_indices) == (3, [0, 2])
    assert got.processes == {"vm-0": 0} and not got.complete()
    # Another process sees it; a second join of the same process changes nothing.
    got, created = state.twin.join_session(job, "vm-0", 0)
    assert not created and got.processes == {"vm-0": 0}
    s.register_host("r", "s", "vm-0", host("vm-0"), now=2)
    s.transition("r", "s", REPORTED, now=3, verdict="OPTIMAL")
    # Process 2 starts after the report: it joins the same session (no new one, no new
    # version until its profile arrives), and the job's record is the first process's.
    got, created = s.join_session(SessionRecord(run="r", session="s", state=CAPTURING,
                                                process_count=4), "vm-2", 2)
    assert not created and (got.state, got.version) == (REPORTED, 1)
    assert got.processes == {"vm-0": 0, "vm-2": 2} and got.process_count == 3
    got, new = s.register_host("r", "s", "vm-2", host("vm-2"), now=4)
    assert new and (got.state, got.version) == (CAPTURING, 2) and got.complete()
    assert got.superseded == [{"version": 1, "by": 2, "at": 4, "host": "vm-2",
                               "state": REPORTED}]
    assert s.get_session("r", "s") == got


def test_concurrent_joins_of_a_job_are_all_recorded(state: Subject) -> None:
    s = state.adapter
    job = SessionRecord(run="r", session="s", state=CAPTURING, process_count=8)
    results = contend(8, lambda i: (s if i % 2 else state.twin).join_session(job, f"vm-{i}", i))
    assert sum(created for _, created in results) == 1
    stored = s.get_session("r", "s")
    assert stored is not None and stored.processes == {f"vm-{i}": i for i in range(8)}


def test_a_later_event_fills_in_the_content_hash_of_a_registered_generation(
        state: Subject) -> None:
    s = state.adapter
    s.register_host("r", "s", "h0", host("h0"), now=1)
    hashed = HostRecord(object_name=host("h0").object_name, generation="1", size=10,
                        arrived_at=5.0, content_hash="md5:abc")
    got, changed = s.register_host("r", "s", "h0", hashed, now=5)
    assert changed and got.hosts["h0"].content_hash == "md5:abc" and got.version == 1
    assert got.last_arrival_at == 1 and got.hosts["h0"].arrived_at == 0.0
    assert not s.register_host("r", "s", "h0", hashed, now=6)[1]


def test_transition_checks_the_expected_state_and_version(state: Subject) -> None:
    s = state.adapter
    s.register_host("r", "s", "h0", host("h0"), now=1)
    assert s.transition("r", "s", CAPTURED, expect=[ANALYZING], now=2) is None
    assert s.transition("r", "s", CAPTURED, expect=[CAPTURING], version=2, now=2) is None
    moved = s.transition("r", "s", CAPTURED, expect=[CAPTURING], version=1, now=3)
    assert moved is not None and moved.state == CAPTURED and moved.timings[CAPTURED] == 3
    assert s.get_session("r", "s") == moved
    assert s.transition("r", "nope", CAPTURED, now=4) is None
    # Staying in a state keeps when it was entered; fields change; REPORTED records the version.
    s.transition("r", "s", CAPTURED, expect=[CAPTURED], now=5, progress="p")
    done = s.transition("r", "s", REPORTED, now=6, verdict="NEEDS_ATTENTION",
                        report_path="gs://b/r/summary.html")
    assert done is not None and done.timings[CAPTURED] == 3 and done.progress == "p"
    assert (done.verdict, done.reported_version, done.updated_at) == ("NEEDS_ATTENTION", 1, 6)
    assert s.get_session("r", "s") == done


def test_eight_concurrent_transitions_have_exactly_one_winner(state: Subject) -> None:
    s, stores = state.adapter, (state.adapter, state.twin)
    s.register_host("r", "s", "h0", host("h0"), now=1)
    # Half the contenders in each of two instances: the store's own locks cannot decide.
    results = contend(8, lambda i: stores[i % 2].transition("r", "s", CAPTURED,
                                                            expect=[CAPTURING], version=1,
                                                            now=2 + i))
    assert sum(r is not None for r in results) == 1


def test_concurrent_hosts_of_one_session_are_all_registered(state: Subject) -> None:
    s, stores = state.adapter, (state.adapter, state.twin)
    contend(4, lambda i: stores[i % 2].register_host("r", "s", f"h{i}", host(f"h{i}"),
                                                     now=1 + i))
    got = s.get_session("r", "s")
    assert got is not None and sorted(got.hosts) == [f"h{i}" for i in range(4)]
    assert got.version == 1


def test_list_sessions_filters_by_run_and_state(state: Subject) -> None:
    s = state.adapter
    s.register_host("b", "s1", "h", host("h"), now=1)
    s.register_host("a", "s2", "h", host("h"), now=1)
    s.register_host("a", "s1", "h", host("h"), now=1)
    s.transition("a", "s2", FAILED, now=2, reason="x")
    assert [x.key for x in s.list_sessions()] == ["a/s1", "a/s2", "b/s1"]
    assert [x.key for x in s.list_sessions(run="a")] == ["a/s1", "a/s2"]
    assert [x.key for x in s.list_sessions(state=CAPTURING)] == ["a/s1", "b/s1"]
    assert [x.key for x in s.list_sessions(run="a", state=FAILED)] == ["a/s2"]
    assert s.list_sessions(run="zzz") == []


def test_listeners_see_each_state_change(state: Subject) -> None:
    s = state.adapter
    seen: list[tuple[str, str]] = []
    s.add_listener(lambda rec: seen.append((rec.state, rec.reason)))
    s.register_host("r", "s", "h0", host("h0"), now=1)
    s.transition("r", "s", CAPTURING, now=2, progress="x")
    s.transition("r", "s", FAILED, now=3, reason="h0: empty file (0 bytes)")
    assert seen == [(CAPTURING, ""), (FAILED, "h0: empty file (0 bytes)")]


# Claims


def test_claim_is_a_conditional_create(state: Subject) -> None:
    s = state.adapter
    assert s.claim("object:b/r/plugins/profile/s/h.xplane.pb#1", "a", lease_s=10, now=0)
    assert not s.claim("object:b/r/plugins/profile/s/h.xplane.pb#1", "b", lease_s=10, now=1)
    assert not s.claim("object:b/r/plugins/profile/s/h.xplane.pb#1", "a", lease_s=10, now=2)
    assert s.claim("object:b/r/plugins/profile/s/h.xplane.pb#2", "b", lease_s=10, now=2)


def test_an_expired_claim_can_be_taken_over(state: Subject) -> None:
    s = state.adapter
    assert s.claim("k", "a", lease_s=10, now=0)
    assert not s.claim("k", "b", lease_s=10, now=9.9)
    assert s.claim("k", "b", lease_s=10, now=10.1)
    s.release("k", "a")  # the previous holder's release no longer touches it
    assert not s.claim("k", "c", lease_s=10, now=11)


def test_a_released_claim_can_be_taken_again(state: Subject) -> None:
    s = state.adapter
    assert s.claim("k", "a", lease_s=10, now=0)
    s.release("k", "b")  # not the holder: nothing happens
    assert not s.claim("k", "c", lease_s=10, now=1)
    s.release("k", "a")
    assert s.claim("k", "b", lease_s=10, now=1)


def test_a_completed_claim_never_expires_and_cannot_be_released(state: Subject) -> None:
    s = state.adapter
    assert s.claim("k", "a", lease_s=10, now=0)
    s.complete("k", "a")
    s.release("k", "a")
    assert not s.claim("k", "b", lease_s=10, now=1e9)


def test_a_renewed_claim_outlives_its_first_lease_and_only_its_holder_renews(
        state: Subject) -> None:
    s = state.adapter
    assert s.claim("k", "a", lease_s=10, now=0)
    assert not s.renew("k", "b", lease_s=10, now=5)  # not the holder
    assert s.renew("k", "a", lease_s=10, now=8)
    assert not state.twin.claim("k", "b", lease_s=10, now=15)  # held until 18 now
    assert state.twin.claim("k", "b", lease_s=10, now=18.5)
    assert not s.renew("k", "a", lease_s=10, now=19)  # taken over: no longer a's
    s.complete("k", "b")
    assert not s.renew("k", "b", lease_s=10, now=20)  # done: nothing to keep alive
    assert not s.renew("missing", "a", lease_s=10, now=0)


def test_eight_threads_claiming_one_key_give_one_winner(state: Subject) -> None:
    stores = (state.adapter, state.twin)
    won = contend(8, lambda i: stores[i % 2].claim("event#1", f"w{i}", lease_s=60, now=0))
    assert sum(won) == 1


def test_eight_threads_taking_over_an_expired_claim_give_one_winner(state: Subject) -> None:
    s, stores = state.adapter, (state.adapter, state.twin)
    assert s.claim("event#2", "dead", lease_s=1, now=0)
    won = contend(8, lambda i: stores[i % 2].claim("event#2", f"w{i}", lease_s=60, now=5))
    assert sum(won) == 1


# Pull targets' requests


def request(i: int, host: str = "w0", *, run: str = "r", expires_at: float = 1000.0,
            created_at: float | None = None) -> ControlRequest:
    return ControlRequest(id=f"req-{host}-{i}", run=run, host=host, action="on_demand",
                          session=f"s{i}", created_at=float(i) if created_at is None
                          else created_at, expires_at=expires_at, start_at=5.0,
                          duration_s=1.5, wait_s=2.0, options={"host_tracer_level": 3})


def test_requests_are_taken_once_oldest_first_and_whole(state: Subject) -> None:
    s = state.adapter
    assert s.take_requests("r", "w0", now=1.0) == []
    for i in (2, 0, 1):
        assert s.put_request(request(i), now=1.0)
    assert s.put_request(request(0, host="w1"), now=1.0)
    assert s.put_request(request(0, run="other"), now=1.0)
    taken = s.take_requests("r", "w0", now=1.0)
    assert [r.id for r in taken] == ["req-w0-0", "req-w0-1", "req-w0-2"]
    assert taken[0] == request(0)  # every field comes back as it went in
    assert s.take_requests("r", "w0", now=1.0) == []
    # Other targets' and other runs' mailboxes are their own.
    assert [r.id for r in s.take_requests("r", "w1", now=1.0)] == ["req-w1-0"]
    assert [r.run for r in s.take_requests("other", "w0", now=1.0)] == ["other"]


def test_a_request_put_twice_is_kept_once(state: Subject) -> None:
    s = state.adapter
    assert s.put_request(request(0), now=1.0) and s.put_request(request(0), now=1.0)
    assert len(s.take_requests("r", "w0", now=1.0)) == 1


def test_expired_requests_are_never_taken(state: Subject) -> None:
    s = state.adapter
    assert s.put_request(request(0, expires_at=10.0), now=1.0)
    assert s.put_request(request(1, expires_at=30.0), now=1.0)
    assert [r.id for r in s.take_requests("r", "w0", now=20.0)] == ["req-w0-1"]
    assert s.put_request(request(2, expires_at=10.0), now=1.0)
    assert s.take_requests("r", "w0", now=10.0) == []  # expired at exactly expires_at


def test_a_mailbox_holds_a_bounded_number_of_live_requests(state: Subject) -> None:
    s = state.adapter
    for i in range(MAX_PENDING_REQUESTS):
        assert s.put_request(request(i, expires_at=50.0), now=1.0)
    assert not s.put_request(request(99, expires_at=50.0), now=1.0)
    assert s.put_request(request(0, expires_at=50.0), now=1.0)  # already there: still true
    # Once the pending ones expire, there is room again.
    assert s.put_request(request(100, expires_at=90.0), now=60.0)
    assert [r.id for r in s.take_requests("r", "w0", now=61.0)] == ["req-w0-100"]


def test_a_withdrawn_request_is_never_taken(state: Subject) -> None:
    s = state.adapter
    for i in range(3):
        assert s.put_request(request(i), now=1.0)
    assert s.withdraw_request("r", "w0", "req-w0-1")
    assert not s.withdraw_request("r", "w0", "req-w0-1")
    assert not s.withdraw_request("r", "w1", "req-w0-0")  # another mailbox
    assert [r.id for r in s.take_requests("r", "w0", now=1.0)] == ["req-w0-0", "req-w0-2"]
    assert not s.withdraw_request("r", "w0", "req-w0-0")  # taken


def test_bad_requests_are_refused(state: Subject) -> None:
    s = state.adapter
    for bad, why in (({"host": "a/b"}, "host"), ({"action": "reboot"}, "unknown request"),
                     ({"session": ""}, "needs a session"), ({"id": ""}, "request id")):
        fields = {**request(0).to_dict(), **bad}
        with pytest.raises(ValueError, match=why):
            s.put_request(ControlRequest(**fields), now=1.0)


def test_two_pollers_serve_each_request_exactly_once(state: Subject) -> None:
    s, stores = state.adapter, (state.adapter, state.twin)
    for i in range(MAX_PENDING_REQUESTS):
        assert s.put_request(request(i), now=1.0)
    taken = contend(8, lambda i: [r.id for r in stores[i % 2].take_requests("r", "w0",
                                                                            now=1.0)])
    ids = [i for batch in taken for i in batch]
    assert sorted(ids) == sorted(f"req-w0-{i}" for i in range(MAX_PENDING_REQUESTS))


def test_puts_racing_a_poller_lose_no_request(state: Subject) -> None:
    stores = (state.adapter, state.twin)
    seen: list[str] = []

    def work(i: int) -> None:
        if i % 2:
            seen.extend(r.id for r in stores[0].take_requests("r", "w0", now=1.0))
        else:
            assert stores[1].put_request(request(i), now=1.0)

    contend(8, work)
    seen.extend(r.id for r in state.adapter.take_requests("r", "w0", now=1.0))
    assert sorted(seen) == [f"req-w0-{i}" for i in range(0, 8, 2)]


# Failure counters and dead letters


def test_failures_are_counted_per_key_and_concurrently(state: Subject) -> None:
    s = state.adapter
    assert [s.count_failure("event:1", 10.0) for _ in range(3)] == [1, 2, 3]
    assert s.count_failure("event:2", 11.0) == 1
    stores = (state.adapter, state.twin)
    counts = contend(8, lambda i: stores[i % 2].count_failure("event:3", 12.0))
    assert sorted(counts) == list(range(1, 9)), "no increment is lost"


def test_dead_letters_are_kept_in_order_with_their_reason(state: Subject) -> None:
    s = state.adapter
    assert s.list_dead_letters() == []
    s.record_dead_letter("analysis-requests", "\x00garbage", "poison message: not JSON", 1, 5.0)
    s.record_dead_letter("report-requests", '{"kind": "RenderReport"}', "failed 5 times", 5, 4.0)
    letters: list[dict[str, Any]] = s.list_dead_letters()
    assert [(d["topic"], d["payload"], d["reason"], d["attempts"], d["at"]) for d in letters] == [
        ("analysis-requests", "\x00garbage", "poison message: not JSON", 1, 5.0),
        ("report-requests", '{"kind": "RenderReport"}', "failed 5 times", 5, 4.0)]
    assert len({d["id"] for d in letters}) == 2
    # A CLI waiting on its request reads only what was recorded since it published.
    s.record_dead_letter("capture-requests", '{"session": "s9"}', "unknown run", 1, 9.0)
    assert [d["payload"] for d in s.list_dead_letters(since=4.5)] == [
        "\x00garbage", '{"session": "s9"}']
    assert s.list_dead_letters(since=9.0) == []


# Metrics


def test_recorded_metrics_come_back_per_run_and_name_oldest_first(state: Subject) -> None:
    store = state.adapter
    points = [MetricPoint(name="step_time", at=100.0 + i, value=0.1 * i, step=i, host="h0",
                          labels={"unit": "s"}) for i in range(5)]
    points.insert(2, MetricPoint(name="loss", at=101.5, value=2.5, step=1, host="h0"))
    points.append(MetricPoint(name="notes", at=106.0, host="h0", body={"phase": "eval"},
                              labels={"namespace": "notes", "unit": "1"}))
    store.record_metrics("r", points[:4])
    store.record_metrics("r", points[4:])
    store.record_metrics("other", [MetricPoint(name="step_time", at=100.0, value=9.0)])

    steps = store.list_metrics("r", "step_time")
    assert [(p.step, p.value, p.labels) for p in steps] == [
        (i, 0.1 * i, {"unit": "s"}) for i in range(5)]
    everything = state.twin.list_metrics("r")
    assert [p.name for p in everything] == ["step_time", "step_time", "loss", "step_time",
                                            "step_time", "step_time", "notes"]
    assert everything[-1].body == {"phase": "eval"} and everything[-1].value is None
    assert [p.at for p in store.list_metrics("r", since=103.0)] == [104.0, 106.0]
    assert store.list_metrics("r", "missing") == [] and store.list_metrics("nobody") == []


def test_a_large_batch_of_metrics_is_kept_whole(state: Subject) -> None:
    # More points of one metric than a Firestore document holds, and more metrics than one
    # batched write's 500 documents.
    points = [MetricPoint(name="step_time", at=1000.0 + i, value=float(i), step=i, host="h")
              for i in range(2500)]
    points += [MetricPoint(name=f"m{i}", at=5000.0 + i, value=1.0, host="h") for i in range(600)]
    state.adapter.record_metrics("big", points)
    got = state.adapter.list_metrics("big")
    assert len(got) == 3100 and [p.at for p in got] == [p.at for p in points]
    assert [p.step for p in state.adapter.list_metrics("big", "step_time")] == list(range(2500))


def test_a_limit_gives_the_newest_points_oldest_first(state: Subject) -> None:
    store = state.adapter
    # Two hosts' batches overlap in time, so the newest points span several stored batches.
    for batch in range(6):
        for host, offset in (("h0", 0.0), ("h1", 0.5)):
            store.record_metrics("r", [
                MetricPoint(name="step_time", at=100.0 + 10 * batch + i + offset,
                            value=float(batch), step=10 * batch + i, host=host)
                for i in range(10)] + [MetricPoint(name="loss", at=100.0 + 10 * batch + 9.9,
                                                   value=1.0, host=host)])
    everything = store.list_metrics("r", "step_time")
    assert len(everything) == 120
    newest = store.list_metrics("r", "step_time", limit=25)
    assert newest == everything[-25:]
    assert store.list_metrics("r", limit=3) == store.list_metrics("r")[-3:]
    assert store.list_metrics("r", "step_time", since=155.0, limit=1000) == [
        p for p in everything if p.at > 155.0]


# Indexes (Firestore needs a composite index for each filtered, ordered query)


def _query_shape(query: Any) -> tuple[set[str], tuple[str, ...]]:
    proto = query._to_protobuf()
    where = proto.where
    filters = ([f.field_filter for f in where.composite_filter.filters]
               if "composite_filter" in where else
               [where.field_filter] if "field_filter" in where else [])
    return ({f.field.field_path for f in filters},
            tuple(o.field.field_path for o in proto.order_by))


@pytest.mark.parametrize("run,state_", [(None, None), ("r", None), (None, FAILED), ("r", FAILED)])
def test_every_session_query_has_its_composite_index(run: str | None,
                                                     state_: str | None) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore

    from mldiag.adapters.gcp.state import INDEXES, FirestoreStateStore

    # Building a query connects to nothing.
    client = firestore.Client(project="p", credentials=AnonymousCredentials())
    equal, order = _query_shape(FirestoreStateStore(client=client).sessions_query(run, state_))
    assert equal == {k for k, v in (("run", run), ("state", state_)) if v is not None}
    indexes = [tuple(f["fieldPath"] for f in ix["fields"]) for ix in INDEXES["indexes"]
               if ix["collectionGroup"] == "sessions"]
    if len(equal) + len(order) > 1:
        assert any(set(ix[:len(equal)]) == equal and ix[len(equal):] == order
                   for ix in indexes), f"no index for where {equal} order by {order}"

