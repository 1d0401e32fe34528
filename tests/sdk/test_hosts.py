"""Every process is its own target: host names of processes sharing a machine, and the hosts
a programmatic session of a multi-process job waits for."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from mldiag.adapters.local.state import SqliteStateStore
from mldiag.model import TargetRecord
from mldiag.sdk import hosts, machinelearning_run
from mldiag.sdk.profiler import expected_hosts


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


def _target(host: str, index: int, heartbeat: float) -> TargetRecord:
    return TargetRecord(run="job", host=host, port=9999, process_index=index,
                        last_heartbeat=heartbeat, registered_at=heartbeat, heartbeat_s=60.0)


def test_a_job_session_expects_every_process_and_names_those_that_never_registered(
        sdk_home: Path, sdk_state: SqliteStateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    run = machinelearning_run(name="job", heartbeat_s=60.0)
    now = time.time()
    sdk_state.upsert_target(_target("vm-1", 1, now))
    sdk_state.upsert_target(_target("old-2", 2, now - 3600))  # an earlier attempt's process 2
    started = time.monotonic()
    names, missing = expected_hosts(run, 3, None, wait_s=0.5)
    assert (names, missing) == (["h0", "vm-1"], [2])
    assert time.monotonic() - started >= 0.5  # it waited for process 2 first
    assert expected_hosts(run, 3, [0, 1], wait_s=0.0) == (["h0", "vm-1"], [])

    # Process 2 registers while process 0 waits: the session expects it. The registration
    # comes once process 0 has looked for the job's processes and found process 2 missing.
    looked_in_vain = threading.Event()
    list_targets = run.plane.state.list_targets

    def watched(name: str) -> list[TargetRecord]:
        found = list_targets(name)
        if not any(t.process_index == 2 and t.host == "vm-2" for t in found):
            looked_in_vain.set()
        return found

    monkeypatch.setattr(run.plane.state, "list_targets", watched)
    waited: list[tuple[list[str], list[int]]] = []
    waiter = threading.Thread(
        target=lambda: waited.append(expected_hosts(run, 3, None, wait_s=10.0)))
    waiter.start()
    assert looked_in_vain.wait(10), "process 0 never looked for the job's processes"
    sdk_state.upsert_target(_target("vm-2", 2, time.time()))
    waiter.join(15)
    assert waited == [(["h0", "vm-1", "vm-2"], [])]


def test_the_session_of_a_job_says_which_processes_it_does_not_wait_for(
        sdk_home: Path, sdk_state: SqliteStateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from mldiag.sdk import profiler

    machinelearning_run(name="job", heartbeat_s=60.0)
    monkeypatch.setattr(profiler, "REGISTRATION_WAIT_S", 0.2)
    monkeypatch.setattr("jax.process_count", lambda: 2)
    with profiler.xprof(session_id="s1"):
        pass
    s = sdk_state.get_session("job", "s1")
    assert s is not None and s.expected_hosts == ["h0"]
    assert s.note == ("process 1 of the job had not registered when the capture started: the "
                      "session does not wait for it")
