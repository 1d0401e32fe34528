"""Comparing the sessions of a run: which session a degraded one is compared with, reading
both sides from what the pipeline stored, and the diff's artifacts.

A session captured on a degradation alert is compared with the run's pinned baseline
(`mldiag runs set-baseline`), else with its most recent OPTIMAL session captured before it.
Both sides are read from their stored `analysis/v<N>/` artifacts (health snapshot, analysis
and investigation): nothing is collected again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mldiag.analysis import OPTIMAL, Side, build_diff, render_diff_html
from mldiag.errors import MldiagError
from mldiag.model import REPORTED, SessionRecord
from mldiag.ports import StateStore, Storage
from mldiag.viewer_cache import session_dir

DIFF_JSON, DIFF_HTML = "diff.json", "diff.html"
# How many ranked changes the report's "What changed" section keeps.
REPORT_CHANGES = 5


class NotComparable(MldiagError):
    """A session cannot be one side of a diff (not reported, or its analysis is missing).

    Permanent for the session as it stands: only a new report makes it comparable.
    """


@dataclass(frozen=True)
class Baseline:
    """The session to compare with, and why it is the one (`pinned baseline` or
    `most recent OPTIMAL session`); `session` is None when there is none, `reason` says why."""

    session: SessionRecord | None
    why: str = ""
    reason: str = ""


def pick_baseline(state: StateStore, s: SessionRecord) -> Baseline:
    """The pinned baseline of the session's run, else its most recent OPTIMAL session
    captured before this one; never the session itself."""
    run = state.get_run(s.run)
    pinned = run.baseline if run is not None else ""
    if pinned and pinned != s.session:
        found = state.get_session(s.run, pinned)
        if found is not None and found.state == REPORTED and found.hosts:
            return Baseline(found, why="pinned baseline")
        state_text = found.state if found is not None else "gone"
        fallback = _latest_optimal(state, s)
        if fallback is not None:
            return Baseline(fallback, why=f"most recent OPTIMAL session; the pinned baseline "
                            f"{pinned} is {state_text}")
        return Baseline(None, reason=(
            f"No baseline to compare with: the pinned baseline {s.run}/{pinned} is "
            f"{state_text}, and run {s.run} has no OPTIMAL session before this one."))
    found = _latest_optimal(state, s)
    if found is not None:
        return Baseline(found, why="most recent OPTIMAL session")
    return Baseline(None, reason=(
        f"No baseline to compare with: run {s.run} has no healthy (OPTIMAL) session before "
        f"this one, and none is pinned (`mldiag runs set-baseline {s.run} SESSION`)."))


def _latest_optimal(state: StateStore, s: SessionRecord) -> SessionRecord | None:
    candidates = [x for x in state.list_sessions(run=s.run)
                  if x.session != s.session and x.state == REPORTED and x.verdict == OPTIMAL
                  and x.hosts and x.created_at <= s.created_at]
    return max(candidates, key=lambda x: (x.created_at, x.session), default=None)


def _context(state: StateStore, s: SessionRecord) -> dict[str, Any]:
    run = state.get_run(s.run)
    targets = state.list_targets(s.run)
    framework = sorted({" ".join(x for x in (t.framework, t.framework_version) if x)
                        for t in targets if t.framework})
    platforms = sorted({t.platform for t in targets if t.platform})
    return {"run": s.run, "configs": dict(run.configs) if run is not None else {},
            "framework": ", ".join(framework) or None, "platform": ", ".join(platforms) or None,
            "trigger": s.trigger, "kind": s.kind}


def _read(storage: Storage, name: str) -> dict[str, Any]:
    data = json.loads(storage.read_bytes(name))
    if not isinstance(data, dict):
        raise ValueError(f"{name} is not a JSON object")
    return data


def stored_side(storage: Storage, state: StateStore, s: SessionRecord) -> Side:
    """A REPORTED session's side of a diff, from its stored artifacts of the reported version.
    NotComparable when it has no report or the report's files are missing."""
    if not s.reported_version or not s.hosts:
        raise NotComparable(f"session {s.key} has no report yet (state {s.state})")
    base = f"{session_dir(s)}/analysis/v{s.reported_version}"
    try:
        snapshot = _read(storage, f"{base}/health_snapshot.json")
        analysis = _read(storage, f"{base}/analysis.json")
    except (FileNotFoundError, ValueError) as e:
        raise NotComparable(f"the stored analysis of {s.key} (v{s.reported_version}) cannot "
                            f"be read: {e}") from e
    try:
        investigation: dict[str, Any] | None = _read(storage, f"{base}/investigation.json")
    except (FileNotFoundError, ValueError):
        investigation = None
    return Side(label=s.key, snapshot=snapshot, analysis=analysis,
                investigation=investigation, context=_context(state, s),
                source=f"stored snapshot of analysis version {s.reported_version}")


def session_side(state: StateStore, s: SessionRecord, snapshot: Mapping[str, Any],
                 analysis: Mapping[str, Any],
                 investigation: Mapping[str, Any] | None = None) -> Side:
    """The side of a session being reported now, from its documents in memory."""
    return Side(label=s.key, snapshot=snapshot, analysis=analysis, investigation=investigation,
                context=_context(state, s), source=f"this report (v{s.version})")


def compare_sessions(storage: Storage, state: StateStore, a: SessionRecord,
                     b: SessionRecord) -> dict[str, Any]:
    """The diff.json document of two REPORTED sessions, from their stored snapshots."""
    return build_diff(stored_side(storage, state, a), stored_side(storage, state, b))


def regression(state: StateStore, storage: Storage, s: SessionRecord,
               snapshot: Mapping[str, Any], analysis: Mapping[str, Any],
               investigation: Mapping[str, Any] | None = None
               ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """What changed since the run was healthy, for the report of session `s`:
    (analysis.json's `regression` block, the diff.json document or None without a baseline).
    """
    baseline = pick_baseline(state, s)
    if baseline.session is None:
        return {"baseline": None, "reason": baseline.reason}, None
    try:
        before = stored_side(storage, state, baseline.session)
    except NotComparable as e:
        return {"baseline": None, "reason": f"No baseline to compare with: {e}."}, None
    doc = build_diff(before, session_side(state, s, snapshot, analysis, investigation))
    b = baseline.session
    return {
        "baseline": {"run": b.run, "session": b.session, "version": b.reported_version,
                     "status": b.verdict, "why": baseline.why},
        "headline": doc["headline"],
        "explanation": doc["explanation"][:REPORT_CHANGES],
        "comparability": doc["comparability"],
        "step_time": next((k for k in doc["kpis"] if k["name"] == "step time"), None),
        "diff": DIFF_JSON, "diff_html": DIFF_HTML,
    }, doc


def diff_artifacts(doc: Mapping[str, Any]) -> tuple[bytes, bytes]:
    """diff.json and diff.html of a diff document, as bytes."""
    return (json.dumps(doc, indent=2, default=str).encode(),
            render_diff_html(doc).encode())
