"""`mldiag console`: serve the web console and JSON API alone (no pipeline)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from mldiag.cli._home import add_home
from mldiag.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("console", help="serve the web console and API (without the pipeline)",
                       description="Serve the console on the state store and bucket that "
                       "the settings name: runs, sessions, reports, the XProf viewer, share "
                       "links. Locally it binds 127.0.0.1 (MLDIAG_CONSOLE_PORT, default "
                       "8790); on Cloud Run, --host 0.0.0.0 --port $PORT.")
    add_home(p)
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default $MLDIAG_CONSOLE_PORT or 8790)")


def run(args: argparse.Namespace) -> int:
    from mldiag.console.context import build_console
    from mldiag.console.server import ConsoleServer

    settings = Settings.from_env(home=args.home, console_host=args.host,
                                 console_port=args.port)
    console = build_console(settings)
    server = ConsoleServer(console, settings.console_host, settings.console_port)
    print(f"console: http://{settings.console_host}:{settings.console_port}/", flush=True)
    if settings.backend == "local":
        print_login(console)
    server.run()
    return 0


def _print_line(line: str, *, err: bool = False) -> None:
    print(line, file=sys.stderr if err else sys.stdout, flush=True)


def print_login(console: Any, say: Callable[..., None] = _print_line) -> None:
    """The local admin token (created on first use, or when revoked) and a one-time login
    URL, each written as one line by `say(line, err=...)`."""
    from mldiag.console.context import ensure_local_admin

    created, code = ensure_local_admin(console)
    home = console.settings.home
    if created:
        say(f"admin token written to {home / 'admin.token'} (mode 0600)", err=True)
    say(f"login (one-time): {console.settings.console_url}/login?code={code}")
