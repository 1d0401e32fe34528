"""The judgement's data: a hypothesis a rule raises, and the triage that lists them.

A leaf module: triage, the rules and the investigators all import it, and it imports none of
them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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


@dataclass
class Triage:
    status: str
    metrics: dict[str, Any]
    checks: list[dict[str, Any]]
    not_judged: list[str]
    hypotheses: list[Hypothesis]

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status, "metrics": self.metrics, "checks": self.checks,
            "not_judged": self.not_judged, "hypotheses": [h.to_dict() for h in self.hypotheses],
        }


def impact_of(value: float | None, unit: str, text: str) -> dict[str, Any]:
    return {"value": round(value, 2) if value is not None else None, "unit": unit, "text": text}


def priority_of(value: float, p0: float, p1: float) -> str:
    return "P0" if value >= p0 else "P1" if value >= p1 else "P2"
