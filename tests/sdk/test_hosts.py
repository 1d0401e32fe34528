"""Every process is its own target: host names of processes sharing a machine (stable across
restarts of a job), and how a programmatic session of a multi-process job learns its processes
without any process waiting for another."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mldiag.adapters.local.state import SqliteStateStore
from mldiag.sdk import hosts, machinelearning_run


def test_a_multi_process_job_names_each_process_by_its_index(tmp_path: Path) -> None:
    names = [hosts.claim("r", "vm", process_index=i, process_count=4, lock_dir=tmp_path)
             for i in range(4)]
    assert [n.name for n in names] == ["vm-0", "vm-1", "vm-2", "vm-3"]


def test_independent_processes_on_one_machine_take_the_lowest_free_slot(tmp_path: Path) -> None:
    first = hosts.claim("r", "vm", process_index=0, process_count=1, lock_dir=tmp_path)
    second = hosts.claim("r", "vm", process_index=0, process_count=1, lock_dir=tmp_path)
    other_run = hosts.claim("q", "vm", process_index=0, process_count=1, lock_dir=tmp_path)
    assert (first.name, second.name, other_run.name) == ("vm", "vm-1", "vm")
    first.release()  # that process exited: its name is free again
    assert hosts.claim("r", "vm", process_index=0, process_count=1,
                       lock_dir=tmp_path).name == "vm"
    # A name a live process registered elsewhere (another container, same host name).
    assert hosts.claim("r", "vm", process_index=0, process_count=1, lock_dir=tmp_path,
                       taken=lambda: {"vm", "vm-2"}).name == "vm-3"


def test_the_profiler_port_of_a_shared_machine_is_the_next_free_one(tmp_path: Path) -> None:
    a = hosts.HostSlot("vm")
    b = hosts.HostSlot("vm-1")
    busy = {9999}
    assert a.claim_port(9999, lambda p: p in busy, lock_dir=tmp_path) == 10000
    assert b.claim_port(9999, lambda p: p in busy, lock_dir=tmp_path) == 10001
    a.release()
    assert hosts.HostSlot("vm-2").claim_port(9999, lambda p: False, lock_dir=tmp_path) == 9999


def test_two_runs_of_one_machine_in_one_process_reuse_the_name(sdk_home: Path) -> None:
    run = machinelearning_run(name="a")
    assert run.host == "h0"
    run.close()
    assert machinelearning_run(name="a").host == "h0"  # the closed run gave it back


def test_a_job_process_keeps_its_name_across_restarts(tmp_path: Path) -> None:
    """Process 1 of a job is vm-1 on every attempt, also while the previous attempt's process
    still holds the name's lock (it has not exited yet when its replacement starts)."""
    first = hosts.claim("r", "vm", process_index=1, process_count=2, lock_dir=tmp_path)
    again = hosts.claim("r", "vm", process_index=1, process_count=2, lock_dir=tmp_path)
    first.release()
    after = hosts.claim("r", "vm", process_index=1, process_count=2, lock_dir=tmp_path)
    assert first.name == again.name == after.name == "vm-1"


