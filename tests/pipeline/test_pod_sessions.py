"""One analysis per complete session (DESIGN.md "Pods"): hosts dropped together register
together and are analysed as one version; a session that does not know its hosts stays open
while uploads go on; a job's session waits for every process of the job; a superseded
version's work stops and the session says so."""

from __future__ import annotations

import base64
import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mldiag import stages
from mldiag.analysis.collection.workers import Job, run_jobs
from mldiag.bootstrap import LocalRuntime
from mldiag.cli.main import main
from mldiag.messages import AnalyzeSession, ProfileObjectFinalized, parse
from mldiag.model import ANALYZING, CAPTURED, CAPTURING, HostRecord, SessionRecord
from mldiag.stages import analysis as analysis_stage
from mldiag.stages import sessions, sweep
from mldiag.stages.intake import complete_session
from mldiag.stages.maintenance import settle_wait
from tests.helpers.clock import SkewedClock
from tests.helpers.pipeline import (
    RUN,
    SESSION,
    MakeRuntime,
    bus_messages,
    kinds,
    object_name,
    session_of,
)
from tests.helpers.wait import wait_until

REPO = Path(__file__).resolve().parents[2]


def _deliver_arrivals(rt: LocalRuntime) -> int:
    """Hand the queued finalize events to intake, as the bus would (the runtime is not
    started, so nothing else moves)."""
    rows = bus_messages(rt.state, "profile-objects")
    for row in rows:
        message = parse(row["payload"])
        assert isinstance(message, ProfileObjectFinalized)
        stages.on_profile_object(message, rt.services)
    return len(rows)


def _plant(rt: LocalRuntime, host: str, size: int, *, age_s: float = 10.0) -> Path:
    """A sparse profile of `size` bytes, written `age_s` ago (as a copy that finished)."""
    path = rt.storage.root / object_name(host)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
    past = time.time() - age_s
    os.utime(path, (past, past))
    return path


def test_hosts_dropped_together_register_before_they_are_hashed_and_are_one_version(
        make_runtime: MakeRuntime) -> None:
    clock = SkewedClock()
    rt = make_runtime(clock=clock, rescan_interval_s=0)
    size = 192 * 1024**2
    paths = [_plant(rt, f"h{i}", size) for i in range(4)]
    started = time.perf_counter()
    digest = hashlib.md5(usedforsecurity=False)
    with open(paths[0], "rb") as f:
        while chunk := f.read(8 * 1024**2):
            digest.update(chunk)
    one_hash_s = time.perf_counter() - started

    started = time.perf_counter()
    assert rt.watcher.scan() == 4  # every finalize event is out ...
    emitted_s = time.perf_counter() - started
    assert _deliver_arrivals(rt) == 4
    registered_s = time.perf_counter() - started
    # ... and every host registered, in less than a quarter of one file's hash (hashing first
    # took four hashes before the last host registered).
    assert registered_s < one_hash_s / 4, (emitted_s, registered_s, one_hash_s)
    s = session_of(rt)
    assert sorted(s.hosts) == ["h0", "h1", "h2", "h3"] and s.state == CAPTURING
    # The hashes come afterwards, in the background, for the same-bytes check of a rewrite.
    infos = [rt.storage.stat(object_name(f"h{i}")) for i in range(4)]
    wait_until(lambda: all(rt.storage.known_hash(i) for i in infos if i is not None),
               what="the background hashes", timeout=60)
    assert rt.storage.known_hash(infos[0]) == "md5:" + base64.b64encode(
        digest.digest()).decode()

    clock.advance(rt.services.settings.settle_s + 0.1)
    assert sweep(rt.services)["settled"] == 1
    s = session_of(rt)
    assert (s.state, s.version) == (CAPTURED, 1)
    assert [m["payload"] for m in kinds(rt, "AnalyzeSession")] == [
        AnalyzeSession(run=RUN, session=SESSION, version=1).to_json()]
    assert s.superseded == []


def _arrive(rt: LocalRuntime, host: str, data: bytes = b"xplane") -> None:
    rt.storage.write_bytes(object_name(host), data + host.encode())
    _deliver_arrivals_of(rt, host)


def _deliver_arrivals_of(rt: LocalRuntime, host: str) -> None:
    for row in bus_messages(rt.state, "profile-objects"):
        message = parse(row["payload"])
        assert isinstance(message, ProfileObjectFinalized)
        if message.name == object_name(host):
            stages.on_profile_object(message, rt.services)


