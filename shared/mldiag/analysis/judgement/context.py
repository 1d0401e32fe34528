"""What a rule's finding is written from: the snapshot, the triage and the follow-up results,
and the readings of follow-up data that several rules' findings share.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.followups import HOST_PYTHON_EVENTS
from mldiag.analysis.judgement.model import Hypothesis, Triage

# A follow-up worth asking: (tool, purpose, arguments, key of its result in the Context).
Plan = tuple[str, str, dict[str, Any], str]

_PS_PER_MS = 1e9

_RUNTIME_HOST_EVENT = re.compile(
    r"profiler\.py|stop_trace|start_trace|PjitFunction|PjRt|Execute|ThreadPool|Thunk|"
    r"block_until_ready|try_to_block|<module>|threading\.py|__exit__|__enter__",
)


class Context:
    """What a finding is written from: the snapshot, the triage, and the follow-up results by
    their plan's key."""

    def __init__(self, snapshot: Mapping[str, Any], triage: Triage) -> None:
        self.snapshot = snapshot
        self.triage = triage
        self.results: dict[str, dict[str, Any]] = {}

    def data(self, key: str) -> Any:
        rec = self.results.get(key)
        if rec is None or rec.get("status") != "DATA":
            return None
        return rec.get("data")


def neighborhood_plan(h: Hypothesis) -> Plan:
    """The follow-up of a detector finding: its op's producers and consumers, to place the fix."""
    d = h.details["detection"]
    return ("get_hlo_neighborhood",
            f"Show producers and consumers of {d['instruction']} to place the fix",
            {"instruction_name": d["instruction"], "module_name": d["module"], "radius": 1},
            f"hlo:{d['module']}:{d['instruction']}")


def host_events_plan() -> Plan:
    """The follow-up that names the host-side Python frames filling the device's waits."""
    return ("aggregate_xplane_events",
            "Find the host-side Python work that keeps the device waiting between steps",
            dict(HOST_PYTHON_EVENTS), "host_events")


def module_of(snapshot: Mapping[str, Any], op: str) -> str | None:
    """The HLO module that runs `op`, from the op profile's grouped operations."""
    groups = ev.get(snapshot, "get_hlo_op_profile", "grouped_operations", {}) or {}
    for ops in groups.values():
        for row in ops:
            parts = str(row.get("name", "")).split("/")
            if len(parts) >= 4 and parts[-1] == op:
                return parts[1]
    return None


def op_source(snapshot: Mapping[str, Any], op: str) -> list[dict[str, Any]]:
    """Evidence of where `op` comes from in user code, from the op profile's source info."""
    groups = ev.get(snapshot, "get_hlo_op_profile", "grouped_operations", {}) or {}
    for category, ops in groups.items():
        for i, row in enumerate(ops):
            parts = str(row.get("name", "")).split("/")
            if parts[-1] == op and row.get("source_file"):
                base = f"grouped_operations.{category}[{i}]"
                return [ev.cite(snapshot, "get_hlo_op_profile", f"{base}.source_file"),
                        ev.cite(snapshot, "get_hlo_op_profile", f"{base}.source_line")]
    return []


def finding_of(h: Hypothesis, what: str, fix: str, extra: list[dict[str, Any]] | None = None
               ) -> dict[str, Any]:
    """The finding of `h`: what it says, its evidence (the hypothesis's plus `extra`) and its
    fix, placed at the user's source line when the detection names one."""
    d = h.details.get("detection")
    src = str(d.get("source") or "") if isinstance(d, Mapping) else ""
    if src and src not in fix:
        # The fix says where in the user's code it applies: `train.py:41`, op
        # `jit(step)/transpose` (JAX's op name; the file and line when the HLO carries them).
        where, _, op = src.partition(" (")
        if op:
            fix = f"At `{where}` (op `{op.rstrip(')')}`): {fix}"
        elif ".py:" in src:
            fix = f"At `{src}`: {fix}"
        else:
            fix = f"In op `{src}`: {fix}"
    primary = h.details.get("tool")
    others = [c for c in h.details.get("causes") or [] if c.get("tool") != primary
              and c.get("description")]
    for cause in others:
        # One op, one finding: the other detectors' reading of the same op is part of it.
        what += f" Also a {cause['category'].replace('_', ' ')}: {cause['description']}"
    return {
        "category": h.category, "priority": h.priority, "title": h.title, "what": what,
        "evidence": h.evidence + (extra or []), "impact": h.impact, "fix": fix,
    }


def host_events(ctx: Context, step_ms: float, steps: int | None = None
                ) -> list[tuple[int, dict[str, Any]]]:
    """The host frames that fill the waits: at least 5% of each step (or of the window, with
    `step_ms` the window and `steps` 1), and shorter than one."""
    data = ctx.data("host_events")
    if not isinstance(data, Mapping):
        return []
    if steps is None:
        steps = ev.get(ctx.snapshot, ev.TIMELINE, "steps_analyzed") or 1
    picked = []
    for i, row in enumerate(data.get("aggregates", [])):
        name = str(row.get("event", ""))
        if _RUNTIME_HOST_EVENT.search(name):
            continue
        per_step = float(row.get("total_duration_ps", 0)) / _PS_PER_MS / steps
        avg = float(row.get("avg_duration_ps", 0)) / _PS_PER_MS
        # Frames longer than a step enclose the loop itself, not the stall.
        if avg >= step_ms or per_step < 0.05 * step_ms:
            continue
        picked.append((i, row))
        if len(picked) == 3:
            break
    return picked


def detector_source(d: Mapping[str, Any]) -> str:
    src = str(d.get("source") or "")
    return f" (source: {src})" if src else ""


def neighborhood(ctx: Context, d: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    key = f"hlo:{d.get('module')}:{d.get('instruction')}"
    data = ctx.data(key)
    if not isinstance(data, Mapping) or not data.get("text"):
        return "", []
    text = clean_hlo(str(data["text"]))
    lines = [ln.strip() for ln in text.splitlines() if "[dist=1]" in ln]
    if not lines:
        return "", []
    return (" Neighbours: " + "; ".join(ln.split("] ", 2)[-1][:160] for ln in lines[:3]) + ".",
            [hlo_excerpt(text)])


HLO_EXCERPT_CHARS = 800
HLO_EXCERPT_FROM = ("get_hlo_neighborhood text, without backend_config, metadata and "
                    f"frontend_attributes, its first {HLO_EXCERPT_CHARS} characters",)


def hlo_excerpt(cleaned: str) -> dict[str, Any]:
    """The evidence row of an HLO neighbourhood, cleaned (`clean_hlo`) and cut: mldiag's
    excerpt of xprof's text, so it is cited under its own name."""
    return {"tool": ev.HLO_EXCERPT, "field": "text", "value": cleaned[:HLO_EXCERPT_CHARS],
            "from": list(HLO_EXCERPT_FROM)}


def hlo_excerpt_of(neighborhood: Any) -> dict[str, Any] | None:
    """The excerpt that `hlo_excerpt` cites, from a get_hlo_neighborhood output."""
    if not isinstance(neighborhood, Mapping) or not neighborhood.get("text"):
        return None
    return {"text": clean_hlo(str(neighborhood["text"]))[:HLO_EXCERPT_CHARS]}

_BACKEND_CONFIG = re.compile(r",\s*(backend_config|metadata|frontend_attributes)=\{.*$")


def clean_hlo(text: str) -> str:
    """HLO lines without backend_config/metadata blobs, which bury the shapes."""
    return "\n".join(_BACKEND_CONFIG.sub("", ln) for ln in text.splitlines())