def test_start_and_stop_wait_for_no_other_process_and_no_state_store(
        sdk_home: Path, sdk_state: SqliteStateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a job of 3 processes where nobody else registered yet, and with a state store that
    does not answer, xprof() starts, captures and stops; the session records the job when the
    store answers, and the trace lands after that."""
    from mldiag.sdk import profiler

    run = machinelearning_run(name="job", heartbeat_s=60.0)
    monkeypatch.setattr("jax.process_count", lambda: 3)
    answer = threading.Event()
    join_session = run.plane.state.join_session

    order: list[str] = []
    write_bytes = run.plane.storage.write_bytes

    def stalled(*args: Any) -> Any:
        assert answer.wait(60)
        order.append("join")
        return join_session(*args)

    def upload(name: str, data: bytes, **kw: Any) -> Any:
        order.append("upload")
        return write_bytes(name, data, **kw)

    monkeypatch.setattr(run.plane.state, "join_session", stalled)
    monkeypatch.setattr(run.plane.storage, "write_bytes", upload)
    took: list[float] = []

    def train() -> None:
        prof = profiler.xprof(session_id="s1")
        for call in (prof.start, prof.stop):
            started = time.monotonic()
            call()
            took.append(time.monotonic() - started)

    trainer = threading.Thread(target=train)
    trainer.start()
    trainer.join(30)
    assert not trainer.is_alive() and len(took) == 2, "the training thread waited"
    assert took[0] < 1.0, took  # start: the profiler's own start only
    assert sdk_state.get_session("job", "s1") is None and order == []  # nothing yet ...
    answer.set()
    assert run.wait_uploads(timeout=60) == ["job/plugins/profile/s1/h0.xplane.pb"]
    assert order == ["join", "upload"]  # ... then the job's record, before the trace
    s = sdk_state.get_session("job", "s1")
    assert s is not None
    assert (s.process_count, s.process_indices, s.processes) == (3, [], {"h0": 0})
    assert s.expected_hosts == [] and s.expected_count == 3 and s.missing_processes() == [1, 2]


def test_a_process_that_starts_after_the_others_stopped_joins_their_session(
        sdk_home: Path, sdk_state: SqliteStateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from mldiag.model import CAPTURING, HostRecord, SessionRecord
    from mldiag.sdk import profiler

    run = machinelearning_run(name="job", heartbeat_s=60.0)
    monkeypatch.setattr("jax.process_count", lambda: 2)
    # Process 1 captured, uploaded and exited before this process (0) reached start().
    now = time.time()
    sdk_state.join_session(SessionRecord(run="job", session="s1", state=CAPTURING,
                                         kind="programmatic", created_at=now, updated_at=now,
                                         process_count=2, process_indices=[0, 1]), "vm-1", 1)
    sdk_state.register_host("job", "s1", "vm-1", HostRecord(
        object_name="job/plugins/profile/s1/vm-1.xplane.pb", generation="1", size=10,
        arrived_at=now), now)
    with profiler.xprof(session_id="s1", process_index_list=[1, 0]):
        pass
    assert run.wait_uploads(timeout=60) == ["job/plugins/profile/s1/h0.xplane.pb"]
    assert [s.session for s in sdk_state.list_sessions(run="job")] == ["s1"]
    s = sdk_state.get_session("job", "s1")
    assert s is not None and s.processes == {"vm-1": 1, "h0": 0} and s.version == 1
    assert s.expected_count == 2 and s.missing_processes() == []
    # A process outside process_index_list captures nothing and joins nothing.
    with profiler.xprof(session_id="s2", process_index_list=[1]):
        pass
    run.wait_uploads(timeout=60)
    assert sdk_state.get_session("job", "s2") is None


def test_a_job_session_fails_at_once_only_when_every_process_failed(
        sdk_home: Path, sdk_state: SqliteStateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from mldiag.model import CAPTURING, FAILED, SessionRecord

    run = machinelearning_run(name="job", heartbeat_s=60.0)
    now = time.time()
    sdk_state.join_session(SessionRecord(run="job", session="s1", state=CAPTURING,
                                         created_at=now, process_count=2), "h0", 0)
    run.fail_host("s1", "the profiler did not start: busy")
    s = sdk_state.get_session("job", "s1")
    assert s is not None and s.state == CAPTURING, "process 1 may still deliver"
    sdk_state.join_session(SessionRecord(run="job", session="s1", state=CAPTURING,
                                         process_count=2), "vm-1", 1)
    sdk_state.register_host("job", "s1", "vm-1", dataclasses.replace(
        s.hosts["h0"], object_name="job/plugins/profile/s1/vm-1.xplane.pb",
        reason="vm-1: busy too"), now)
    run.fail_host("s1", "the profiler did not start: busy")
    s = sdk_state.get_session("job", "s1")
    assert s is not None and s.state == FAILED and "busy" in s.reason