def test_a_session_stays_open_while_a_profile_of_its_directory_is_being_written(
        make_runtime: MakeRuntime) -> None:
    clock = SkewedClock()
    rt = make_runtime(clock=clock, stuck_after_s=600, rescan_interval_s=0)
    _arrive(rt, "h0")
    # h1 is still being copied in: in the directory, not registered.
    growing = _plant(rt, "h1", 1024, age_s=0)
    clock.advance(rt.services.settings.settle_s * 10)
    assert sweep(rt.services)["settled"] == 0
    assert session_of(rt).state == CAPTURING
    # The copy finished and the watcher registered it: the session settles with both.
    growing.write_bytes(b"the whole profile")
    past = time.time() - 5
    os.utime(growing, (past, past))
    assert rt.watcher.scan() == 1
    _deliver_arrivals_of(rt, "h1")
    # (Twice the gap between the two arrivals, by the settle rule.)
    clock.advance(settle_wait(session_of(rt), rt.services.settings) + 0.1)
    assert sweep(rt.services)["settled"] == 1
    s = session_of(rt)
    assert (s.state, s.version, sorted(s.hosts)) == (CAPTURED, 1, ["h0", "h1"])
    # Past the stuck window a file that never finishes no longer holds a session open.
    _arrive(rt, "h0", b"other")
    _plant(rt, "h9", 10, age_s=0)
    clock.advance(599)
    assert sweep(rt.services)["settled"] == 0
    clock.advance(2)
    assert sweep(rt.services)["settled"] == 1


def test_hosts_uploading_one_after_another_keep_the_session_open_for_twice_the_gap(
        make_runtime: MakeRuntime) -> None:
    clock = SkewedClock()
    rt = make_runtime(clock=clock, settle_s=2.0, settle_max_s=60.0, rescan_interval_s=0)
    _arrive(rt, "h0")
    clock.advance(1.5)  # within the settle window: h1 is the same upload burst
    _arrive(rt, "h1")
    clock.advance(10.0)  # GCS shows nothing in flight; the 10 s gap says uploads are slow
    _arrive(rt, "h2")
    s = session_of(rt)
    assert settle_wait(s, rt.services.settings) == pytest.approx(20.0, abs=0.1)
    clock.advance(15.0)
    assert sweep(rt.services)["settled"] == 0, "a 15 s quiet is within twice the 10 s gap"
    clock.advance(5.5)
    assert sweep(rt.services)["settled"] == 1
    assert (session_of(rt).state, session_of(rt).version) == (CAPTURED, 1)
    # Bounded: an hour between two arrivals waits settle_max_s, not two hours.
    s.hosts["h2"].arrived_at = s.hosts["h1"].arrived_at + 3600
    assert settle_wait(s, rt.services.settings) == 60.0


def _job_session(rt: LocalRuntime, processes: int, joined: dict[str, int]) -> None:
    now = rt.services.clock()
    rt.state.ensure_run(RUN, discovered=False, now=now)
    for host, index in joined.items():
        rt.state.join_session(SessionRecord(
            run=RUN, session=SESSION, state=CAPTURING, created_at=now, updated_at=now,
            process_count=processes), host, index)


def test_a_job_session_waits_for_every_process_however_late_then_analyses_once(
        make_runtime: MakeRuntime) -> None:
    clock = SkewedClock()
    rt = make_runtime(clock=clock, stuck_after_s=600, rescan_interval_s=0)
    _job_session(rt, 2, {"vm-0": 0})
    _arrive(rt, "vm-0")
    # Long past the settle window, short of the stuck one: process 1 has not come yet.
    clock.advance(300)
    assert sweep(rt.services)["settled"] == 0
    assert session_of(rt).state == CAPTURING and kinds(rt, "AnalyzeSession") == []
    # Process 1 starts long after process 0 finished, joins the same session, uploads.
    _job_session(rt, 2, {"vm-1": 1})
    assert session_of(rt).state == CAPTURING
    _arrive(rt, "vm-1")
    s = session_of(rt)
    assert (s.state, s.version, sorted(s.hosts)) == (CAPTURED, 1, ["vm-0", "vm-1"])
    assert s.processes == {"vm-0": 0, "vm-1": 1} and s.note == ""
    assert len(kinds(rt, "AnalyzeSession")) == 1


