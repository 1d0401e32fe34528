"""`mldiag machine-learning-run list|describe|start-continuous-profiling|
stop-continuous-profiling`: gcloud's names for `runs list|describe` and `continuous
start|stop`."""

from __future__ import annotations

import argparse
from typing import Any

from mldiag.cli import continuous, runs

VERBS = {"start-continuous-profiling": "start", "stop-continuous-profiling": "stop"}


def register(sub: Any) -> None:
    p = sub.add_parser("machine-learning-run", help="list and describe runs, start and stop "
                       "continuous profiling (gcloud alpha mldiagnostics machine-learning-run)")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    runs.add_list_arguments(verbs.add_parser("list", help="list runs"))
    runs.add_describe_arguments(verbs.add_parser("describe", help="one run and its sessions"))
    for verb, short in VERBS.items():
        v = verbs.add_parser(verb, help=f"{short} continuous profiling on a run's targets",
                             description=continuous.DESCRIPTION)
        continuous.add_arguments(v, short)


def run(args: argparse.Namespace) -> int:
    if args.verb in VERBS:
        args.verb = VERBS[args.verb]
        return continuous.run(args)
    return runs.run(args)
