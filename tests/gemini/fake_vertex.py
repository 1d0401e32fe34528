"""A fake Vertex AI endpoint: a real HTTP server on 127.0.0.1 that speaks `:generateContent`.

It serves the REST path google-genai calls for a Vertex client with a custom `base_url`
(`/v1beta1/projects/P/locations/L/publishers/google/models/M:generateContent`), insists on the
bearer token, records every request, and answers from a script: scripted replies in order,
then a `responder` function of the request. Replies use Vertex's response and error shapes.
"""

from __future__ import annotations

import json
import re
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PATH = re.compile(r"^/(?P<version>v1beta1|v1)/projects/(?P<project>[^/]+)/locations/"
                  r"(?P<location>[^/]+)/publishers/google/models/(?P<model>[^/:]+)"
                  r":generateContent$")
_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 404: "NOT_FOUND",
           429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


@dataclass
class Reply:
    """One scripted answer: HTTP status, a JSON body (or raw text), an optional delay."""

    status: int = 200
    body: Any = None
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Request:
    """One request the fake received."""

    path: str
    model: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def has_tools(self) -> bool:
        return bool(self.body.get("tools"))

    @property
    def generation_config(self) -> dict[str, Any]:
        return dict(self.body.get("generationConfig") or {})

    def function_responses(self) -> list[dict[str, Any]]:
        """The functionResponse parts of the last turn (the answers to the model's calls)."""
        turn = (self.body.get("contents") or [{}])[-1]
        return [p["functionResponse"] for p in turn.get("parts", []) if "functionResponse" in p]


def _candidate(parts: list[dict[str, Any]], finish: str = "STOP") -> dict[str, Any]:
    return {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish,
                        "avgLogprobs": -0.12}],
        "usageMetadata": {"promptTokenCount": 5321, "candidatesTokenCount": 212,
                          "totalTokenCount": 5533, "trafficType": "ON_DEMAND"},
        "modelVersion": "gemini-2.5-flash",
        "createTime": "2025-11-29T10:00:00.000000Z",
        "responseId": "fake-response-id",
    }


def function_call(name: str, **args: Any) -> Reply:
    """The model asks for one tool call."""
    return Reply(body=_candidate([{"functionCall": {"name": name, "args": args}}]))


def function_calls(*calls: tuple[str, dict[str, Any]]) -> Reply:
    """The model asks for several tool calls in one turn."""
    return Reply(body=_candidate([{"functionCall": {"name": n, "args": a}} for n, a in calls]))


def text(content: str, finish: str = "STOP") -> Reply:
    """A plain text answer (a JSON report is text under a JSON response type)."""
    return Reply(body=_candidate([{"text": content}], finish))


def json_report(report: dict[str, Any]) -> Reply:
    """The final structured report."""
    return text(json.dumps(report))


def error(status: int, message: str = "", delay_s: float = 0.0) -> Reply:
    """A Google API error body, as Vertex sends it."""
    status_name = _STATUS.get(status, "UNKNOWN")
    return Reply(status=status, delay_s=delay_s, body={"error": {
        "code": status, "message": message or f"fake {status_name}", "status": status_name}})


class FakeVertex:
    """The fake endpoint; use as a context manager. `url` is its base URL."""

    def __init__(self, token: str = "test-token") -> None:
        self.token = token
        self.requests: list[Request] = []
        self.rejected: list[tuple[int, str]] = []
        self.script: deque[Reply] = deque()
        self.responder: Callable[[Request], Reply] | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeVertex:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()  # wakes replies that are still sleeping
        self._server.shutdown()
        self._server.server_close()

    def enqueue(self, *replies: Reply) -> None:
        self.script.extend(replies)

    def _next(self, request: Request) -> Reply:
        with self._lock:
            self.requests.append(request)
            if self.script:
                return self.script.popleft()
        if self.responder is not None:
            return self.responder(request)
        return error(500, "fake Vertex: script exhausted")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                match = PATH.match(self.path)
                if match is None:
                    return self._reject(404, f"no such method: {self.path}")
                if self.headers.get("Authorization") != f"Bearer {fake.token}":
                    return self._reject(401, "Request had invalid authentication credentials.")
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    return self._reject(400, "Invalid JSON payload received.")
                reply = fake._next(Request(self.path, match["model"], dict(self.headers), body))
                if reply.delay_s and fake._stop.wait(reply.delay_s):
                    return
                self._send(reply)

            def _reject(self, status: int, message: str) -> None:
                fake.rejected.append((status, message))
                self._send(error(status, message))

            def _send(self, reply: Reply) -> None:
                body = reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
                data = body.encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json; charset=UTF-8")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test); nothing to answer

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        return Handler
