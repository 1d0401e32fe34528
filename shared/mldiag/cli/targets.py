"""`mldiag targets list --run R` (gcloud: `profiler-target list --machine-learning-run R`):
the profiler targets registered for a run, with how each gets its capture requests (`pull`:
the mldiag SDK takes them itself; `push`: the capture stage calls its profiler server)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from mldiag.bootstrap import open_state
from mldiag.capture.targets import liveness
from mldiag.cli import _control, _gcloud
from mldiag.cli._home import add_home
from mldiag.errors import MldiagError


def register(sub: Any) -> None:
    p = sub.add_parser("targets", help="list a run's profiler targets (also: profiler-target "
                       "list)")
    add_home(p)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    add_list_arguments(verbs.add_parser("list", help="list the targets of a run"))


def add_list_arguments(ls: argparse.ArgumentParser) -> None:
    """The flags of `targets list` and `profiler-target list`."""
    add_home(ls, repeated=True)
    _gcloud.add_run(ls)
    _gcloud.add_format(ls)
    _gcloud.add_scope(ls)


def run(args: argparse.Namespace) -> int:
    settings = _control.settings_of(args)
    state = open_state(settings)
    if state.get_run(args.run) is None:
        raise MldiagError(f"unknown run {args.run!r}")
    targets = state.list_targets(args.run)
    now = time.time()
    status = {(t.host, t.port): liveness(t, settings, now) for t in targets}
    if args.format:
        # Never a secret: an old record's control-endpoint token is not printed.
        _gcloud.emit([{"name": t.host, **{k: v for k, v in t.to_dict().items()
                                          if k != "control_token"},
                       "status": "down" if status[t.host, t.port] else "up",
                       "down_reason": status[t.host, t.port]} for t in targets], args.format)
        return 0
    if not targets:
        print(f"run {args.run} has no registered targets (sessions settle on a time window)")
        return 0
    print(f"{'TARGET':<28} {'ADDRESS':<22} {'DELIVERY':<8} {'PROC':>4} {'PLATFORM':<8} "
          f"{'FRAMEWORK':<14} {'CONTINUOUS':<10} {'STATUS':<6} LAST HEARTBEAT")
    for t in targets:
        beat = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t.last_heartbeat)) \
            if t.last_heartbeat else "-"
        fw = f"{t.framework} {t.framework_version}".strip() or "-"
        down = status[t.host, t.port]
        print(f"{t.host:<28} {t.address + ':' + str(t.port):<22} {t.delivery:<8} "
              f"{t.process_index:>4} {t.platform or '-':<8} {fw:<14} {t.continuous:<10} "
              f"{'down' if down else 'up':<6} {beat}")
        if down:
            print(f"  down: {down}")
        if t.last_error:
            print(f"  last error: {t.last_error}")
    return 0
