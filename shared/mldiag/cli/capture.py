"""`mldiag capture NAME --run R` (gcloud: `profiler-session capture NAME
--machine-learning-run R`): capture a profile session now, on-demand or as a snapshot."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from mldiag.capture.requests import capture_request
from mldiag.cli import _control, _gcloud
from mldiag.cli._home import add_home
from mldiag.cli.sessions import print_findings
from mldiag.cli.up import describe_transition
from mldiag.errors import MldiagError
from mldiag.model import FAILED, REPORTED, REQUESTED


def register(sub: Any) -> None:
    p = sub.add_parser("capture", help="capture a profile session of a run's targets now "
                       "(also: profiler-session capture)", description=DESCRIPTION)
    add_arguments(p)


DESCRIPTION = ("Publish a capture request (on-demand remote trace, or a snapshot of the "
               "continuous-profiling ring) and follow the session until its report.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `capture` and `profiler-session capture` (gcloud's names and values)."""
    p.add_argument("name", nargs="?", default=None,
                   help="session name, or its full resource name (which names the run too); "
                   "default on-demand-YYYYMMDD-HHMMSS")
    _gcloud.add_run(p, required=False)
    p.add_argument("--targets", default="", help="comma-separated target hosts (default: all)")
    p.add_argument("--kind", choices=("on-demand", "on_demand", "snapshot"),
                   default="on-demand")
    p.add_argument("--duration", default="2s", type=_control.duration,
                   help="trace length, or how far back a snapshot reaches (2s, 5000ms; "
                   "default 2s)")
    _gcloud.add_tracer_levels(p)
    p.add_argument("--is-trace-enabled", action=argparse.BooleanOptionalAction, default=True,
                   help="gcloud's flag: mldiag always captures the trace (a capture without "
                   "one has nothing to analyse), so --no-is-trace-enabled is refused")
    _gcloud.add_async(p)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the report")
    _gcloud.add_format(p)
    _gcloud.add_scope(p)
    add_home(p)


def run(args: argparse.Namespace) -> int:
    if not args.name:
        # gcloud's documented `profiler-session capture` example names no session.
        args.name = time.strftime("on-demand-%Y%m%d-%H%M%S", time.gmtime())
    if not args.run:
        raise MldiagError("which run? pass --machine-learning-run RUN (or --run), or the "
                          "session's full resource name")
    if not getattr(args, "is_trace_enabled", True):
        raise MldiagError("--no-is-trace-enabled: mldiag captures the trace, which is what it "
                          "analyses; drop the flag")
    plane = _control.connect(_control.settings_of(args), need_runtime=True)
    # With --format, stdout carries the session record alone; progress goes to stderr.
    out = sys.stderr if args.format else sys.stdout
    message, down = capture_request(
        plane, args.run, args.name, kind=args.kind,
        hosts=[h for h in args.targets.split(",") if h], duration_s=args.duration,
        host_tracer_level=args.host_tracer_level, device_tracer_level=args.device_tracer_level,
        python_tracer_level=args.python_tracer_level)
    for reason in down:
        print(f"mldiag: warning: {reason} (that host will be marked failed)", file=sys.stderr)
    plane.bus.publish(message)
    run_record = _control.get_run(plane, message.run)
    targets = message.targets
    print(f"capture {run_record.name}/{args.name}: {message.capture.replace('_', '-')} of "
          f"{len(targets)} target(s), {args.duration:g} s", file=out, flush=True)
    if args.no_wait:
        if args.format:
            _gcloud.emit(queued_record(plane, message), args.format)
        return 0
    deadline = time.monotonic() + args.duration + args.timeout
    last = ""
    # Published just now: a refusal is a dead letter recorded from now on.
    since = time.time() - 5.0
    while time.monotonic() < deadline:
        s = plane.state.get_session(run_record.name, args.name)
        if s is None:
            # A request the capture stage refused never becomes a session: its reason is in
            # the dead letters.
            for dead in plane.state.list_dead_letters(since=since):
                if f'"session": "{args.name}"' in str(dead.get("payload", "")):
                    raise MldiagError(f"capture refused: {dead['reason']}")
        else:
            line = describe_transition(s)
            if s.state != last:
                print("  " + line, file=out, flush=True)
                last = s.state
            if s.state in (REPORTED, FAILED):
                for host, h in sorted(s.hosts.items()):
                    if h.status == "FAILED":
                        print(f"  host {host} failed: {h.reason}", file=out)
                if args.format:
                    _gcloud.emit({"name": s.session, **s.to_dict()}, args.format)
                elif s.state == REPORTED:
                    print_findings(plane.storage, s)
                return 0 if s.state == REPORTED else 1
        time.sleep(0.1)
    raise MldiagError(f"session {run_record.name}/{args.name} not finished after "
                      f"{args.timeout:.0f} s (see `mldiag sessions describe`)")


def queued_record(plane: Any, message: Any) -> dict[str, Any]:
    """What `--async --format` shows of a request just queued: the session as far as it
    exists (`name`, `state`, as a finished capture shows them; REQUESTED until the capture
    stage takes it) and the request's own fields."""
    request = json.loads(message.to_json())
    s = plane.state.get_session(message.run, message.session)
    if s is not None:
        return {**request, "name": s.session, **s.to_dict()}
    return {**request, "name": message.session, "state": REQUESTED}
