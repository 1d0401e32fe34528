"""`mldiag metrics list|show --run R`: the metrics a run's workload recorded with the SDK's
`metrics.record` (kept in the state store: SQLite locally, Firestore on GCP)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from mldiag.bootstrap import control_plane, open_state
from mldiag.cli._home import add_home
from mldiag.errors import MldiagError
from mldiag.model import MetricPoint, summarize_metrics
from mldiag.ports import StateStore
from mldiag.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("metrics", help="the metrics a run recorded (metrics.record)")
    add_home(p)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    ls = verbs.add_parser("list", help="each metric of a run: points, steps, last value")
    show = verbs.add_parser("show", help="a run's recorded points, oldest first")
    for v in (ls, show):
        add_home(v, repeated=True)
        v.add_argument("--run", required=True)
        v.add_argument("--json", action="store_true")
    show.add_argument("--name", action="append", default=[], metavar="METRIC",
                      help="only this metric (repeatable), e.g. step_time")
    show.add_argument("--host", help="only the points this host recorded")
    show.add_argument("--last", type=int, metavar="N", help="only the newest N points")


def _state(settings: Settings) -> StateStore:
    if settings.backend == "gcp":
        return control_plane(settings).state
    return open_state(settings)


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _value(p: MetricPoint) -> str:
    if p.value is not None:
        return f"{p.value:.6g}"
    return p.body if isinstance(p.body, str) else json.dumps(p.body, sort_keys=True)


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env(home=args.home)
    state = _state(settings)
    if state.get_run(args.run) is None:
        raise MldiagError(f"unknown run {args.run!r}")
    if args.verb == "list":
        rows = summarize_metrics(state.list_metrics(args.run))
        if args.json:
            print(json.dumps(rows, indent=2))
            return 0
        if not rows:
            print(f"run {args.run} has recorded no metrics (the SDK's metrics.record)")
            return 0
        print(f"{'METRIC':<28} {'UNIT':<7} {'POINTS':>7} {'STEPS':>15} {'HOSTS':>5}  "
              f"{'LAST VALUE':<14} LAST RECORDED")
        for r in rows:
            steps = ("-" if r["first_step"] is None
                     else f"{r['first_step']}..{r['last_step']}")
            last = r["last_value"]
            shown = f"{last:.6g}" if isinstance(last, float) else json.dumps(last)[:14]
            print(f"{r['name']:<28} {r['unit']:<7} {r['points']:>7} {steps:>15} "
                  f"{len(r['hosts']):>5}  {shown:<14} {_when(r['last_at'])}")
        return 0
    if args.last is not None and args.last < 1:
        raise MldiagError("--last wants a positive number of points")
    names = args.name or [None]
    # With --last and no --host, only the newest points are read from the store.
    limit = args.last if args.host is None else None
    points = sorted((p for n in names for p in state.list_metrics(args.run, n, limit=limit)
                     if args.host is None or p.host == args.host), key=lambda p: p.at)
    if args.last is not None:
        points = points[-args.last:]
    if args.json:
        print(json.dumps([p.to_dict() for p in points], indent=2))
        return 0
    if not points:
        what = ", ".join(args.name) if args.name else "metrics"
        print(f"run {args.run} has no recorded {what}")
        return 0
    print(f"{'RECORDED':<19} {'HOST':<16} {'METRIC':<28} {'STEP':>7}  VALUE")
    for p in points:
        step = "-" if p.step is None else str(p.step)
        print(f"{_when(p.at):<19} {p.host:<16} {p.name:<28} {step:>7}  {_value(p)}")
    return 0
