"""Liveness that cannot hurt (issue 34, items 4 and 6), on the local runtime.

- Read paths never connect to a target: the runs list, the run's targets (API) and
  `targets list` show the last known state with its age, and intake never waits on a probe.
- The background prober checks in its own threads, with a bound per run and in total: one
  run's silent targets do not delay another run's check.
- Every endpoint that is not a profiler server (closed port, open non-HTTP/2 port, another
  gRPC/HTTP/2 service, a server that never answers) gets the same status, the same reason,
  after the same time: no port oracle.
The probe never collides with the workload's own tracing: tests/e2e/test_probe_no_collision.py.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from fastapi.testclient import TestClient

from mldiag.access import ALL_RUNS, create_token
from mldiag.bootstrap import LocalRuntime, bootstrap
from mldiag.capture import remote
from mldiag.cli.main import main
from mldiag.console.app import create_app
from mldiag.console.context import build_console
from mldiag.model import RunRecord, TargetRecord
from mldiag.settings import Settings
from mldiag.stages import Services, probe_targets
from tests.helpers.net import free_port
from tests.helpers.pipeline import FAST, object_name
from tests.helpers.wait import wait_until
from tests.sdk.profiler_standin import StandInProfiler

TIMEOUT_S = 0.4


class Listener:
    """A TCP port that accepts connections and never answers (or answers `banner` and
    closes): counts connections, and when each came."""

    def __init__(self, banner: bytes = b"") -> None:
        self.banner = banner
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.times: list[float] = []
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                self.times.append(time.monotonic())
                self._conns.append(conn)
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        try:
            if self.banner:
                conn.sendall(self.banner)
                conn.close()
            else:
                while conn.recv(4096):
                    pass
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        with self._lock:
            for conn in self._conns:
                try:
                    conn.close()
                except OSError:
                    pass


@pytest.fixture
def silent() -> Iterator[Listener]:
    listener = Listener()
    yield listener
    listener.close()


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[LocalRuntime]:
    rt = bootstrap(Settings(home=tmp_path / "home", probe_timeout_s=TIMEOUT_S,
                            probe_interval_s=0.0, probe_workers=4, probe_per_run=2, **FAST))
    rt.start()
    # The runtime's own prober stopped: each test runs its passes itself.
    rt.prober.stop()
    yield rt
    rt.stop()


def plain(run: str, host: str, port: int) -> TargetRecord:
    """A plain profiler server's record, as `profiler-target create` stores it."""
    return TargetRecord(run=run, host=host, port=port, address="127.0.0.1",
                        registered_at=time.time())


def test_read_paths_never_connect_and_show_the_last_state_with_its_age(
        runtime: LocalRuntime, silent: Listener, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    state = runtime.state
    state.register_run(RunRecord(name="quiet", created_at=time.time()))
    for i in range(20):
        state.upsert_target(plain("quiet", f"h{i}", silent.port))
    console = build_console(runtime.services.settings)
    secret, _ = create_token(console.access, role="viewer", run=ALL_RUNS, now=time.time())
    auth = {"Authorization": f"Bearer {secret}"}
    with TestClient(create_app(console), base_url="http://127.0.0.1:8790") as client:
        runs = client.get("/api/v1/runs", headers=auth)
        targets = client.get("/api/v1/runs/quiet/targets", headers=auth)
        page = client.get("/runs/quiet", headers=auth)
    capsys.readouterr()
    assert main(["targets", "list", "--run", "quiet", "--home",
                 str(runtime.services.settings.home)]) == 0
    out = capsys.readouterr().out
    assert runs.status_code == targets.status_code == page.status_code == 200
    assert silent.accepted == 0, "a read connected to a target"
    assert {t["status"] for t in targets.json()} == {"unknown"}
    assert "unknown" in out
    # After a check: the stored answer and its age, still without connecting.
    services = runtime.services
    probe_targets(services)
    checked = silent.accepted
    assert checked >= 20
    with TestClient(create_app(console), base_url="http://127.0.0.1:8790") as client:
        rows = client.get("/api/v1/runs/quiet/targets", headers=auth).json()
        row = next(r for r in client.get("/api/v1/runs", headers=auth).json()
                   if r["name"] == "quiet")
        page = client.get("/runs/quiet", headers=auth).text
    assert {(r["status"], r["down_reason"]) for r in rows} == {(remote.DOWN, remote.UNREACHABLE)}
    assert all(r["checked_age_s"] is not None and r["status_text"].startswith(
        "down, checked ") for r in rows)
    assert row["targets_up"] == 0 and row["targets_total"] == 20
    assert "s ago" in page
    assert main(["targets", "list", "--run", "quiet", "--home",
                 str(services.settings.home)]) == 0
    assert "(checked " in capsys.readouterr().out
    assert silent.accepted == checked, "a read connected to a target"


def test_intake_never_probes_on_the_bus_workers(runtime: LocalRuntime, silent: Listener,
                                                ) -> None:
    state = runtime.state
    state.register_run(RunRecord(name="quiet", created_at=time.time()))
    for i in range(20):
        state.upsert_target(plain("quiet", f"h{i}", silent.port))
    bucket = runtime.services.settings.bucket_dir
    started = time.monotonic()
    for run in ("quiet", "other"):
        path = bucket / object_name("h0" if run == "quiet" else "w0", "s1", run)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"not an xplane: intake registers it all the same")
    for run in ("quiet", "other"):
        wait_until(lambda run=run: state.get_session(run, "s1"), timeout=30,
                   what=f"{run}'s intake")  # type: ignore[misc]
    assert silent.accepted == 0, "intake connected to the run's targets"
    assert time.monotonic() - started < 20 * TIMEOUT_S


