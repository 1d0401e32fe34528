"""The judgement's data: a hypothesis a rule raises, and the triage that lists them.

A leaf module: triage, the rules and the investigators all import it, and it imports none of
them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # The reading imports the readings, which import this leaf: a type-only import, so the
    # leaf stays a leaf.
    from mldiag.analysis.judgement.reading import SessionReading


@dataclass
class Hypothesis:
    """A suspected bottleneck with the evidence that raised it."""

    category: str
    priority: str
    title: str
    evidence: list[dict[str, Any]]
    impact: dict[str, Any]
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category, "priority": self.priority, "title": self.title,
            "evidence": self.evidence, "impact": self.impact, "details": self.details,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Hypothesis:
        return cls(category=d["category"], priority=d["priority"], title=d["title"],
                   evidence=list(d.get("evidence") or []), impact=dict(d.get("impact") or {}),
                   details=dict(d.get("details") or {}))


@dataclass
class Triage:
    """Triage's result for one version of a session: computed once, after collection, and
    carried to the investigator and the report (`triage.json`), never recomputed."""

    status: str
    metrics: dict[str, Any]
    checks: list[dict[str, Any]]
    not_judged: list[str]
    hypotheses: list[Hypothesis]
    # The reading triage judged (not serialised: rebuilt from the snapshot where needed).
    reading: SessionReading | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status, "metrics": self.metrics, "checks": self.checks,
            "not_judged": self.not_judged, "hypotheses": [h.to_dict() for h in self.hypotheses],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], reading: SessionReading | None = None) -> Triage:
        """A triage read back from `to_dict`'s document (the stages' `triage.json`)."""
        return cls(status=str(d["status"]), metrics=dict(d.get("metrics") or {}),
                   checks=[dict(c) for c in d.get("checks") or []],
                   not_judged=[str(x) for x in d.get("not_judged") or []],
                   hypotheses=[Hypothesis.from_dict(h) for h in d.get("hypotheses") or []],
                   reading=reading)


def impact_of(value: float | None, unit: str, text: str) -> dict[str, Any]:
    return {"value": round(value, 2) if value is not None else None, "unit": unit, "text": text}


def priority_of(value: float, p0: float, p1: float) -> str:
    return "P0" if value >= p0 else "P1" if value >= p1 else "P2"
