"""`google_cloud_mldiagnostics.core.xprof`: `xprof`/`Xprof`, and the on-demand profiler server
started and stopped by hand (`start_on_demand_xprof(port=9999)`, `stop_on_demand_xprof()`).

The server is the current run's engine's (JAX, PyTorch/XLA or TorchTPU; `mldiag.sdk.engines`),
or JAX's when no run is registered yet, as upstream. For a run that did not start one
(`on_demand_xprof=False`), this is how to add one later; it runs until
`stop_on_demand_xprof()` or the process ends. A JAX run's mldiag captures come by pull either
way; the server serves what connects (the XProf UI's capture, TensorBoard, a push target made
with `mldiag profiler-target create`). A PyTorch run's target is this server: start it on the
run's port (`run.target.port`, 9999 by default).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from mldiag.sdk import engines
from mldiag.sdk.engines import select as get_profiler_engine
from mldiag.sdk.profiler import Xprof, xprof
from mldiag.sdk.run import current_run

log = logging.getLogger(__name__)

__all__ = ["Xprof", "get_profiler_engine", "start_on_demand_xprof", "stop_on_demand_xprof",
           "xprof"]


class _OnDemandServer:
    """The one server this process started through `start_on_demand_xprof`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.engine: engines.ProfilerEngine | None = None
        self.server: Any = None
        self.port = 0


_server = _OnDemandServer()


def start_on_demand_xprof(port: int = 9999) -> None:
    """Start the profiler server on `port` (once per process: a second call warns)."""
    with _server.lock:
        if _server.engine is not None:
            log.warning("On-demand xprof profiling session already started (port %d).",
                        _server.port)
            return
        run = current_run()
        if run is not None and run.profiler_server is not None:
            log.warning("The run %s already serves on-demand profiling on port %d.",
                        run.name, run.target.port)
            return
        engine = run.engine if run is not None else engines.select(None)
        server = engine.start_server(port)
        _server.engine, _server.server, _server.port = engine, server, port
        if run is not None and not engine.pulls and port != run.target.port:
            log.warning("mldiag: run %s's target is registered on port %d, not %d: captures "
                        "will not reach this server", run.name, run.target.port, port)
        log.info("mldiag: %s profiler server on port %d", engine.name, port)


def stop_on_demand_xprof() -> None:
    """Stop the server that `start_on_demand_xprof` started (nothing when none runs)."""
    with _server.lock:
        engine, server = _server.engine, _server.server
        if engine is None:
            return
        _server.engine, _server.server, _server.port = None, None, 0
        engine.stop_server(server)