def test_a_process_that_never_comes_is_named_after_the_stuck_window(
        make_runtime: MakeRuntime, capsys: pytest.CaptureFixture[str]) -> None:
    clock = SkewedClock()
    rt = make_runtime(clock=clock, stuck_after_s=600, rescan_interval_s=0)
    # Process 1 joined but its trace never came; process 2 never even joined.
    _job_session(rt, 3, {"vm-0": 0, "vm-1": 1})
    _arrive(rt, "vm-0")
    clock.advance(599)
    assert sweep(rt.services)["settled"] == 0
    clock.advance(2)
    assert sweep(rt.services)["settled"] == 1
    s = session_of(rt)
    assert (s.state, s.version) == (CAPTURED, 1)
    assert s.hosts["vm-1"].status == "FAILED" and "did not arrive within 600 s" in (
        s.hosts["vm-1"].reason)
    assert s.note == ("process 2 of the job's 3 did not join the session within 600 s: "
                      "analysed without it")
    code, out = _describe(rt, capsys)
    assert code == 0 and "hosts:    2 of 3 processes of the job" in out
    assert "not joined yet: process 2" in out


def _describe(rt: LocalRuntime, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["sessions", "describe", f"{RUN}/{SESSION}", "--home",
                 str(rt.services.settings.home)])
    return code, capsys.readouterr().out


def test_a_superseded_version_stops_its_collection_and_the_session_says_so(
        make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # The workers are fresh interpreters: let them import the test's job.
    monkeypatch.setenv("PYTHONPATH", f"{REPO}{os.pathsep}{REPO / 'shared'}")
    monkeypatch.setattr(sessions, "SUPERSEDED_CHECK_S", 0.2)
    pid_file = tmp_path / "worker.pid"

    def long_collection(session: Any, **options: Any) -> dict[str, Any]:
        # The collection's jobs, stood in by one that runs for a minute.
        run_jobs([Job(name="slow", group="a", runner="tests.unit.worker_jobs:sleep_noting_pid")],
                 setup="tests.unit.worker_jobs:setup", setup_args={}, budget_bytes=8 * 1024**3,
                 default_timeout_s=120.0, inputs_for=lambda job, done: {"pid_file": str(pid_file)})
        raise AssertionError("the collection was not stopped")

    monkeypatch.setattr(analysis_stage, "collect_snapshot", long_collection)
    rt = make_runtime(rescan_interval_s=0)
    _arrive(rt, "h0")
    assert complete_session(rt.services, session_of(rt))
    finished = threading.Event()

    def collect() -> None:
        analysis_stage.collect(AnalyzeSession(run=RUN, session=SESSION, version=1), rt.services)
        finished.set()

    worker = threading.Thread(target=collect, daemon=True)
    worker.start()
    pid = int(wait_until(lambda: pid_file.is_file() and pid_file.read_text(),
                         what="the collection's job", timeout=60))
    assert session_of(rt).state == ANALYZING
    _arrive(rt, "h1")  # a host after the analysis started: version 2
    superseded_at = time.monotonic()
    assert finished.wait(10), "version 1's collection did not stop"
    assert time.monotonic() - superseded_at < 5
    wait_until(lambda: not _alive(pid), what="the killed worker", timeout=10)
    s = session_of(rt)
    assert (s.state, s.version) == (CAPTURING, 2)
    assert [(x["version"], x["by"], x["host"], x["state"]) for x in s.superseded] == [
        (1, 2, "h1", ANALYZING)]
    code, out = _describe(rt, capsys)
    assert code == 0 and "superseded: version 1 (ANALYZING) by version 2 at " in out
    assert "when h1 arrived" in out
    # Version 1 wrote nothing, and its claim is done: a redelivery does nothing either.
    assert not (rt.storage.root / f"{RUN}/plugins/profile/{SESSION}/analysis").exists()
    assert not rt.state.claim(f"collect:{RUN}/{SESSION}#v1", "other", 60, time.time())


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_stored_session_of_an_older_release_still_loads() -> None:
    old = {"run": "r", "session": "s", "state": CAPTURING, "version": 1,
           "hosts": {"h0": {"object_name": "r/plugins/profile/s/h0.xplane.pb",
                            "generation": "1", "size": 3, "arrived_at": 1.0}},
           "expected_hosts": ["h0", "h1"]}
    s = SessionRecord.from_dict(old)
    assert (s.process_count, s.processes, s.superseded) == (0, {}, [])
    assert not s.complete()
    # And one a newer release wrote, with fields this one does not know.
    newer = {**s.to_dict(), "shiny": 1}
    newer["hosts"]["h0"]["shiny"] = 2
    assert SessionRecord.from_dict(newer) == s
    assert HostRecord(object_name="", generation="", size=0, arrived_at=0.0).content_hash == ""
