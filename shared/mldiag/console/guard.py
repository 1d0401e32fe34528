"""What every console request passes through, outside every route: the body cap, the security
headers, and a short 500 for an error no route handled.

It is plain ASGI, inside Starlette's last-resort error handler, so that the responses it makes
itself (413, 500) carry the same headers as every other, and a traceback is logged once on the
server and never sent to the client.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import HTTPException, Request
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mldiag.access import ANONYMOUS, Principal
from mldiag.errors import MldiagError

log = logging.getLogger(__name__)

# The largest request body the console reads. Its biggest legitimate one, a capture naming
# 1024 targets, is about 270 KB of JSON; nothing is uploaded through the console.
MAX_BODY = 1024 * 1024

def _size(n: int) -> str:
    return f"{n // 1024**2} MiB" if n % 1024**2 == 0 else f"{n} bytes"


class BodyTooLarge(MldiagError, HTTPException):
    """A request body over the cap (a client error: 413). Permanent: the same body is
    refused again."""

    def __init__(self, cap: int) -> None:
        super().__init__(413, f"request body over {_size(cap)}")


def security_headers(scope: Scope, message: Message, csp: str) -> None:
    """Add the console's headers to a response start; a route may have set its own CSP
    (`request.state.csp`: the XProf frontend's, the sandboxed report's) instead of `csp`."""
    headers = MutableHeaders(scope=message)
    csp = scope.get("state", {}).get("csp") or csp
    headers.setdefault("Content-Security-Policy", csp)
    headers["X-Content-Type-Options"] = "nosniff"
    headers["Referrer-Policy"] = "no-referrer"
    headers["Cross-Origin-Opener-Policy"] = "same-origin"
    headers.setdefault("Cache-Control", "no-store")


class Guard:
    """The console's outermost middleware (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, csp: str, max_body: int = MAX_BODY) -> None:
        self.app = app
        self.csp = csp
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_guarded(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                security_headers(scope, message, self.csp)
            await send(message)

        declared = Headers(scope=scope).get("content-length", "")
        if declared and (not declared.isdigit() or int(declared) > self.max_body):
            # Refused before a byte of it is read, and before anyone is signed in.
            await self._reply(scope, send_guarded, BodyTooLarge(self.max_body) if
                              declared.isdigit() else HTTPException(400, "bad Content-Length"))
            return
        received = 0

        async def capped_receive() -> Message:
            # A body without Content-Length (chunked) is counted as it streams in, and
            # refused at the first chunk over the cap; the route never sees the rest.
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    raise BodyTooLarge(self.max_body)
            return message

        try:
            await self.app(scope, capped_receive, send_guarded)
        except BodyTooLarge as e:
            # Read outside a route (the form of a CSRF check is read inside one, and FastAPI
            # turns it into the same 413 through the app's HTTPException handler).
            if not started:
                await self._reply(scope, send_guarded, e)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await self._reply(scope, send_guarded,
                                  HTTPException(500, "internal error (logged on the server)"))

    async def _reply(self, scope: Scope, send: Send, error: HTTPException) -> None:
        """A short error page or JSON, made here: the caller is not resolved (the access
        store may be what failed), so the page shows no one signed in."""
        from mldiag.console.pages import error_response

        request = Request(scope)
        request.state.principal = Principal(ANONYMOUS)
        response = error_response(request, error.status_code, str(error.detail))

        async def no_body() -> dict[str, Any]:
            return {"type": "http.disconnect"}

        await response(scope, no_body, send)
