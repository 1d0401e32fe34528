"""`mldiag runs create|list|describe|set-baseline` (gcloud: `machine-learning-run
list|describe`): the runs the state store knows."""

from __future__ import annotations

import argparse
import time
from typing import Any

from mldiag.analysis import OPTIMAL
from mldiag.bootstrap import control_plane, open_state
from mldiag.cli import _control, _gcloud
from mldiag.cli._home import add_home
from mldiag.errors import MldiagError
from mldiag.model import REPORTED, RunRecord, check_name
from mldiag.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("runs", help="create, list and describe runs")
    add_home(p)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    c = verbs.add_parser("create", help="register a run (the SDK does it for a workload)")
    add_home(c, repeated=True)
    c.add_argument("name")
    c.add_argument("--run-group")
    c.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="a configuration value to record (repeatable)")
    c.add_argument("--gcs-path", help="gs://BUCKET/PREFIX where its profiles go (GCP)")
    c.add_argument("--on-demand", action="store_true", help="its targets serve on-demand "
                   "captures")
    add_list_arguments(verbs.add_parser("list", help="list runs"))
    add_describe_arguments(verbs.add_parser("describe", help="one run and its sessions"))
    b = verbs.add_parser("set-baseline", help="pin the session its degraded sessions are "
                         "compared with", description="Alert-triggered sessions of the run are "
                         "compared with this session (default: the run's most recent OPTIMAL "
                         "session). --clear goes back to the default.")
    add_home(b, repeated=True)
    b.add_argument("name", metavar="RUN")
    b.add_argument("session", metavar="SESSION", nargs="?")
    b.add_argument("--clear", action="store_true", help="unpin: compare with the most recent "
                   "OPTIMAL session again")


def add_list_arguments(ls: argparse.ArgumentParser) -> None:
    """The flags of `runs list` and `machine-learning-run list`."""
    add_home(ls, repeated=True)
    _gcloud.add_format(ls)
    _gcloud.add_scope(ls)


def add_describe_arguments(d: argparse.ArgumentParser) -> None:
    """The flags of `runs describe` and `machine-learning-run describe`."""
    add_home(d, repeated=True)
    d.add_argument("name", help="the run's name, or its full resource name")
    _gcloud.add_format(d)
    _gcloud.add_scope(d)


def _create(args: argparse.Namespace) -> int:
    try:
        check_name("run", args.name)
    except ValueError as e:
        raise MldiagError(str(e)) from e
    configs: dict[str, str] = {}
    for item in args.config:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise MldiagError(f"--config wants KEY=VALUE, not {item!r}")
        configs[key] = value
    prefix = ""
    if args.gcs_path:
        if not args.gcs_path.startswith("gs://"):
            raise MldiagError(f"--gcs-path must look like gs://BUCKET[/PREFIX], not "
                              f"{args.gcs_path!r}")
        prefix = args.gcs_path[len("gs://"):].partition("/")[2].strip("/")
    plane = control_plane(Settings.from_env(home=args.home))
    existed = plane.state.get_run(args.name) is not None
    run = plane.state.register_run(RunRecord(
        name=args.name, run_group=args.run_group, configs=configs, storage_prefix=prefix,
        on_demand=args.on_demand, created_at=time.time()))
    print(f"run {run.name} {'updated' if existed else 'created'}")
    return 0


def _set_baseline(args: argparse.Namespace) -> int:
    if bool(args.session) == bool(args.clear):
        raise MldiagError("pass SESSION, or --clear to unpin the baseline")
    plane = control_plane(Settings.from_env(home=args.home))
    if plane.state.get_run(args.name) is None:
        raise MldiagError(f"unknown run {args.name!r}")
    if not args.session:
        plane.state.set_baseline(args.name, "")
        print(f"run {args.name}: baseline unpinned (the most recent OPTIMAL session)")
        return 0
    s = plane.state.get_session(args.name, args.session)
    if s is None:
        raise MldiagError(f"unknown session {args.name}/{args.session}")
    if s.state != REPORTED:
        raise MldiagError(f"session {s.key} is {s.state}: a baseline needs a report")
    plane.state.set_baseline(args.name, args.session)
    note = "" if s.verdict == OPTIMAL else f" (its verdict is {s.verdict}, not OPTIMAL)"
    print(f"run {args.name}: baseline {args.session}{note}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.verb == "create":
        return _create(args)
    if args.verb == "set-baseline":
        return _set_baseline(args)
    state = open_state(_control.settings_of(args))
    if args.verb == "list":
        runs = state.list_runs()
        if getattr(args, "limit", None) is not None:
            runs = runs[:max(0, args.limit)]
        if args.format:
            _gcloud.emit([r.to_dict() for r in runs], args.format)
            return 0
        if not runs:
            print("no runs yet. A run comes from:\n"
                  "  mldiag add LOGDIR --run RUN      profiles you have (a jax.profiler.trace "
                  "logdir)\n"
                  "  machinelearning_run(name=...)    in a workload (mldiag.sdk)\n"
                  "  mldiag runs create RUN           by hand")
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
    if args.format:
        _gcloud.emit({**found.to_dict(), "sessions": [s.session for s in sessions]},
                     args.format)
        return 0
    print(f"run: {found.name}" + ("  (discovered in bucket)" if found.discovered else ""))
    if found.run_group:
        print(f"  group: {found.run_group}")
    for key, value in sorted(found.configs.items()):
        print(f"  config {key} = {value}")
    policy = found.policy
    print(f"  auto-capture: {'ON' if policy.enabled else 'OFF'} ({policy.kind}, "
          f"{policy.duration_s:g} s, cooldown {policy.cooldown_s:g} s, "
          f"max {policy.max_per_hour}/hour)")
    print(f"  baseline: {found.baseline or 'the most recent OPTIMAL session'}")
    if found.rl_orchestrator:
        print(f"  rl orchestrator: {found.rl_orchestrator}")
    targets = state.list_targets(found.name)
    print(f"  targets: {len(targets)}")
    for s in sessions:
        print(f"  {s.session}  v{s.version}  {s.state}  {s.verdict or ''}")
    return 0
