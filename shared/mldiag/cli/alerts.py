"""`mldiag alerts publish`: raise a degradation alert, as a monitor would.

The alert goes on the `degradation-alerts` topic (the local runtime's queue, or Pub/Sub on
Google Cloud), where `on_degradation_alert` applies the run's auto-capture policy: with the
policy enabled (`mldiag autocapture set --run R --enable`) and a live target, a capture
starts. Either describe the alert with flags, or pass `--file` with a payload in any shape
the pipeline accepts: a Cloud Monitoring incident notification (`{"incident": {...}}`, the run
in a `run` label), a workload-monitoring event (`type: PERFORMANCE_DEGRADATION`), or
mldiag's own `DegradationDetected`. The payload is checked here first, so a bad one is
refused with the reason instead of becoming a dead letter.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from mldiag.capture.alerts import alert_session, parse_alert
from mldiag.cli import _control
from mldiag.cli._home import add_home
from mldiag.errors import MldiagError, PoisonMessage
from mldiag.messages import DegradationDetected


def register(sub: Any) -> None:
    p = sub.add_parser("alerts", help="raise a degradation alert on a run (what a monitor "
                       "does; the run's auto-capture policy decides on a capture)",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    pub = verbs.add_parser("publish", help="publish one alert on the degradation-alerts topic")
    pub.add_argument("--run", "--machine-learning-run", dest="run", metavar="RUN",
                     help="the run the alert is about (required without --file)")
    pub.add_argument("--file", metavar="PATH", help="an alert payload as JSON (- for stdin): "
                     "a Cloud Monitoring incident, a workload-monitoring event or a "
                     "DegradationDetected")
    pub.add_argument("--metric", help="the degrading metric, for the alert's summary "
                     "(e.g. step_time)")
    pub.add_argument("--value", help="its value when the alert fired (e.g. 0.41)")
    pub.add_argument("--summary", default="", help="what the monitor saw, in words")
    pub.add_argument("--target", action="append", default=[], metavar="HOST",
                     help="the target that alerted (repeatable; the capture takes every live "
                     "target of the run all the same)")
    pub.add_argument("--id", dest="alert_id", help="the alert's id; alerts are deduplicated "
                     "on it (default: a new one)")
    add_home(pub)


def alert_of(args: argparse.Namespace) -> DegradationDetected | None:
    """The alert the flags or the file describe; None for a payload that asks for nothing
    (a closed incident, nothing DETECTED)."""
    if args.file:
        if any((args.metric, args.value, args.summary, args.target, args.alert_id)):
            raise MldiagError("--file carries the whole alert: drop --metric, --value, "
                              "--summary, --target and --id")
        try:
            payload = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        except OSError as e:
            raise MldiagError(f"cannot read {args.file}: {e}") from e
        try:
            alert = parse_alert(payload)
        except PoisonMessage as e:
            raise MldiagError(f"{args.file}: {e}") from e
        if alert is not None and args.run and alert.run != args.run:
            raise MldiagError(f"{args.file} names run {alert.run!r}, not {args.run!r}")
        return alert
    if not args.run:
        raise MldiagError("which run? pass --run RUN, or --file with an alert payload")
    measured = f"{args.metric} = {args.value}" if args.metric and args.value else (
        args.metric or (f"value {args.value}" if args.value else ""))
    summary = "; ".join(p for p in (args.summary, measured) if p) or "raised by hand"
    return DegradationDetected(alert_id=args.alert_id or f"cli:{uuid.uuid4().hex[:12]}",
                               run=args.run, source="mldiag-cli", summary=summary[:2000],
                               targets=list(args.target), detected_at=time.time())


def run(args: argparse.Namespace) -> int:
    alert = alert_of(args)
    if alert is None:
        print("the alert says nothing is wrong (a closed incident, or no analyzer DETECTED): "
              "nothing published")
        return 0
    settings = _control.settings_of(args)
    plane = _control.connect(settings, need_runtime=False)
    record = plane.state.get_run(alert.run)
    if record is None:
        raise MldiagError(f"unknown run {alert.run!r} (see `mldiag runs list`): an alert "
                          "must name a run that exists")
    plane.bus.publish(alert)
    print(f"alert {alert.alert_id} published on run {alert.run}: {alert.summary}")
    policy = record.policy
    if not policy.enabled:
        print(f"auto-capture is off for run {alert.run}, so no capture follows "
              f"(`mldiag autocapture set --run {alert.run} --enable` turns it on)")
    else:
        print(f"auto-capture is on: unless the cooldown ({policy.cooldown_s:g} s) or the hourly "
              f"cap ({policy.max_per_hour}) holds it back, its capture is session "
              f"{alert.run}/{alert_session(alert.alert_id)} "
              f"(`mldiag sessions describe {alert.run}/{alert_session(alert.alert_id)}`)")
    if settings.backend == "local" and not _control.runtime_running(settings):
        print(f"note: no `mldiag up` is running on {settings.home}; the alert is delivered "
              "when it starts")
    return 0
