"""Serving the console with uvicorn: in the foreground (`mldiag console`), or in a thread of
`mldiag up`.

A connection is closed when a request (its headers, and its body if it has one) has not
arrived whole within REQUEST_READ_TIMEOUT_S of its first chance to, or when it sits idle
between requests for IDLE_TIMEOUT_S: a client that trickles its headers a byte at a time
cannot hold connections open (uvicorn itself bounds only the keep-alive wait).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from mldiag.console.app import create_app
from mldiag.console.context import Console
from mldiag.errors import MldiagError

REQUEST_READ_TIMEOUT_S = 15.0
IDLE_TIMEOUT_S = 5.0


def timed_protocol(read_timeout_s: float) -> type:
    """uvicorn's h11 protocol, closing a connection whose request is not read whole within
    `read_timeout_s` of the connection, or of the previous response."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):
        _read_deadline: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._read_deadline = self.loop.call_later(read_timeout_s, self._too_slow)

        def _disarm(self) -> None:
            if self._read_deadline is not None:
                self._read_deadline.cancel()
                self._read_deadline = None

        def _too_slow(self) -> None:
            self._read_deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            # The request is read whole: what the app takes to answer is not the client's.
            if self.conn.their_state is not h11.IDLE and (
                    self.conn.their_state is not h11.SEND_BODY):
                self._disarm()

        def on_response_complete(self) -> None:
            self._arm()
            super().on_response_complete()

    return TimedH11Protocol


class ConsoleServer:
    """uvicorn on one host and port, started in a daemon thread."""

    def __init__(self, console: Console, host: str, port: int, *,
                 read_timeout_s: float = REQUEST_READ_TIMEOUT_S,
                 idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
        import uvicorn

        self.host, self.port = host, port
        config = uvicorn.Config(create_app(console), host=host, port=port, log_level="warning",
                                access_log=False, proxy_headers=False, server_header=False,
                                lifespan="off", http=timed_protocol(read_timeout_s),
                                timeout_keep_alive=max(1, round(idle_timeout_s)))
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def start(self, timeout_s: float = 10.0) -> None:
        self._thread = threading.Thread(target=self.server.run, name="mldiag-console",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise MldiagError(f"the console could not listen on {self.host}:{self.port} "
                                  "(port in use? set MLDIAG_CONSOLE_PORT)")
            time.sleep(0.02)
        # Port 0 asks for any free port: report the one bound.
        if self.port == 0 and self.server.servers:
            self.port = self.server.servers[0].sockets[0].getsockname()[1]

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def run(self) -> None:
        """Serve in the foreground until SIGINT/SIGTERM."""
        self.server.run()
