"""`mldiag runs list|describe`: the runs the state store knows."""

from __future__ import annotations

import argparse
import json
from typing import Any

from mldiag.bootstrap import open_state
from mldiag.errors import MldiagError
from mldiag.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("runs", help="list and describe runs")
    p.add_argument("--home", help="state directory (default: $MLDIAG_HOME or .mldiag)")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    ls = verbs.add_parser("list", help="list runs")
    ls.add_argument("--json", action="store_true")
    d = verbs.add_parser("describe", help="one run and its sessions")
    d.add_argument("name")
    d.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    state = open_state(Settings.from_env(home=args.home))
    if args.verb == "list":
        runs = state.list_runs()
        if args.json:
            print(json.dumps([r.to_dict() for r in runs], indent=2))
            return 0
        print(f"{'RUN':<32} {'SESSIONS':>8}  ORIGIN")
        for r in runs:
            n = len(state.list_sessions(run=r.name))
            print(f"{r.name:<32} {n:>8}  {'discovered in bucket' if r.discovered else 'created'}")
        return 0
    found = state.get_run(args.name)
    if found is None:
        raise MldiagError(f"unknown run {args.name!r}")
    sessions = state.list_sessions(run=args.name)
    if args.json:
        print(json.dumps({**found.to_dict(), "sessions": [s.session for s in sessions]},
                         indent=2))
        return 0
    print(f"run: {found.name}" + ("  (discovered in bucket)" if found.discovered else ""))
    for s in sessions:
        print(f"  {s.session}  v{s.version}  {s.state}  {s.verdict or ''}")
    return 0
