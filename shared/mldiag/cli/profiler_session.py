"""`mldiag profiler-session capture|list|describe`: gcloud's names for `capture` and
`sessions list|describe`, with its flags (`--machine-learning-run`, `--kind`, the tracer-level
enums, `--async`, `--format`, `--location`)."""

from __future__ import annotations

import argparse
from typing import Any

from mldiag.cli import capture, sessions


def register(sub: Any) -> None:
    p = sub.add_parser("profiler-session", help="capture, list and describe profile sessions "
                       "(gcloud alpha mldiagnostics profiler-session)")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    c = verbs.add_parser("capture", help="capture a profile session now",
                         description=capture.DESCRIPTION)
    capture.add_arguments(c)
    sessions.add_list_arguments(verbs.add_parser("list", help="list a run's sessions"),
                                run_required=False)
    sessions.add_describe_arguments(verbs.add_parser(
        "describe", help="states, hosts, timings, verdict and report path"))


def run(args: argparse.Namespace) -> int:
    if args.verb == "capture":
        return capture.run(args)
    return sessions.run(args)
