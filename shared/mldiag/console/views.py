"""The console's read model: runs, targets and sessions as plain dicts, the same for the HTML
pages and the JSON API. What a principal may not see is left out here, not in templates."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

from mldiag.access import PROFILE, Principal
from mldiag.analysis import after_headline, hosts_section, judged_over, none_found
from mldiag.capture.targets import checked_age, describe
from mldiag.capture.targets import status as status_of
from mldiag.console.charts import ALERT, ALERT_TO_CAPTURE_S, STEP_TIME, step_time_chart
from mldiag.console.context import Console
from mldiag.console.redaction import redacted, session_reasons, without_locations
from mldiag.listing import MAX_LIMIT, RunQuery, SessionQuery
from mldiag.model import (
    REPORTED,
    TERMINAL,
    RunRecord,
    SessionRecord,
    TargetRecord,
    summarize_metrics,
)
from mldiag.viewer_cache import session_dir, unviewable

log = logging.getLogger(__name__)
# How many of a run's newest metric points the run page reads: for the table of metrics,
# and of step times (one line per host) and alerts for the chart.
TABLE_POINTS, CHART_POINTS, CHART_ALERTS = 20_000, 20_000, 500


def _iso(t: float) -> str | None:
    if not t:
        return None
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat(timespec="seconds")


def target_views(console: Console, targets: list[TargetRecord]) -> list[dict[str, Any]]:
    """The targets as the pages show them, with their last known status and its age (a
    plain profiler server's from the background prober: nothing is connected to here)."""
    return [target_view(console, t) for t in targets]


def target_view(console: Console, t: TargetRecord,
                state: tuple[str, str] | None = None) -> dict[str, Any]:
    now = console.clock()
    age = now - t.last_heartbeat if t.last_heartbeat else None
    status, why = state or status_of(t, console.settings, now)
    checked = checked_age(t, now)
    return {"status": status, "down_reason": why, "host": t.host, "address": t.address,
            "port": t.port,
            # "up, checked 40 s ago": the last check of a plain profiler server, and its age.
            "status_text": describe(t, console.settings, now),
            "checked_at": _iso(t.probed_at) if checked is not None else None,
            "checked_age_s": None if checked is None else round(checked, 1),
            "process_index": t.process_index, "platform": t.platform,
            "framework": " ".join(x for x in (t.framework, t.framework_version) if x),
            "up": status == "up", "last_heartbeat": _iso(t.last_heartbeat),
            "heartbeat_age_s": None if age is None else round(age, 1),
            "continuous": t.continuous, "continuous_since": _iso(t.continuous_since),
            "delivery": t.delivery, "last_error": t.last_error}


def _top_finding(analysis: dict[str, Any] | None) -> str:
    if not analysis:
        return ""
    findings = analysis.get("findings") or []
    if not findings:
        return ""
    f = findings[0]
    return f"{f.get('priority', '')} {f.get('title', '')}".strip()


def read_analysis(console: Console, s: SessionRecord) -> dict[str, Any] | None:
    """The session's latest analysis.json, or None (not reported, or unreadable)."""
    if s.state != "REPORTED" or not s.hosts:
        return None
    name = f"{session_dir(s)}/analysis/analysis.json"
    try:
        data = json.loads(console.plane.storage.read_bytes(name))
    except (OSError, ValueError) as e:
        log.warning("cannot read %s: %s", name, e)
        return None
    return data if isinstance(data, dict) else None


def _reason(principal: Principal, s: SessionRecord, text: str) -> str:
    """A failure reason as `principal` may read it: whole for those who may view profiles
    (and so targets), without addresses and server paths for analysis_viewer."""
    return text if principal.can(PROFILE, s.run, s.session) else without_locations(text)


# How each kind of session came to be, in words.
_KINDS = {
    "on_demand": ("on demand", "captured on request (console, CLI or an alert) from the "
                  "workload's profiler"),
    "snapshot": ("snapshot", "the last seconds of the workload's continuous profiling"),
    "programmatic": ("by the workload", "the workload's own code captured it (the SDK's "
                     "profile window or capture call)"),
}
_DROPPED = ("dropped in the bucket", "nothing asked for this capture: its profile file "
            "appeared in the bucket (copied there, or uploaded by a workload that did not "
            "announce it)")


def kind_label(s: SessionRecord) -> tuple[str, str]:
    """(label, explanation) of how the session was captured ("dropped in the bucket" when
    nothing asked for it: `SessionRecord.dropped`)."""
    if s.dropped:
        return _DROPPED
    return _KINDS.get(s.kind, (s.kind, ""))


def session_row(s: SessionRecord, principal: Principal,
                analysis: dict[str, Any] | None = None) -> dict[str, Any]:
    end = s.timings.get(s.state, s.updated_at) if s.state in TERMINAL else None
    label, note = kind_label(s)
    return {"run": s.run, "session": s.session, "state": s.state, "version": s.version,
            "kind": s.kind, "kind_label": label, "kind_note": note,
            "trigger": s.trigger, "verdict": s.verdict,
            "top_finding": _top_finding(analysis), "created": _iso(s.created_at),
            "updated": _iso(s.updated_at),
            "duration_s": round(end - s.created_at, 1) if end and s.created_at else None,
            "hosts": len(s.hosts), "reason": _reason(principal, s, s.reason)}


def run_row(console: Console, run: RunRecord) -> dict[str, Any]:
    """A run as its list shows it: two one-row queries of its sessions (the newest, and the
    newest reported), whatever their number."""
    state = console.plane.state
    targets = state.list_targets(run.name)
    up = sum(1 for t in target_views(console, targets) if t["up"])
    newest = state.query_sessions(SessionQuery(run=run.name, limit=1)).items
    reported = state.query_sessions(SessionQuery(run=run.name, state=REPORTED, limit=1)).items
    latest = newest[0] if newest else None
    return {"name": run.name, "run_group": run.run_group, "created": _iso(run.created_at),
            "targets_up": up, "targets_total": len(targets),
            "latest": {"session": latest.session, "state": latest.state,
                       "created": _iso(latest.created_at)} if latest else None,
            "last_verdict": reported[0].verdict if reported else None,
            "discovered": run.discovered}


def runs_view(console: Console, principal: Principal,
              query: RunQuery | None = None) -> tuple[list[dict[str, Any]], str]:
    """One page of the runs `principal` may see, and the next page's cursor ("" on the
    last). A run the principal may not browse is left out of its page."""
    page = console.plane.state.query_runs(query or RunQuery())
    return ([run_row(console, r) for r in page.items if principal.can("browse", r.name)],
            page.next_cursor)


def sessions_page(console: Console, principal: Principal,
                  query: SessionQuery) -> tuple[list[dict[str, Any]], str]:
    """One page of sessions as rows (with their top finding, read for this page only), and
    the next page's cursor. Sessions of runs the principal may not browse are left out."""
    page = console.plane.state.query_sessions(query)
    return ([session_row(s, principal, read_analysis(console, s)) for s in page.items
             if principal.can("browse", s.run)], page.next_cursor)


def run_view(console: Console, principal: Principal, run: RunRecord, *,
             query: SessionQuery | None = None, chart: bool = False) -> dict[str, Any]:
    """A run, one page of its sessions (`query`, default the newest), targets, configs and
    recorded metrics; with `chart`, also the step-time chart's geometry (for the HTML page),
    and the newest reported sessions (to compare two)."""
    state = console.plane.state
    rows, next_cursor = sessions_page(console, principal, query or SessionQuery(run=run.name))
    targets = target_views(console, state.list_targets(run.name))
    continuous = [t for t in targets if t["continuous"] != "OFF"]
    since = min((t["continuous_since"] for t in continuous if t["continuous_since"]),
                default=None)
    view = run_row(console, run)
    view.update({
        "configs": run.configs,
        "storage_prefix": run.storage_prefix if principal.can(PROFILE, run.name)
        else without_locations(run.storage_prefix),
        "on_demand": run.on_demand,
        "auto_capture": run.policy.to_dict(),
        "continuous": {"on": len(continuous), "of": len(targets), "since": since},
        "sessions_list": rows,
        "next_cursor": next_cursor,
        # The session alert-triggered sessions are compared with: pinned, else "" (the most
        # recent OPTIMAL one).
        "baseline": run.baseline,
        # Whether a capture has anywhere to go (a live target), and why not.
        "live_targets": sum(1 for t in targets if t["up"]),
    })
    # What the workload recorded with the SDK's metrics.record (its newest points: a long
    # run's history is for `mldiag metrics show`), and step time charted.
    recent = state.list_metrics(run.name, limit=TABLE_POINTS)
    view["metrics"] = summarize_metrics(recent)
    view["metrics_of_newest"] = TABLE_POINTS if len(recent) >= TABLE_POINTS else None
    if chart:
        points = (state.list_metrics(run.name, STEP_TIME, limit=CHART_POINTS)
                  + state.list_metrics(run.name, ALERT, limit=CHART_ALERTS))
        steps = [p.at for p in points if p.name == STEP_TIME]
        # The captures the chart marks: those made while steps were recorded (at most a
        # page's worth, the newest).
        marked = state.query_sessions(SessionQuery(
            run=run.name, since=min(steps) - ALERT_TO_CAPTURE_S, until=max(steps) + 1.0,
            limit=MAX_LIMIT)).items if steps else []
        view["step_chart"] = step_time_chart(points, marked)
        view["reported"] = [x.session for x in state.query_sessions(
            SessionQuery(run=run.name, state=REPORTED, limit=MAX_LIMIT)).items]
    # Addresses and ports of profiler servers are for those who may view profiles.
    view["targets"] = targets if principal.can(PROFILE, run.name) else []
    return view


def session_view(console: Console, principal: Principal, s: SessionRecord, *,
                 pod: bool = False) -> dict[str, Any]:
    """A session, its hosts, history and findings; with `pod`, also the report's view of a
    multi-host session's hosts side by side (for the HTML page: the same table and heat map
    as summary.html, from analysis.json's `hosts`)."""
    analysis = read_analysis(console, s)
    may_profile = principal.can(PROFILE, s.run, s.session)
    if analysis is not None and not may_profile:
        analysis = redacted(analysis, session_reasons(s))
    view = session_row(s, principal, analysis)
    view.update({
        "alert_baseline": s.trigger == "alert" and "baseline" in s.note,
        "history": sorted(({"state": k, "at": _iso(v)} for k, v in s.timings.items()),
                          key=lambda h: h["at"] or ""),
        "expected_hosts": s.expected_hosts,
        "hosts_list": [{"host": h, "status": r.status, "size": r.size,
                        "arrived": _iso(r.arrived_at), "reason": _reason(principal, s, r.reason)}
                       for h, r in sorted(s.hosts.items())],
        "note": s.note,
        "has_report": analysis is not None,
        # The verdict, said once: without the "what changed" sentence it may start with,
        # which the page shows in its own section above.
        "summary": after_headline(str((analysis or {}).get("summary") or ""),
                                  str(((analysis or {}).get("regression") or {})
                                      .get("headline") or "")),
        # The same words as the report's: what it was judged over, and what to say of no
        # findings (mldiag.analysis.judgement.verdict).
        "judged_over": judged_over((analysis or {})["reading"])
        if isinstance((analysis or {}).get("reading"), dict) else "",
        "no_findings": none_found(str((analysis or {}).get("status") or s.verdict or ""),
                                  [c for c in (analysis or {}).get("checks") or []
                                   if isinstance(c, dict)]),
        "findings": [{"priority": f.get("priority"), "category": f.get("category"),
                      "title": f.get("title"), "impact": f.get("impact"),
                      "fix": f.get("fix") or f.get("recommendation")}
                     for f in (analysis or {}).get("findings", [])],
        "can_view_profile": may_profile,
        # Why the XProf viewer would refuse to open now (no I/O unless a host is too large
        # for the console to convert).
        "viewer_note": unviewable(s, console.plane.storage, console.viewers.memory_budget)
        if may_profile else None,
        "regression": _regression(s, analysis),
    })
    if pod:
        hosts = (analysis or {}).get("hosts")
        section = hosts_section(hosts) if isinstance(hosts, dict) else None
        # The console's own "hosts" section lists the xplanes: this one gets its own anchor.
        view["pod"] = (replace(section, anchor="pod", title="Hosts side by side") if section
                     else None)
    return view


def _regression(s: SessionRecord, analysis: dict[str, Any] | None) -> dict[str, Any] | None:
    """What changed since the run's baseline, for an alert-triggered session's report: the
    baseline and the diff's sentence, or why there is no baseline."""
    block = (analysis or {}).get("regression")
    if not isinstance(block, dict):
        return None
    baseline = block.get("baseline") or {}
    return {"baseline": (f"{baseline.get('run')}/{baseline.get('session')}"
                         if baseline else None),
            "baseline_session": baseline.get("session") if baseline else None,
            "why": baseline.get("why", "") if baseline else "",
            "headline": block.get("headline", ""), "reason": block.get("reason", ""),
            "has_diff": bool(baseline)}
