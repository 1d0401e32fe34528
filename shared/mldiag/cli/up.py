"""`mldiag up`: run the local pipeline in the foreground until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from dataclasses import replace
from types import FrameType
from typing import TYPE_CHECKING, Any

from mldiag.bootstrap import ControlPlane, LocalRuntime, bootstrap
from mldiag.cli._home import add_home, forget_console, record_console
from mldiag.errors import MldiagError
from mldiag.model import SessionRecord
from mldiag.settings import Settings

if TYPE_CHECKING:
    from mldiag.console.server import ConsoleServer


def register(sub: Any) -> None:
    p = sub.add_parser(
        "up",
        help="run the local pipeline: watch the bucket, analyse every profile dropped in it",
        description="Watch $MLDIAG_HOME/bucket, process events with the embedded adapters "
        "(SQLite state, in-process bus, rule-based investigator) and print each session's "
        "state transitions. Ctrl-C stops it cleanly.",
    )
    add_home(p)
    p.add_argument("--settle", type=float, help="seconds without a new host before a session "
                   "with unknown expected hosts is analysed (default 2)")
    p.add_argument("--port", type=int, help="console port (default $MLDIAG_CONSOLE_PORT or "
                   "8790; 0 picks a free one)")
    p.add_argument("--no-console", action="store_true", help="run the pipeline only")


_OUT = threading.Lock()


def say(line: str, *, err: bool = False) -> None:
    """Write one whole line: the pipeline's threads print transitions while the main thread
    prints the console's address, and print()'s separate text and newline writes interleave
    ("ANALYZINGconsole: http://..."), which a reader (or a script waiting for the URL) misreads."""
    stream = sys.stderr if err else sys.stdout
    with _OUT:
        stream.write(line + "\n")
        stream.flush()


def describe_transition(s: SessionRecord) -> str:
    detail = ""
    if s.state == "FAILED":
        detail = f"  reason: {s.reason}"
    elif s.state == "REPORTED":
        detail = f"  verdict: {s.verdict}  report: {s.report_path}"
    elif s.state == "CAPTURING":
        detail = f"  hosts: {len(s.hosts)}" + (
            f"/{len(s.expected_hosts)}" if s.expected_hosts else "")
    stamp = time.strftime("%H:%M:%S")
    return f"{stamp} {s.run}/{s.session} v{s.version} {s.state}{detail}"


def start_console(runtime: LocalRuntime, settings: Settings) -> ConsoleServer:
    """The console in this process, on the runtime's own state, bucket and bus."""
    from mldiag.cli.console import print_login
    from mldiag.console.context import build_console
    from mldiag.console.server import ConsoleServer

    plane = ControlPlane(settings=settings, state=runtime.state, storage=runtime.storage,
                         bus=runtime.services.bus)
    console = build_console(settings, plane=plane)
    server = ConsoleServer(console, settings.console_host, settings.console_port)
    server.start()
    say(f"console: http://{server.host}:{server.port}/")
    if server.port != settings.console_port:
        console.settings = replace(settings, console_port=server.port)
    record_console(settings.home, f"http://{server.host}:{server.port}")
    print_login(console, say)
    return server


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env(home=args.home, settle_s=args.settle,
                                 console_port=getattr(args, "port", None))

    def listener(s: SessionRecord) -> None:
        say(describe_transition(s))

    runtime = bootstrap(settings, listener=listener)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    runtime.start()
    say(f"mldiag up: watching {runtime.storage.root} (state {settings.state_db}); "
        "Ctrl-C to stop")
    server = None
    try:
        if not getattr(args, "no_console", False):
            try:
                server = start_console(runtime, settings)
            except MldiagError as e:
                # The pipeline does not depend on the console: say why, and go on.
                say(f"mldiag up: console not started: {e}", err=True)
        while not stop.is_set():
            stop.wait(0.5)
    finally:
        say("mldiag up: stopping (finishing messages in progress)...", err=True)
        if server is not None:
            forget_console(settings.home)
            server.stop()
        runtime.stop()
    say("mldiag up: stopped")
    return 0
