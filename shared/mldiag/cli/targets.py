"""`mldiag targets list|create|delete --run R` (gcloud: `profiler-target list
--machine-learning-run R`): the profiler targets of a run, with how each gets its capture
requests (`pull`: the mldiag SDK takes them itself; `push`: the capture stage calls its
profiler server), and the plain profiler servers registered by hand."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from mldiag.bootstrap import control_plane, open_state
from mldiag.capture.requests import PLATFORMS, register_push_target, remove_target
from mldiag.capture.targets import checked_age, statuses
from mldiag.cli import _control, _gcloud
from mldiag.cli._home import add_home
from mldiag.errors import MldiagError

CREATE_HELP = ("register a plain profiler server (jax.profiler.start_server(PORT) in a "
               "workload without the SDK) as a push target of RUN")
CREATE_DESCRIPTION = (
    "Register a workload's profiler server, started with jax.profiler.start_server(PORT) "
    "(or vLLM's / torch_xla's start_server), so that mldiag captures it by connecting to it. "
    "The address must be one the capture stage may connect to "
    "(MLDIAG_CAPTURE_ALLOWED_NETWORKS / _PORTS); its status comes from connecting: up, busy "
    "(another profiling session holds it) or down.")


def register(sub: Any) -> None:
    p = sub.add_parser("targets", help="list, register and remove a run's profiler targets "
                       "(also: profiler-target)")
    add_home(p)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    add_list_arguments(verbs.add_parser("list", help="list the targets of a run"))
    add_create_arguments(verbs.add_parser("create", help=CREATE_HELP,
                                          description=CREATE_DESCRIPTION))
    add_delete_arguments(verbs.add_parser("delete", help="forget a target of RUN"))


def add_list_arguments(ls: argparse.ArgumentParser) -> None:
    """The flags of `targets list` and `profiler-target list`."""
    add_home(ls, repeated=True)
    _gcloud.add_run(ls)
    _gcloud.add_format(ls)
    _gcloud.add_scope(ls)


def add_create_arguments(c: argparse.ArgumentParser) -> None:
    """The arguments of `targets create` and `profiler-target create`."""
    add_home(c, repeated=True)
    c.add_argument("target_run", metavar="RUN", nargs="?",
                   help="the run (or --machine-learning-run)")
    _gcloud.add_run(c, required=False)
    c.add_argument("--address", required=True, metavar="HOST:PORT",
                   help="where its profiler server listens")
    c.add_argument("--host-name", default="", metavar="NAME",
                   help="its name in profile file names (default: target- and 8 random hex "
                        "digits, never the address)")
    c.add_argument("--platform", choices=PLATFORMS, default="",
                   help="the JAX backend of its devices (native continuous profiling is TPU "
                   "only)")
    _gcloud.add_format(c)
    _gcloud.add_scope(c)


def add_delete_arguments(d: argparse.ArgumentParser) -> None:
    """The arguments of `targets delete` and `profiler-target delete`."""
    add_home(d, repeated=True)
    d.add_argument("target_run", metavar="RUN", nargs="?",
                   help="the run (or --machine-learning-run)")
    d.add_argument("target", metavar="TARGET", help="its host name, or HOST:PORT")
    _gcloud.add_run(d, required=False)
    _gcloud.add_scope(d)


def _run_of(args: argparse.Namespace) -> str:
    run = args.target_run or args.run
    if not run:
        raise MldiagError("which run? pass RUN or --machine-learning-run RUN")
    parts = _gcloud.resource(run)
    return parts.get("run", run) if parts else run


def _create(args: argparse.Namespace) -> int:
    plane = control_plane(_control.settings_of(args))
    record, (state, why) = register_push_target(
        plane, _run_of(args), args.address, host_name=args.host_name, platform=args.platform)
    if args.format:
        _gcloud.emit({"name": record.host, **_public(record.to_dict()), "status": state,
                      "down_reason": why}, args.format)
    else:
        print(f"target {record.host} ({record.address}:{record.port}) registered on run "
              f"{record.run}: {state}" + (f" ({why})" if why else ""))
    if state == "down":
        print(f"mldiag: warning: {why}; captures of {record.host} fail until its profiler "
              "server answers", file=sys.stderr)
    return 0


def _delete(args: argparse.Namespace) -> int:
    plane = control_plane(_control.settings_of(args))
    run = _run_of(args)
    target = _gcloud.resource(args.target).get("leaf", args.target)
    gone = remove_target(plane, run, target)
    print(f"target {target} of run {run} deleted ({gone} record{'s' * (gone > 1)})")
    return 0


def _public(record: dict[str, Any]) -> dict[str, Any]:
    # Never a secret: an old record's control-endpoint token is not printed.
    return {k: v for k, v in record.items() if k != "control_token"}


def _print_discovery(run: Any) -> None:
    """What `mldiag kube-discover` recorded on the run: its namespaces and problems."""
    status = (run.configs if run is not None else {}).get("kubernetes")
    if not isinstance(status, dict):
        return
    for ns, state in sorted((status.get("namespaces") or {}).items()):
        print(f"kubernetes namespace {ns}: {state}")
    for problem in status.get("problems") or []:
        print(f"kubernetes: {problem}")


def run(args: argparse.Namespace) -> int:
    if args.verb == "create":
        return _create(args)
    if args.verb == "delete":
        return _delete(args)
    settings = _control.settings_of(args)
    state = open_state(settings)
    if state.get_run(args.run) is None:
        raise MldiagError(f"unknown run {args.run!r}")
    targets = state.list_targets(args.run)
    now = time.time()
    status = dict(zip([(t.host, t.port) for t in targets], statuses(targets, settings, now),
                      strict=True))
    # The last known status, never a fresh connection: a plain profiler server's comes from
    # the background prober, with the age of its check.
    age = {(t.host, t.port): checked_age(t, now) for t in targets}
    if args.format:
        _gcloud.emit([{"name": t.host, **_public(t.to_dict()),
                       "status": status[t.host, t.port][0],
                       "down_reason": status[t.host, t.port][1],
                       "checked_age_s": age[t.host, t.port]} for t in targets],
                     args.format)
        return 0
    _print_discovery(state.get_run(args.run))
    if not targets:
        print(f"run {args.run} has no registered targets (sessions settle on a time window). "
              "A target comes from:\n"
              "  machinelearning_run(..., on_demand_xprof=True)   in a workload (mldiag.sdk)\n"
              f"  mldiag profiler-target create {args.run} --address HOST:PORT   a plain "
              "jax.profiler.start_server(PORT)")
        return 0
    print(f"{'TARGET':<28} {'ADDRESS':<22} {'DELIVERY':<8} {'PROC':>4} {'PLATFORM':<8} "
          f"{'FRAMEWORK':<14} {'CONTINUOUS':<10} {'STATUS':<6} LAST HEARTBEAT")
    for t in targets:
        beat = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t.last_heartbeat)) \
            if t.last_heartbeat else "-"
        fw = f"{t.framework} {t.framework_version}".strip() or "-"
        state_, why = status[t.host, t.port]
        checked = age[t.host, t.port]
        print(f"{t.host:<28} {t.address + ':' + str(t.port):<22} {t.delivery:<8} "
              f"{t.process_index:>4} {t.platform or '-':<8} {fw:<14} {t.continuous:<10} "
              f"{state_:<6} {beat}"
              + (f"  (checked {checked:.0f} s ago)" if checked is not None else ""))
        if why:
            print(f"  {state_}: {why}")
        if t.last_error:
            print(f"  last error: {t.last_error}")
    return 0