def test_the_prober_is_bounded_per_run_and_one_run_does_not_delay_another(
        runtime: LocalRuntime, silent: Listener) -> None:
    state = runtime.state
    state.register_run(RunRecord(name="quiet", created_at=time.time()))
    state.register_run(RunRecord(name="live", created_at=time.time()))
    for i in range(20):
        state.upsert_target(plain("quiet", f"h{i}", silent.port))
    profiler = StandInProfiler(buffer=b"", native=False).start()
    try:
        state.upsert_target(plain("live", "w0", profiler.port))
        services: Services = runtime.services
        done: list[dict[str, int]] = []
        started = time.monotonic()
        pass_ = threading.Thread(target=lambda: done.append(probe_targets(services)))
        pass_.start()
        live = wait_until(lambda: next((t for t in state.list_targets("live")
                                        if t.probe_state), None), timeout=30,
                          what="the live run's check", interval=0.02)
        live_s = time.monotonic() - started
        pass_.join()
        total_s = time.monotonic() - started
    finally:
        profiler.stop()
    assert live.probe_state == remote.UP and live_s < 3 * TIMEOUT_S, live_s
    # 20 silent targets, 2 at a time: 10 rounds of the timeout.
    assert done == [{"up": 1, "down": 20}]
    # Never more than 2 of the run's checks at once: at most 2 connections in any window
    # shorter than one check.
    times = sorted(silent.times)
    assert len(times) == 20
    assert max(sum(1 for u in times if t <= u < t + 0.8 * TIMEOUT_S) for t in times) <= 2, \
        [round(t - times[0], 2) for t in times]
    assert total_s >= 9 * TIMEOUT_S, total_s
    # The probe asked for nothing that starts a session.
    assert "Profile" not in profiler.calls and "Start" not in profiler.calls


def _other_grpc() -> grpc.Server:
    handler = grpc.method_handlers_generic_handler("other.Service", {
        "Ping": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"",
                                                    request_deserializer=lambda b: b,
                                                    response_serializer=lambda b: b)})
    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((handler,))
    return server


def test_every_endpoint_that_is_not_a_profiler_looks_the_same() -> None:
    closed = free_port()
    silent, http1 = Listener(), Listener(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    other = _other_grpc()
    other_port = other.add_insecure_port("127.0.0.1:0")
    other.start()
    profiler = StandInProfiler(buffer=b"", native=False).start()
    try:
        answers = {}
        for what, port in (("closed", closed), ("silent", silent.port), ("http1", http1.port),
                           ("other grpc", other_port)):
            started = time.monotonic()
            answer = remote.probe(f"127.0.0.1:{port}", timeout_s=TIMEOUT_S)
            answers[what] = (answer, time.monotonic() - started)
        up = remote.probe(profiler.address, timeout_s=TIMEOUT_S)
    finally:
        silent.close()
        http1.close()
        other.stop(None)
        profiler.stop()
    assert {a for a, _ in answers.values()} == {(remote.DOWN, remote.UNREACHABLE)}, answers
    times = [t for _, t in answers.values()]
    # Each at the check's deadline (a closed port answered in 0.2 ms, another gRPC service
    # in 0.2 s, a silent port at the deadline).
    assert all(TIMEOUT_S <= t < TIMEOUT_S + 1.0 for t in times), answers
    assert max(times) - min(times) < 0.3, answers
    assert up == (remote.UP, "")
