"""`mldiag continuous start|stop --run R`: continuous profiling (snapshot mode) on targets."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from mldiag.capture.requests import continuous_request, select_targets
from mldiag.cli import _control, _gcloud
from mldiag.cli._home import add_home
from mldiag.errors import MldiagError


def register(sub: Any) -> None:
    p = sub.add_parser("continuous", help="start or stop continuous profiling of a run (also: "
                       "machine-learning-run start|stop-continuous-profiling)",
                       description=DESCRIPTION)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb in ("start", "stop"):
        add_arguments(verbs.add_parser(verb, help=f"{verb} continuous profiling"), verb)


DESCRIPTION = ("Continuous profiling keeps the newest capture windows of each target in a ring "
               "(xprof's own on TPU, the SDK's elsewhere), so `mldiag capture --kind snapshot` "
               "and alerts can save the time just before a problem.")


def add_arguments(v: argparse.ArgumentParser, verb: str) -> None:
    """The flags of `continuous start|stop` and `machine-learning-run
    start|stop-continuous-profiling`."""
    _gcloud.add_run(v)
    v.add_argument("--targets", default="", help="comma-separated target hosts (default: all)")
    add_home(v)
    v.add_argument("--timeout", type=float, default=60.0)
    _gcloud.add_async(v)
    _gcloud.add_scope(v)
    if verb == "start":
        v.add_argument("--window", type=_control.duration, default=2.0,
                       help="length of one capture window (default 2s)")
        v.add_argument("--max-bytes", type=_control.size, default=2 * 1024**3,
                       help="ring size cap per target; oldest windows go first (default 2GiB)")
        _gcloud.add_tracer_levels(v)
        v.add_argument("--xprof-server-port", type=int, default=None, metavar="PORT",
                       help="the port of the targets' profiler servers (gcloud's flag): a "
                       "plain profiler server registered on another port is refused by name")


def run(args: argparse.Namespace) -> int:
    plane = _control.connect(_control.settings_of(args), need_runtime=True)
    options: dict[str, Any] = {}
    if args.verb == "start":
        options = {"window_s": args.window, "max_bytes": args.max_bytes,
                   "device_tracer_level": args.device_tracer_level,
                   "host_tracer_level": args.host_tracer_level,
                   "python_tracer_level": args.python_tracer_level}
    hosts = [h for h in args.targets.split(",") if h]
    port = getattr(args, "xprof_server_port", None)
    if port is not None:
        # mldiag knows each target's port from its registration; the flag can only agree.
        other = [t for t in select_targets(plane, args.run, hosts)
                 if not t.pulls and t.port != port]
        if other:
            raise MldiagError("--xprof-server-port " + str(port) + ": " + "; ".join(
                f"target {t.host} serves its profiler on port {t.port}" for t in other)
                + " (register the server on that port: mldiag profiler-target create)")
    message, down, wanted = continuous_request(plane, args.run, args.verb, hosts=hosts,
                                               options=options)
    for reason in down:
        print(f"mldiag: warning: {reason}", file=sys.stderr)
    request_id = message.request_id
    started = time.time()
    plane.bus.publish(message)
    run_record = _control.get_run(plane, message.run)
    if args.no_wait:
        print(f"continuous {args.verb} requested on {len(wanted)} target(s) of run "
              f"{run_record.name} (request {request_id})")
        return 0
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        now = {(t.host, t.port): t for t in plane.state.list_targets(run_record.name)}
        done = {}
        for key in wanted:
            got = now.get(key)
            if got is None or got.last_request != request_id:
                continue
            done[key] = (f"{got.host}: FAILED {got.last_error}" if got.last_error
                         else f"{got.host}: continuous {got.continuous}")
        if len(done) == len(wanted):
            for line in sorted(done.values()):
                print(line)
            return 1 if any("FAILED" in v for v in done.values()) else 0
        time.sleep(0.1)
    dead = [d["reason"] for d in plane.state.list_dead_letters(since=started - 5.0)
            if request_id in d["payload"]]
    if dead:
        raise MldiagError(f"continuous {args.verb} refused: {dead[-1]}")
    raise MldiagError(f"continuous {args.verb} on run {run_record.name}: no answer from the "
                      f"targets after {args.timeout:.0f} s (is `mldiag up` still running?)")
