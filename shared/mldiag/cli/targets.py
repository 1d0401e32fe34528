"""`mldiag targets list --run R`: the profiler endpoints registered for a run."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from mldiag.bootstrap import open_state
from mldiag.errors import MldiagError
from mldiag.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("targets", help="list a run's profiler targets")
    p.add_argument("--home", help="state directory (default: $MLDIAG_HOME or .mldiag)")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    ls = verbs.add_parser("list", help="list the targets of a run")
    ls.add_argument("--home", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    ls.add_argument("--run", required=True)
    ls.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    state = open_state(Settings.from_env(home=args.home))
    if state.get_run(args.run) is None:
        raise MldiagError(f"unknown run {args.run!r}")
    targets = state.list_targets(args.run)
    if args.json:
        # Never a secret: the control endpoint's token stays in the state store.
        print(json.dumps([{k: v for k, v in t.to_dict().items() if k != "control_token"}
                          for t in targets], indent=2))
        return 0
    if not targets:
        print(f"run {args.run} has no registered targets (sessions settle on a time window)")
        return 0
    stale = Settings.from_env(home=args.home).target_stale_s
    now = time.time()
    print(f"{'TARGET':<28} {'ADDRESS':<22} {'PROC':>4} {'PLATFORM':<8} {'FRAMEWORK':<14} "
          f"{'CONTINUOUS':<10} {'STATUS':<6} LAST HEARTBEAT")
    for t in targets:
        beat = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t.last_heartbeat)) \
            if t.last_heartbeat else "-"
        fw = f"{t.framework} {t.framework_version}".strip() or "-"
        status = "up" if t.last_heartbeat and now - t.last_heartbeat <= stale else "down"
        print(f"{t.host:<28} {t.address + ':' + str(t.port):<22} {t.process_index:>4} "
              f"{t.platform or '-':<8} {fw:<14} {t.continuous:<10} {status:<6} {beat}")
        if t.last_error:
            print(f"  last error: {t.last_error}")
    return 0
