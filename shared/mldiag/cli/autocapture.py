"""`mldiag autocapture set|show --run R`: what a degradation alert on a run does."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

from mldiag.cli import _control
from mldiag.cli._home import add_home
from mldiag.errors import MldiagError
from mldiag.model import AutoCapturePolicy


def register(sub: Any) -> None:
    p = sub.add_parser("autocapture", help="set or show a run's auto-capture policy",
                       description="When a degradation alert names a run (workload monitoring, "
                       "Cloud Monitoring, or the SDK's step-time monitor), its policy decides "
                       "whether and how a profile is captured.")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    s = verbs.add_parser("set", help="change the policy (unset options keep their value)")
    s.add_argument("--run", required=True)
    on = s.add_mutually_exclusive_group()
    on.add_argument("--enable", dest="enabled", action="store_true", default=None)
    on.add_argument("--disable", dest="enabled", action="store_false")
    s.add_argument("--kind", choices=("auto", "on-demand", "snapshot"),
                   help="auto: a snapshot when continuous profiling is on, else on-demand")
    s.add_argument("--duration", type=_control.duration)
    s.add_argument("--cooldown", type=_control.duration,
                   help="minimum time between two automatic captures (e.g. 5m)")
    s.add_argument("--max-per-hour", type=int)
    add_home(s)
    sh = verbs.add_parser("show", help="print the policy")
    sh.add_argument("--run", required=True)
    sh.add_argument("--json", action="store_true")
    add_home(sh)


def _print(run: str, policy: AutoCapturePolicy) -> None:
    print(f"run {run}: auto-capture {'ON' if policy.enabled else 'OFF'}  kind "
          f"{policy.kind.replace('_', '-')}  duration {policy.duration_s:g} s  cooldown "
          f"{policy.cooldown_s:g} s  max {policy.max_per_hour}/hour")


def run(args: argparse.Namespace) -> int:
    plane = _control.connect(args.home, need_runtime=False)
    record = _control.get_run(plane, args.run)
    if args.verb == "show":
        if args.json:
            print(json.dumps(record.policy.to_dict(), indent=2))
        else:
            _print(record.name, record.policy)
        return 0
    changes = {k: v for k, v in {
        "enabled": args.enabled, "kind": args.kind.replace("-", "_") if args.kind else None,
        "duration_s": args.duration, "cooldown_s": args.cooldown,
        "max_per_hour": args.max_per_hour}.items() if v is not None}
    try:
        policy = replace(record.policy, **changes)
    except ValueError as e:
        raise MldiagError(str(e)) from e
    if plane.state.set_auto_capture(record.name, policy.to_dict()) is None:
        raise MldiagError(f"unknown run {args.run!r}")
    _print(record.name, policy)
    return 0
