"""The analysis engine: collect → triage → investigate → analysis.json + summary.html.

Each step is a plain function so the pipeline stages (and the CLI) can call them one by one;
`analyze` runs them all for one session and writes the four artifacts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mldiag
from mldiag.analysis.collection.collect import ProgressFn, collect, write_json
from mldiag.analysis.collection.profile_input import ProfileSession, resolve_session
from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.followups import MAX_FOLLOW_UPS, FollowUps
from mldiag.analysis.judgement.investigator import RuleBasedInvestigator
from mldiag.analysis.judgement.model import Triage
from mldiag.analysis.judgement.reading import read_session
from mldiag.analysis.judgement.triage import OPTIMAL, triage
from mldiag.analysis.judgement.verdict import conclude
from mldiag.analysis.report.model import readable
from mldiag.analysis.report.summary import render_summary_html
from mldiag.ports import Investigator

ANALYSIS_SCHEMA_VERSION = "1.0"
ARTIFACTS = ("health_snapshot.json", "investigation.json", "analysis.json", "summary.html")


@dataclass(frozen=True)
class AnalysisResult:
    """Where the artifacts of one analysis were written, and the analysis itself."""

    out_dir: Path
    analysis: dict[str, Any]

    @property
    def summary_html(self) -> Path:
        return self.out_dir / "summary.html"


def session_from_snapshot(snapshot: Mapping[str, Any]) -> ProfileSession:
    """Re-open the session a snapshot was collected from (for follow-up calls)."""
    return resolve_session(str(snapshot["session"]["path"]))


def precomputed_follow_ups(snapshot: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """What collection already computed for follow-ups: tool → {args, data, how}."""
    known = dict(snapshot.get("precomputed_follow_ups") or {})
    # Snapshots collected before that block carried the host-bound one in the timeline
    # pass (filed in the step trace before passes had names; ev.get reads either).
    old = ev.get(snapshot, ev.TIMELINE, "host_python_events")
    if isinstance(old, Mapping):
        known.setdefault("aggregate_xplane_events", old)
    return known


def investigate(
    snapshot: Mapping[str, Any],
    result: Triage,
    investigator: Investigator | None = None,
    session: ProfileSession | None = None,
) -> dict[str, Any]:
    """Run the investigator; healthy profiles short-circuit with no follow-up calls.

    Follow-ups read `session` (default: the path recorded in the snapshot).
    """
    investigator = investigator or RuleBasedInvestigator()
    budget = 0 if result.status == OPTIMAL else MAX_FOLLOW_UPS
    session = session or session_from_snapshot(snapshot)
    precomputed = precomputed_follow_ups(snapshot)
    with FollowUps(session, max_calls=budget, precomputed=precomputed) as follow_ups:
        out = investigator.investigate(snapshot, result, follow_ups)
    if result.status == OPTIMAL:
        out["short_circuit"] = "triage verdict OPTIMAL: no follow-up calls made"
    return out


def build_analysis(
    snapshot: Mapping[str, Any], result: Triage, investigation: Mapping[str, Any]
) -> dict[str, Any]:
    """The analysis.json document (DESIGN.md contract; field names are fixed)."""
    # The page's story (verdict, findings, checks, summary) from the final list of findings.
    if result.reading is None:
        result = Triage.from_dict(result.to_dict(), read_session(snapshot))
    story = conclude(result, investigation.get("findings", []))
    reading = result.reading
    assert reading is not None
    tools = [
        {k: v for k, v in t.items() if k in ("name", "status", "elapsed_ms", "error", "cli")}
        | ({"reason": t["data"].get("reason")} if t.get("status") == "NO_DATA"
           and isinstance(t.get("data"), Mapping) and t["data"].get("reason") else {})
        for t in snapshot.get("tools", {}).values()
    ]
    # mldiag's own passes, which the evidence cites by name (`mldiag.timeline`), and what each
    # was computed from.
    passes = [
        {k: v for k, v in p.items() if k in ("name", "status", "elapsed_ms", "error", "from")}
        | {"name": name}
        for name, p in ev.passes(snapshot).items()
    ]
    follow_ups = [
        {**f, "data": _bounded(f.get("data"))} | {"result_summary": _summarize_result(f)}
        for f in investigation.get("follow_ups", [])
    ][:MAX_FOLLOW_UPS]
    return {
        "schema_version": ANALYSIS_SCHEMA_VERSION,
        "session": {**snapshot.get("session", {}),
                    "analyzed_at": datetime.now(UTC).isoformat(timespec="seconds")},
        "status": story.status,
        "summary": story.summary,
        "metrics": result.metrics,
        # The session's one reading: device kind, steps, per-host figures, each metric with
        # its unit and provenance, and every tool's status.
        "reading": reading.to_dict(),
        # The hosts side by side (two or more hosts with steps): each host's step, compute,
        # host wait and collective wait and transfer, the stragglers and the heat map.
        **({"hosts": reading.pod.to_dict()} if reading.pod is not None else {}),
        "findings": story.findings,
        "checks": story.checks,
        "not_judged": result.not_judged,
        "tools": tools,
        "passes": passes,
        # How collection went: time, memory, and what was skipped, stopped or degraded, why.
        "collection": {k: v for k, v in snapshot.get("collection", {}).items() if k != "jobs"},
        "follow_ups": follow_ups,
        "investigator": investigation.get("investigator", "rule-based"),
        # Gemini's evidence check (findings dropped or corrected) and why it fell back to the
        # rule-based investigator, when it did.
        **{k: investigation[k] for k in ("fallback", "evidence_check") if k in investigation},
        # A model's own summary, kept beside the page's (which is written from the final list).
        **({"investigator_summary": investigation["summary"]}
           if investigation.get("summary") and investigation.get("investigator", "rule-based")
           != "rule-based" else {}),
        "xprof_version": snapshot.get("xprof_version"),
        "mldiag_version": mldiag.__version__,
    }


def _bounded(value: Any) -> Any:
    """A copy small enough for analysis.json: long lists and strings are cut."""
    if isinstance(value, Mapping):
        return {k: _bounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_bounded(v) for v in value[:20]]
    if isinstance(value, str) and len(value) > 4000:
        return value[:4000] + " [truncated]"
    return value


def _summarize_result(record: Mapping[str, Any]) -> str:
    if record.get("status") != "DATA":
        data = record.get("data")
        reason = data.get("reason") if isinstance(data, Mapping) else None
        return str(record.get("error") or reason or record.get("status"))
    data = record.get("data")
    if not isinstance(data, Mapping):
        return str(data)[:300]
    if "text" in data:
        return " | ".join(ln.strip() for ln in str(data["text"]).splitlines()[:4])[:400]
    if "aggregates" in data:
        rows = data["aggregates"][:5]
        return "; ".join(f"{r.get('event')}: {r.get('count')}x, avg "
                         f"{float(r.get('avg_duration_ps', 0)) / 1e9:.2f} ms" for r in rows)
    return "; ".join(f"{k}: {readable(v)}" for k, v in list(data.items())[:6]) + (
        "; …" if len(data) > 6 else "")


def analyze(
    path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None = None,
    *,
    investigator: Investigator | None = None,
    progress: ProgressFn | None = None,
    memory_budget_bytes: int | None = None,
) -> AnalysisResult:
    """Analyse the profile at `path` and write the four artifacts.

    `out_dir` defaults to `<session>/analysis/`. Raises ProfileUnreadable for bad input
    (SessionTooLarge when not even the op_stats build fits `memory_budget_bytes`).
    """
    session = resolve_session(path)
    target = Path(out_dir) if out_dir is not None else session.path / "analysis"
    # Fail on an unusable output directory before minutes of collection, not after.
    target.mkdir(parents=True, exist_ok=True)
    snapshot = collect(session, progress=progress, memory_budget_bytes=memory_budget_bytes)
    write_json(snapshot, target / "health_snapshot.json")
    result = triage(snapshot)
    investigation = investigate(snapshot, result, investigator, session=session)
    write_json({**investigation, "triage": result.to_dict()}, target / "investigation.json")
    analysis = build_analysis(snapshot, result, investigation)
    write_json(analysis, target / "analysis.json")
    html = render_summary_html(analysis, snapshot)
    tmp = target / ".summary.html.tmp"
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(target / "summary.html")
    return AnalysisResult(out_dir=target, analysis=analysis)
