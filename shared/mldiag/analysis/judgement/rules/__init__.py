"""One module per finding category: the rule that raises its hypothesis, its follow-ups, and
the finding's text, evidence and fix.

A rule module has:
- `CATEGORY`, the category's name in analysis.json;
- `RAISE_ORDER`: where its hypotheses come among the others'; triage then sorts them by
  priority and impact, stably, so this order decides ties;
- `hypotheses(reading)` (the session's one typed reading, `reading.py`), or, for a category
  an HLO detector raises, `DETECTOR`
  (the tool) and `LABEL` (its title): `detections.py` raises those categories together,
  since an op that several detectors flag is one finding;
- `follow_ups(snapshot, hypothesis)`: the follow-up tools worth calling for it;
- `finding(hypothesis, context)`: what the finding says, its evidence and its fix.

Adding a category is one module and one line below. Triage and the rule-based investigator
loop over `RULES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from mldiag.analysis.judgement.context import Context, Plan
from mldiag.analysis.judgement.model import Hypothesis
from mldiag.analysis.judgement.reading import SessionReading
from mldiag.analysis.judgement.rules import (
    communication,
    compute_bound,
    convert_reduce,
    data_transfer,
    host_bound,
    idle,
    layout_copy,
    memory_bound,
    memory_pressure,
    other,
    straggler,
    unfused_reshape,
)


class Rule(Protocol):
    """What every rule module has (its constants are read-only protocol members)."""

    @property
    def CATEGORY(self) -> str: ...

    @property
    def RAISE_ORDER(self) -> int: ...

    def follow_ups(self, snapshot: Mapping[str, Any], h: Hypothesis) -> list[Plan]: ...

    def finding(self, h: Hypothesis, ctx: Context) -> dict[str, Any]: ...


@runtime_checkable
class RaisingRule(Rule, Protocol):
    """A rule that raises its own hypotheses."""

    def hypotheses(self, reading: SessionReading) -> list[Hypothesis]: ...


@runtime_checkable
class DetectorRule(Rule, Protocol):
    """A rule whose hypotheses an HLO detector's detections raise (`detections.py`)."""

    @property
    def DETECTOR(self) -> str: ...

    @property
    def LABEL(self) -> str: ...


RULES: tuple[RaisingRule | DetectorRule, ...] = (
    # keep-sorted start
    communication,
    compute_bound,
    convert_reduce,
    data_transfer,
    host_bound,
    idle,
    layout_copy,
    memory_bound,
    memory_pressure,
    other,
    straggler,
    unfused_reshape,
    # keep-sorted end
)

CATEGORIES = tuple(rule.CATEGORY for rule in RULES)
BY_CATEGORY: dict[str, RaisingRule | DetectorRule] = {rule.CATEGORY: rule for rule in RULES}
IN_RAISE_ORDER = tuple(sorted(RULES, key=lambda rule: rule.RAISE_ORDER))
# Each HLO detector tool → (its category, its label), in raise order.
DETECTORS: dict[str, tuple[str, str]] = {
    rule.DETECTOR: (rule.CATEGORY, rule.LABEL) for rule in IN_RAISE_ORDER
    if isinstance(rule, DetectorRule)}
