"""`mldiag profiler-target list --machine-learning-run R`: gcloud's name for `targets list`."""

from __future__ import annotations

import argparse
from typing import Any

from mldiag.cli import targets


def register(sub: Any) -> None:
    p = sub.add_parser("profiler-target", help="list a run's profiler targets (gcloud alpha "
                       "mldiagnostics profiler-target)")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    targets.add_list_arguments(verbs.add_parser("list", help="list the targets of a run"))


def run(args: argparse.Namespace) -> int:
    return targets.run(args)
