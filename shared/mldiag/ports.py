"""Ports: the small interfaces the stages depend on. Adapters need not inherit from them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from mldiag.analysis.followups import FollowUps
from mldiag.analysis.triage import Triage


class Investigator(Protocol):
    """Turns a health snapshot and its triage into findings, with at most 4 follow-up calls.

    Returns the investigation.json document: `investigator`, `hypotheses`, `follow_ups`,
    `findings` and `summary`.
    """

    name: str

    def investigate(
        self, snapshot: Mapping[str, Any], triage: Triage, follow_ups: FollowUps
    ) -> dict[str, Any]: ...
