"""`mldiag monitored-events list|describe --machine-learning-run R` (gcloud alpha
mldiagnostics monitored-events): the degradation alerts a run received, and what mldiag did
with each.

An event is an alert mldiag knows of: one the SDK's step-time monitor raised (kept with the
run's metrics as `mldiag_alert`), or one that started an automatic capture (an alert-triggered
session, from any source: the SDK, Cloud Monitoring, workload monitoring). Its analyzer report
is that session's: its state, verdict and top finding. Alerts refused before reaching a run
(an unknown run, a bad payload) are dead letters: `mldiag dead-letters list`.
"""

from __future__ import annotations

import argparse
import datetime
import json
from typing import Any

from mldiag.bootstrap import open_state
from mldiag.cli import _control, _gcloud
from mldiag.cli._home import add_home
from mldiag.errors import MldiagError
from mldiag.ports import StateStore

ALERT_METRIC = "mldiag_alert"  # what the SDK's monitor records (mldiag.sdk.metrics)


def register(sub: Any) -> None:
    p = sub.add_parser("monitored-events", help="the degradation alerts of a run and what "
                       "they captured (gcloud alpha mldiagnostics monitored-events)",
                       description=__doc__)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    ls = verbs.add_parser("list", help="the alerts of a run, oldest first")
    d = verbs.add_parser("describe", help="one alert, with its analyzer report")
    d.add_argument("event", metavar="MONITORED_EVENT", help="its id, or full resource name")
    for v in (ls, d):
        add_home(v, repeated=True)
        _gcloud.add_run(v)
        _gcloud.add_format(v)
        _gcloud.add_scope(v)


def _iso(t: float) -> str | None:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat().replace(
        "+00:00", "Z") if t else None


def events(state: StateStore, run: str) -> list[dict[str, Any]]:
    """The run's monitored events, oldest first, as gcloud shows MonitoredEvents."""
    found: dict[str, dict[str, Any]] = {}
    for point in state.list_metrics(run, ALERT_METRIC):
        body = point.body if isinstance(point.body, dict) else {}
        event_id = str(body.get("alert_id") or f"{point.host}-{point.at:.0f}")
        found[event_id] = {"name": event_id, "type": "PERFORMANCE_DEGRADATION",
                           "displayName": str(body.get("summary") or "performance degradation"),
                           "startTime": _iso(point.at), "source": "mldiag-monitor",
                           "host": point.host, "analyzerInsightFound": False,
                           "analyzerReports": []}
    for s in state.list_sessions(run=run):
        if s.trigger != "alert" or not s.request_id.startswith("alert:"):
            continue
        event_id = s.request_id[len("alert:"):]
        event = found.setdefault(event_id, {
            "name": event_id, "type": "PERFORMANCE_DEGRADATION",
            "displayName": s.note or "performance degradation",
            "startTime": _iso(s.created_at), "source": s.note.partition(" alert")[0],
            "analyzerInsightFound": False, "analyzerReports": []})
        event["profilerSession"] = s.session
        event["analyzerInsightFound"] = s.state == "REPORTED"
        event["analyzerReports"].append({
            "analyzer": "mldiag", "profilerSession": s.session, "state": s.state,
            "detectionState": "DETECTED" if s.verdict == "NEEDS_ATTENTION" else
            "NOT_DETECTED" if s.verdict else "PENDING",
            "details": s.reason or (f"verdict {s.verdict}" if s.verdict else s.state),
            "recommendedActions": [{"description": f"open the report of session {s.session}: "
                                    f"mldiag sessions describe {s.session} --run {run}"}]})
    return sorted(found.values(), key=lambda e: (e["startTime"] or "", e["name"]))


def run(args: argparse.Namespace) -> int:
    state = open_state(_control.settings_of(args))
    if state.get_run(args.run) is None:
        raise MldiagError(f"unknown run {args.run!r}")
    found = events(state, args.run)
    if args.verb == "describe":
        match = [e for e in found if e["name"] == args.event]
        if not match:
            raise MldiagError(f"run {args.run} has no monitored event {args.event!r} (known: "
                              f"{', '.join(e['name'] for e in found) or 'none'})")
        if args.format:
            _gcloud.emit(match[0], args.format)
        else:
            print(json.dumps(match[0], indent=2, sort_keys=True))
        return 0
    if args.format:
        _gcloud.emit(found, args.format)
        return 0
    if not found:
        print(f"run {args.run} has no monitored events")
        return 0
    print(f"{'EVENT':<48} {'START':<21} {'SESSION':<18} SUMMARY")
    for e in found:
        print(f"{e['name']:<48} {e['startTime'] or '-':<21} "
              f"{e.get('profilerSession', '-'):<18} {e['displayName']}")
    return 0
