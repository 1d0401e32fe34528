"""The rule-based investigator: hypotheses → at most 4 follow-ups → findings with fixes.

It stands behind the `Investigator` port so that a Gemini investigator can replace it. Every
number it states comes from a tool output and is cited as `{tool, field, value}`. Each
category's follow-ups and finding are its rule's (`rules/`); here is what they share: the
follow-up budget, the follow-ups the device calls for, and the summary.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement import rules
from mldiag.analysis.judgement.context import Context, Plan
from mldiag.analysis.judgement.evidence_check import check_report
from mldiag.analysis.judgement.followups import FollowUpRefused, FollowUps
from mldiag.analysis.judgement.model import Hypothesis, Triage
from mldiag.analysis.judgement.reading import reading_of
from mldiag.analysis.judgement.summary import ordered, summarize
from mldiag.analysis.judgement.verdict import verdict


class RuleBasedInvestigator:
    """Deterministic investigator that needs no network; the offline default."""

    name = "rule-based"

    def investigate(
        self, snapshot: Mapping[str, Any], triage: Triage, follow_ups: FollowUps
    ) -> dict[str, Any]:
        started = time.perf_counter()
        context = Context(snapshot, triage)
        for plan in _plan(snapshot, triage.hypotheses):
            if follow_ups.remaining <= 0:
                break
            tool, purpose, args, key = plan
            try:
                context.results[key] = follow_ups.call(tool, purpose, **args)
            except FollowUpRefused:
                break
        written = []
        for i, h in enumerate(triage.hypotheses, start=1):
            finding = rules.BY_CATEGORY[h.category].finding(h, context)
            written.append({"id": f"F{i}", **finding})
        # The same check a model's report goes through: every cited field resolves and every
        # number stated is in a tool or pass output. A finding that fails it is dropped and
        # said so, as a model's would be (the tests hold the rules to none dropped); those
        # that pass keep everything the rule wrote (the check's copy keeps the contract's
        # keys only).
        reading = reading_of(triage.reading or snapshot)
        checked, _, _, check = check_report({"findings": written}, snapshot, triage,
                                            follow_ups.records)
        dropped = {d["finding"] for d in check["dropped"]}
        # The summary is the final list's: written after the check, from what it kept.
        findings = ordered(f for f in written if f["title"] not in dropped)
        assert len(findings) == len(checked)
        # With the verdict of that list, as the page states it (verdict.conclude).
        summary = summarize(reading, triage, findings, verdict(triage, findings, triage.checks))
        return {
            "investigator": self.name,
            "hypotheses": [h.to_dict() for h in triage.hypotheses],
            "follow_ups": follow_ups.records,
            "findings": findings,
            "summary": summary,
            "evidence_check": check,
            "elapsed_ms": round((time.perf_counter() - started) * 1000.0, 1),
        }


def _plan(snapshot: Mapping[str, Any], hyps: list[Hypothesis]) -> list[Plan]:
    """Follow-ups worth their cost, strongest hypothesis first, deduplicated: each P0/P1
    hypothesis's rule's, then those the device calls for."""
    plans: list[Plan] = []
    seen: set[str] = set()

    def add(tool: str, purpose: str, args: dict[str, Any], key: str) -> None:
        if key not in seen:
            seen.add(key)
            plans.append((tool, purpose, args, key))

    for h in hyps:
        if h.priority == "P2":
            continue
        for plan in rules.BY_CATEGORY[h.category].follow_ups(snapshot, h):
            add(*plan)
    device = str(ev.get(snapshot, "get_xprof_overview", "run_environment.device_type") or "")
    if "GPU" in device.upper() or ev.get(snapshot, "get_kpi_metrics", "accelerator_info") and (
        "GPU" in str(ev.get(snapshot, "get_kpi_metrics", "accelerator_info.device_type"))
    ):
        add("get_kernel_stats", "Rank GPU kernels by time and occupancy",
            {"limit": 10}, "kernels")
    if any(h.category in ("data_transfer", "communication") and h.priority in ("P0", "P1")
           for h in hyps) and ("TPU" in device.upper() or "GPU" in device.upper()):
        add("analyze_async_overlap", "Measure how much of each async copy or collective is "
            "hidden behind compute", {"top_k": 10}, "async_overlap")
    if "TPU" in device.upper():
        add("llo_load", "Load LLO-level events, if the capture has them", {}, "llo")
    hosts = snapshot.get("session", {}).get("hosts") or []
    if len(hosts) > 1:
        add("get_hosts", "Confirm every host's trace is present", {}, "hosts")
    return plans
