"""The rule-based judgement, held equal to a saved golden through refactors.

Each case in data/findings_golden/ is a health snapshot and the follow-up calls the
investigator made on it, recorded from a real analysis: the team's TPU and GPU fixtures and
the planted-bottleneck workloads of scripts/workloads (XLA:CPU). Triage and the rule-based
investigator run on it again, the follow-ups answered from the recording, and what a user
reads (the verdict, the checks, every finding's category, priority, title, what, evidence,
impact and fix, the summary) must equal findings.json.

The cases and their judgement are tests/helpers/findings.py. After a deliberate change to the
judgement, rewrite the golden and review its diff:
    python -m tests.unit.test_findings_golden
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from mldiag.analysis.collection.collect import XPROF_CLI
from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.evidence_check import NumberPool, check_findings, pass_outputs
from mldiag.analysis.judgement.investigator import RuleBasedInvestigator
from mldiag.analysis.judgement.triage import triage
from tests.helpers.findings import CASES, DATA, case_inputs, judge

GOLDEN = DATA / "findings.json"


def test_every_cited_field_resolves_in_a_tool_output() -> None:
    """The rule-based findings cite what is there: the evidence check the model's report goes
    through finds every cited field (but the HLO excerpt, cleaned of its backend config)."""
    for case in CASES:
        snapshot, follow_ups = case_inputs(case)
        t = triage(snapshot)
        report = RuleBasedInvestigator().investigate(snapshot, t, follow_ups)
        pool = NumberPool([snapshot.get("tools"), [r.get("data") for r in follow_ups.records],
                           pass_outputs(snapshot, follow_ups.records), t.to_dict(),
                           snapshot.get("session")])
        kept, check = check_findings(report["findings"], snapshot, follow_ups.records, pool)
        # Every cited field resolves, the HLO excerpts included (mldiag.hlo_excerpt).
        assert not check["corrected"], (case, check["corrected"])
        # The rule-based investigator went through the same check itself: no finding of a
        # rule states a number that is in no tool or pass output, nor does its summary
        # (but for the fix it quotes, whose constants are advice: block shapes, dtypes).
        own = report["evidence_check"]
        assert own["dropped"] == [] and own["corrected"] == [], (case, own)
        measured = report["summary"].split(" Fix first: ")[0] + " " + (
            report["summary"].split(" Measured: ", 1)[1] if " Measured: " in report["summary"]
            else "")
        assert pool.unknown_in(measured) == [], (case, pool.unknown_in(measured))
        assert own["kept"] == own["checked"] == len(report["findings"]), case
        # The check keeps who made each number: mldiag's passes say what they came from.
        written = {f["title"]: f["evidence"] for f in report["findings"]}
        assert all(f["evidence"] == written[f["title"]] for f in kept), case


def test_every_row_names_xprof_or_an_mldiag_pass_with_its_inputs() -> None:
    """A row names an xprof tool (the snapshot's xprof-backed tools, or an xprof follow-up)
    or one of mldiag's own passes, and then says what the pass computed it from."""
    xprof = {t for t, cli in XPROF_CLI.items() if cli} | {
        "get_smart_suggestions", "get_hlo_neighborhood", "aggregate_xplane_events",
        "analyze_async_overlap", "get_hosts"}
    for case, judged in ((c, judge(c)) for c in CASES):
        for f in judged["findings"]:
            for row in f["evidence"]:
                if ev.is_pass(row["tool"]):
                    assert row.get("from"), (case, row)
                else:
                    assert row["tool"] in xprof and "from" not in row, (case, row)


def _normal(value: Any) -> Any:
    """As JSON would hold it (tuples are lists)."""
    return json.loads(json.dumps(value))


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


def test_every_recorded_case_has_a_golden(golden: dict[str, Any]) -> None:
    assert sorted(golden) == CASES


@pytest.mark.parametrize("case", CASES)
def test_judgement_equals_the_golden(case: str, golden: dict[str, Any]) -> None:
    got, want = _normal(judge(case)), golden[case]
    for key in want:
        assert got[key] == want[key], f"{case}: {key} changed"
    assert got == want


def test_the_cases_raise_most_categories(golden: dict[str, Any]) -> None:
    # The golden guards every category's rule.
    seen = {f["category"] for case in golden.values() for f in case["findings"]}
    assert seen == {"host_bound", "idle", "layout_copy", "unfused_reshape", "convert_reduce",
                    "memory_pressure", "memory_bound", "compute_bound", "communication",
                    "data_transfer", "other"}


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps({c: _normal(judge(c)) for c in CASES}, indent=1,
                                 sort_keys=True, ensure_ascii=False) + "\n")
    print(f"wrote {GOLDEN}")
