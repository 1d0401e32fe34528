"""The SDK's control endpoint: how the control plane drives continuous profiling of a target.

A small threaded HTTP server (stdlib only) in the workload process. Every request carries
`Authorization: Bearer <token>`; bodies are JSON except the merged xplane a snapshot or a
capture returns. Endpoints:

- `GET /health`: `{"ok": true, "continuous": "RING"|"OFF", **ring.status()}`
- `POST /continuous/start` `{window_s, max_bytes, host_tracer_level, device_tracer_level,
  python_tracer_level}` (all optional): `{"continuous": "RING"}`, idempotent
- `POST /continuous/stop`: `{"continuous": "OFF"}`, idempotent
- `POST /snapshot` `{"duration_s": float|null}`: the newest windows, merged
- `POST /capture` `{"duration_s": float}`: the windows covering [now, now + duration_s]

xplane answers are `application/octet-stream` with `X-Mldiag-Window-Start`,
`X-Mldiag-Window-End` (epoch seconds) and `X-Mldiag-Windows`. Errors are `{"error": "..."}`:
400 bad input, 401 no or wrong token, 404/405 unknown endpoint, 409 ring off or no window
yet, 413 body too large, 504 the windows did not arrive in time.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from mldiag import limits
from mldiag.sdk.continuous import (
    CollectTimeout,
    ContinuousError,
    RingBuffer,
)

log = logging.getLogger(__name__)

MAX_JSON_BYTES = 1024 * 1024
RING, OFF = "RING", "OFF"
_START_OPTIONS = frozenset(
    {"window_s", "max_bytes", "host_tracer_level", "device_tracer_level", "python_tracer_level"})


class _HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _duration(body: dict[str, Any], required: bool) -> float | None:
    value = body.get("duration_s")
    if value is None and not required:
        return None
    try:
        return limits.check_capture_duration(value)
    except ValueError as e:
        raise _HttpError(HTTPStatus.BAD_REQUEST, str(e)) from e


class ControlServer:
    """The control endpoint of one workload process, serving its continuous-profiling ring."""

    def __init__(self, ring: RingBuffer, token: str, host: str = "127.0.0.1", port: int = 0,
                 on_change: Callable[[str], None] | None = None) -> None:
        if not token:
            raise ValueError("the control endpoint needs a non-empty token")
        self.ring = ring
        self.host = host
        self._token = token.encode()
        self._port = port
        self._on_change = on_change
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        # Serialises start/stop of the ring, so concurrent requests cannot interleave them.
        self._ring_lock = threading.Lock()

    @property
    def port(self) -> int:
        """The bound port (after start())."""
        if self._server is None:
            raise RuntimeError("the control server is not started")
        return int(self._server.server_address[1])

    def start(self) -> int:
        """Bind and serve in a daemon thread; returns the bound port. Idempotent."""
        if self._server is not None:
            return self.port
        server = _BoundedServer((self.host, self._port), _Handler)
        server.control = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="mldiag-control",
                                        daemon=True)
        self._thread.start()
        return self.port

    def stop(self) -> None:
        """Stop serving and close the socket (the ring is left as it is). Idempotent."""
        server, thread = self._server, self._thread
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join()
        self._server = self._thread = None

    def authorized(self, header: str | None) -> bool:
        """Whether an Authorization header carries this server's bearer token."""
        scheme, _, value = (header or "").partition(" ")
        # Constant-time, so response timing does not reveal how much of a guess matched.
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(),
                                                                  self._token)

    def _notify(self, state: str) -> None:
        if self._on_change is not None:
            self._on_change(state)

    # Endpoint bodies: each returns (status, JSON object) or (status, bytes, headers).

    def health(self) -> dict[str, Any]:
        return {"ok": True, "continuous": RING if self.ring.active else OFF,
                **self.ring.status()}

    def start_continuous(self, body: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(body) - _START_OPTIONS)
        if unknown:
            raise _HttpError(HTTPStatus.BAD_REQUEST,
                             f"unknown option(s) {unknown}; expected {sorted(_START_OPTIONS)}")
        with self._ring_lock:
            was_active = self.ring.active
            try:
                self.ring.start(**body)
            except ValueError as e:
                raise _HttpError(HTTPStatus.BAD_REQUEST, str(e)) from e
        if not was_active:
            self._notify(RING)
        return {"continuous": RING}

    def stop_continuous(self) -> dict[str, Any]:
        with self._ring_lock:
            was_active = self.ring.active
            self.ring.stop()
        if was_active:
            self._notify(OFF)
        return {"continuous": OFF}

    def snapshot(self, body: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        duration_s = _duration(body, required=False)
        if not self.ring.active:
            raise _HttpError(HTTPStatus.CONFLICT, "continuous profiling is off: start it first")
        try:
            capture = self.ring.snapshot_capture(duration_s)
        except ContinuousError as e:
            raise _HttpError(HTTPStatus.CONFLICT, str(e)) from e
        return capture.data, _window_headers(capture.start, capture.end, capture.windows)

    def capture(self, body: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        duration_s = _duration(body, required=True)
        assert duration_s is not None
        status = self.ring.status()
        if not self.ring.active or status["window_s"] is None:
            raise _HttpError(HTTPStatus.CONFLICT, "continuous profiling is off: start it first")
        now = time.time()
        timeout_s = duration_s + 2 * status["window_s"] + 10.0
        try:
            capture = self.ring.collect_capture(now, now + duration_s, timeout_s)
        except CollectTimeout as e:
            raise _HttpError(HTTPStatus.GATEWAY_TIMEOUT, str(e)) from e
        except ContinuousError as e:
            raise _HttpError(HTTPStatus.CONFLICT, str(e)) from e
        return capture.data, _window_headers(capture.start, capture.end, capture.windows)


def _window_headers(start: float, end: float, windows: int) -> dict[str, str]:
    return {"X-Mldiag-Window-Start": f"{start:.6f}", "X-Mldiag-Window-End": f"{end:.6f}",
            "X-Mldiag-Windows": str(windows)}


# Connections served at once; more are closed on accept, before any thread starts.
MAX_CONNECTIONS = 16
# An unauthenticated client has this long to send its request line and headers.
HEADER_TIMEOUT_S = 5.0
# An authenticated one this long for each read or write after that.
BODY_TIMEOUT_S = 30.0


class _BoundedServer(ThreadingHTTPServer):
    """A threading server that holds at most MAX_CONNECTIONS threads: connections past the
    cap are closed at once, so a flood of half-open connections costs no thread each."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.refused = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Handler(BaseHTTPRequestHandler):
    server_version = "mldiag-control/1"
    # A client that opens a connection and sends nothing must not hold a thread for long.
    timeout = HEADER_TIMEOUT_S

    @property
    def control(self) -> ControlServer:
        control: ControlServer = self.server.control  # type: ignore[attr-defined]
        return control

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("control %s: " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        try:
            if not self.control.authorized(self.headers.get("Authorization")):
                raise _HttpError(HTTPStatus.UNAUTHORIZED, "missing or wrong bearer token")
            self.connection.settimeout(BODY_TIMEOUT_S)
            self._route(method, self.path.split("?", 1)[0])
        except _HttpError as e:
            self._json(e.status, {"error": str(e)})
        except Exception as e:
            # The server boundary: the caller gets the reason, the workload keeps running.
            log.exception("control request %s %s failed", method, self.path)
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(e).__name__}: {e}"})

    def _route(self, method: str, path: str) -> None:
        c = self.control
        routes: dict[str, str] = {"/health": "GET", "/continuous/start": "POST",
                                  "/continuous/stop": "POST", "/snapshot": "POST",
                                  "/capture": "POST"}
        if path not in routes:
            raise _HttpError(HTTPStatus.NOT_FOUND, f"no endpoint {path}")
        if method != routes[path]:
            raise _HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"{path} takes {routes[path]}")
        if path == "/health":
            self._json(HTTPStatus.OK, c.health())
            return
        body = self._body()
        if path == "/continuous/start":
            self._json(HTTPStatus.OK, c.start_continuous(body))
        elif path == "/continuous/stop":
            self._json(HTTPStatus.OK, c.stop_continuous())
        elif path == "/snapshot":
            self._bytes(*c.snapshot(body))
        else:
            self._bytes(*c.capture(body))

    def _body(self) -> dict[str, Any]:
        raw_length = self.headers.get("Content-Length") or "0"
        try:
            length = int(raw_length)
        except ValueError as e:
            raise _HttpError(HTTPStatus.BAD_REQUEST, f"bad Content-Length {raw_length!r}") from e
        if length < 0:
            raise _HttpError(HTTPStatus.BAD_REQUEST, f"bad Content-Length {raw_length!r}")
        if length > MAX_JSON_BYTES:
            # Drain a modestly oversized body (in chunks, discarded) so the client, still
            # sending, reads the 413 instead of a connection reset; a huge one is cut off.
            left = length if length <= 8 * MAX_JSON_BYTES else 0
            while left > 0:
                chunk = self.rfile.read(min(left, 64 * 1024))
                if not chunk:
                    break
                left -= len(chunk)
            self.close_connection = True
            raise _HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                             f"body of {length} bytes is over the {MAX_JSON_BYTES} byte limit")
        raw = self.rfile.read(length) if length else b""
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _HttpError(HTTPStatus.BAD_REQUEST, f"body is not JSON: {e}") from e
        if not isinstance(body, dict):
            raise _HttpError(HTTPStatus.BAD_REQUEST,
                             f"body must be a JSON object, got {type(body).__name__}")
        return body

    def _json(self, status: HTTPStatus, obj: dict[str, Any]) -> None:
        payload = json.dumps(obj).encode()
        self._send(status, payload, "application/json", {})

    def _bytes(self, data: bytes, headers: dict[str, str]) -> None:
        self._send(HTTPStatus.OK, data, "application/octet-stream", headers)

    def _send(self, status: HTTPStatus, payload: bytes, content_type: str,
              headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(payload)
