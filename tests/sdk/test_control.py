"""The SDK's control endpoint and the control plane's client of it: real server, real ring."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from mldiag.capture.client import TargetClient, TargetError, TargetUnreachable
from mldiag.errors import MldiagError
from mldiag.sdk.continuous import RingBuffer
from mldiag.sdk.control import ControlServer
from tests.sdk import jit_loop, step_events

TOKEN = "s3cret-token"
WINDOW_S = 0.3


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[ControlServer, list[str]]]:
    changes: list[str] = []
    ring = RingBuffer(tmp_root=tmp_path)
    control = ControlServer(ring, TOKEN, on_change=changes.append)
    control.start()
    yield control, changes
    control.stop()
    ring.stop()


@pytest.fixture
def client(server: tuple[ControlServer, list[str]]) -> TargetClient:
    return TargetClient("127.0.0.1", server[0].port, TOKEN, timeout_s=10.0)


def _raw(port: int, method: str, path: str, body: bytes | None = None,
         token: str | None = TOKEN) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body,
                                     method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_start_snapshot_stop_through_the_client(
        server: tuple[ControlServer, list[str]], client: TargetClient) -> None:
    control, changes = server
    assert client.health()["continuous"] == "OFF"

    with jit_loop():
        client.start_continuous(window_s=WINDOW_S, max_bytes=10**9)
        client.start_continuous(window_s=WINDOW_S)  # idempotent
        deadline = time.monotonic() + 15
        while client.health()["windows"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        health = client.health()
        data = client.snapshot(None)

    assert health["ok"] is True and health["continuous"] == "RING"
    assert health["state"] == "RUNNING" and health["window_s"] == WINDOW_S
    steps = step_events(data)
    assert steps, "the snapshot holds the loop's steps"
    client.stop_continuous()
    client.stop_continuous()
    assert client.health()["continuous"] == "OFF"
    assert changes == ["RING", "OFF"]


def test_snapshot_answer_names_its_window(server: tuple[ControlServer, list[str]],
                                         client: TargetClient) -> None:
    control, _ = server
    with jit_loop():
        client.start_continuous(window_s=WINDOW_S)
        control.ring.collect(time.time(), time.time(), timeout_s=10)
        request = urllib.request.Request(
            f"http://127.0.0.1:{control.port}/snapshot", data=b'{"duration_s": 5}',
            method="POST", headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as r:
            headers, data = r.headers, r.read()

    assert headers["Content-Type"] == "application/octet-stream"
    start, end = float(headers["X-Mldiag-Window-Start"]), float(headers["X-Mldiag-Window-End"])
    assert 0 < end - start < 6 and abs(end - time.time()) < 5
    assert int(headers["X-Mldiag-Windows"]) >= 1
    assert step_events(data)


def test_capture_is_served_from_the_ring(client: TargetClient) -> None:
    with jit_loop():
        client.start_continuous(window_s=WINDOW_S)
        asked = time.time()
        data = client.capture(0.6)

    assert time.time() - asked >= 0.6
    assert step_events(data)


@pytest.mark.parametrize("token", [None, "wrong", ""])
def test_requests_without_the_token_are_rejected(server: tuple[ControlServer, list[str]],
                                                token: str | None) -> None:
    control, _ = server
    for method, path in (("GET", "/health"), ("POST", "/continuous/start"),
                         ("POST", "/snapshot"), ("GET", "/nowhere")):
        status, body = _raw(control.port, method, path, b"{}" if method == "POST" else None,
                            token=token)
        assert (status, body) == (401, {"error": "missing or wrong bearer token"})
    assert not control.ring.active


def test_client_with_a_wrong_token_gets_a_target_error(
        server: tuple[ControlServer, list[str]]) -> None:
    bad = TargetClient("127.0.0.1", server[0].port, "nope")
    with pytest.raises(TargetError, match="HTTP 401: missing or wrong bearer token"):
        bad.health()


def test_snapshot_and_capture_are_conflicts_while_the_ring_is_off(
        client: TargetClient) -> None:
    with pytest.raises(TargetError, match="HTTP 409: continuous profiling is off"):
        client.snapshot(None)
    with pytest.raises(TargetError, match="HTTP 409: continuous profiling is off"):
        client.capture(1.0)


def test_snapshot_before_the_first_window_is_a_conflict(client: TargetClient) -> None:
    client.start_continuous(window_s=30.0)
    with pytest.raises(TargetError, match="HTTP 409: no complete window yet"):
        client.snapshot(1.0)


@pytest.mark.parametrize("path, body, message", [
    ("/snapshot", b"{not json", "body is not JSON"),
    ("/snapshot", b"[1, 2]", "body must be a JSON object"),
    ("/snapshot", b'{"duration_s": -1}', "capture duration must be"),
    ("/snapshot", b'{"duration_s": "5"}', "capture duration must be"),
    ("/capture", b"{}", "capture duration must be"),
    ("/capture", b'{"duration_s": 1e9}', "capture duration must be"),
    ("/continuous/start", b'{"window": 2}', "unknown option(s) ['window']"),
    ("/continuous/start", b'{"window_s": -2}', "continuous window must be"),
    ("/continuous/start", b'{"host_tracer_level": 9}', "host_tracer_level must be"),
])
def test_bad_requests_say_what_is_wrong(server: tuple[ControlServer, list[str]], path: str,
                                        body: bytes, message: str) -> None:
    status, answer = _raw(server[0].port, "POST", path, body)
    assert status == 400
    assert message in answer["error"]
    assert not server[0].ring.active


def test_oversized_bodies_and_unknown_endpoints(server: tuple[ControlServer, list[str]]) -> None:
    port = server[0].port
    status, answer = _raw(port, "POST", "/snapshot", b" " * (1024 * 1024 + 1))
    assert status == 413 and "over the 1048576 byte limit" in answer["error"]
    assert _raw(port, "GET", "/nowhere")[0] == 404
    assert _raw(port, "GET", "/snapshot")[0] == 405


def test_unreachable_target_fails_fast_with_its_address() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = TargetClient("127.0.0.1", port, TOKEN, timeout_s=5.0)
    started = time.monotonic()
    with pytest.raises(TargetUnreachable, match=f"127.0.0.1:{port} unreachable") as e:
        client.health()
    assert time.monotonic() - started < 2.0
    assert isinstance(e.value, MldiagError)


def test_silent_target_times_out_as_unreachable() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = TargetClient("127.0.0.1", port, TOKEN, timeout_s=0.5)
        started = time.monotonic()
        with pytest.raises(TargetUnreachable, match=f"127.0.0.1:{port} unreachable"):
            client.snapshot(1.0)
        assert time.monotonic() - started < 3.0


def test_unknown_host_is_unreachable() -> None:
    client = TargetClient("no-such-host.invalid", 9, TOKEN, timeout_s=2.0)
    with pytest.raises(TargetUnreachable, match="no-such-host.invalid:9 unreachable"):
        client.health()


class _EmptyCapture(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


def test_an_empty_capture_is_a_target_error() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EmptyCapture)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = TargetClient("127.0.0.1", server.server_address[1], TOKEN)
        with pytest.raises(TargetError, match=r"empty capture \(0 bytes\)"):
            client.snapshot(None)
        with pytest.raises(TargetError, match=r"empty capture \(0 bytes\)"):
            client.capture(1.0)
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_needs_a_token() -> None:
    with pytest.raises(ValueError, match="non-empty token"):
        ControlServer(RingBuffer(), "")


def test_half_open_connections_are_capped_and_time_out(
        server: tuple[ControlServer, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """100 clients that connect and send nothing hold at most MAX_CONNECTIONS threads, and
    their slots come back after the header timeout, so a real request is served again."""
    import mldiag.sdk.control as control_module

    control, _ = server
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", control.port)) for _ in range(100)]
    try:
        time.sleep(0.5)
        grown = threading.active_count() - before
        assert grown <= control_module.MAX_CONNECTIONS
        # (The kernel's accept queue holds some; those past the cap are closed on accept.)
        assert control._server is not None and control._server.refused >= 50
    finally:
        for s in idle:
            s.close()
    deadline = time.time() + control_module.HEADER_TIMEOUT_S + 5
    while time.time() < deadline:
        status, body = _raw(control.port, "GET", "/health")
        if status == 200:
            break
        time.sleep(0.2)
    assert status == 200 and body["continuous"] == "OFF"


def test_unauthenticated_client_is_cut_off_after_the_header_timeout(
        server: tuple[ControlServer, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    import mldiag.sdk.control as control_module

    monkeypatch.setattr(control_module._Handler, "timeout", 0.5)
    control, _ = server
    with socket.create_connection(("127.0.0.1", control.port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\n")  # and never the rest of the headers
        s.settimeout(5)
        started = time.time()
        assert s.recv(1024) == b""  # closed by the server
        assert time.time() - started < 3


def test_limits_are_the_shared_ones(server: tuple[ControlServer, list[str]]) -> None:
    control, _ = server
    status, body = _raw(control.port, "POST", "/capture", json.dumps(
        {"duration_s": 301}).encode())
    assert status == 400 and body["error"] == "capture duration must be in (0, 300] s, not 301 s"
    status, body = _raw(control.port, "POST", "/continuous/start", json.dumps(
        {"window_s": 0.3, "max_bytes": 10**18}).encode())
    assert status == 400 and "continuous max_bytes must be in [1.0 MiB, 64.00 GiB]" in body[
        "error"]
