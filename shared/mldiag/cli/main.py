"""Entry point of the `mldiag` command: one module per command, registered here."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import mldiag
from mldiag.cli import (
    analyze,
    autocapture,
    capture,
    console,
    continuous,
    demo,
    diff,
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
    "analyze": analyze,
    "autocapture": autocapture,
    "capture": capture,
    "console": console,
    "continuous": continuous,
    "demo": demo,
    "diff": diff,
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
    args = build_parser().parse_args(argv)
    # xprof logs recoverable conditions as root warnings; mldiag records them in tool results.
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("mldiag").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return int(COMMANDS[args.command].run(args))
    except ProfileUnreadable as e:
        # A session too large for the memory budget is not unreadable: say which it is.
        kind = "too large" if type(e).__name__ == "SessionTooLarge" else "unreadable profile"
        print(f"mldiag: {kind}: {e}", file=sys.stderr)
        return 2
    except MldiagError as e:
        print(f"mldiag: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mldiag: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
