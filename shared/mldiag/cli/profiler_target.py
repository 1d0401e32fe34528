"""`mldiag profiler-target list|create|delete`: gcloud's name for `targets list`, and the
registration of a plain profiler server (`jax.profiler.start_server(PORT)`, no SDK) as a push
target."""

from __future__ import annotations

import argparse
from typing import Any

from mldiag.cli import targets


def register(sub: Any) -> None:
    p = sub.add_parser("profiler-target", help="list, register and remove a run's profiler "
                       "targets (gcloud alpha mldiagnostics profiler-target)")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    targets.add_list_arguments(verbs.add_parser("list", help="list the targets of a run"))
    targets.add_create_arguments(verbs.add_parser("create", help=targets.CREATE_HELP,
                                                  description=targets.CREATE_DESCRIPTION))
    targets.add_delete_arguments(verbs.add_parser("delete", help="forget a target of RUN"))


def run(args: argparse.Namespace) -> int:
    return targets.run(args)
