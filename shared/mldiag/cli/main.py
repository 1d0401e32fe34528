"""Entry point of the `mldiag` command: one module per command, registered here."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

import mldiag
from mldiag.analysis import SessionTooLarge
from mldiag.cli import (
    _gcloud,
    add,
    alerts,
    analyze,
    autocapture,
    capture,
    console,
    continuous,
    dead_letters,
    demo,
    diff,
    gc,
    kube_discover,
    kube_webhook,
    machine_learning_run,
    metrics,
    monitored_events,
    profiler_session,
    profiler_target,
    roles,
    runs,
    sessions,
    share,
    targets,
    tokens,
    up,
)
from mldiag.errors import MldiagError, ProfileUnreadable

# Sorted by command name; each module provides register(subparsers) and run(args) -> int.
COMMANDS = {
    "add": add,
    "alerts": alerts,
    "analyze": analyze,
    "autocapture": autocapture,
    "capture": capture,
    "console": console,
    "continuous": continuous,
    "dead-letters": dead_letters,
    "demo": demo,
    "diff": diff,
    "gc": gc,
    "kube-discover": kube_discover,
    "kube-webhook": kube_webhook,
    "metrics": metrics,
    # gcloud alpha mldiagnostics' command groups; the short names above are aliases.
    "machine-learning-run": machine_learning_run,
    "monitored-events": monitored_events,
    "profiler-session": profiler_session,
    "profiler-target": profiler_target,
    "roles": roles,
    "runs": runs,
    "sessions": sessions,
    "share": share,
    "targets": targets,
    "tokens": tokens,
    "up": up,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mldiag", description="Automatic XProf profile analysis for ML workloads."
    )
    parser.add_argument("--version", action="version", version=f"mldiag {mldiag.__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS.values():
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit status."""
    args = _gcloud.normalise(build_parser().parse_args(argv))
    out, err = sys.stdout, sys.stderr
    # Remote text is printed as text: a terminal escape in a target's status or an alert's
    # summary is dropped, whichever command prints or logs it.
    sys.stdout, sys.stderr = _gcloud.PrintableStream(out), _gcloud.PrintableStream(err)
    # xprof logs recoverable conditions as root warnings; mldiag records them in tool results.
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("mldiag").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return _run(args)
    finally:
        sys.stdout, sys.stderr = out, err


def _run(args: argparse.Namespace) -> int:
    try:
        code = int(COMMANDS[args.command].run(args))
        sys.stdout.flush()  # here, where a reader that has gone is handled below
        return code
    except SessionTooLarge as e:
        # Before ProfileUnreadable, its base: a session too large for the memory budget is
        # not unreadable.
        print(f"mldiag: too large: {e}", file=sys.stderr)
        return 2
    except ProfileUnreadable as e:
        print(f"mldiag: unreadable profile: {e}", file=sys.stderr)
        return 2
    except MldiagError as e:
        print(f"mldiag: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mldiag: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `mldiag ... | head`: the reader has gone. Nothing more to say, and the exit flush
        # of stdout must not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
