"""Serving the console with uvicorn: in the foreground (`mldiag console`), or in a thread of
`mldiag up`."""

from __future__ import annotations

import threading
import time

from mldiag.console.app import create_app
from mldiag.console.context import Console
from mldiag.errors import MldiagError


class ConsoleServer:
    """uvicorn on one host and port, started in a daemon thread."""

    def __init__(self, console: Console, host: str, port: int) -> None:
        import uvicorn

        self.host, self.port = host, port
        config = uvicorn.Config(create_app(console), host=host, port=port, log_level="warning",
                                access_log=False, proxy_headers=False, server_header=False,
                                lifespan="off")
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
