"""The page's story, from the final list of findings: the verdict, the checks as shown, and
the summary.

Triage decides whether to investigate; the investigator writes findings, and the evidence
check may drop some. What a page says is decided here, once, from what is left:
- NEEDS_ATTENTION needs something to attend to: a P0/P1 finding or a failed check;
- OPTIMAL needs the triage's positive evidence (every check it could judge passed, with the
  utilization check among them) and no P0/P1 finding;
- anything else is INSUFFICIENT_DATA: nothing was found, and health could not be confirmed
  from what the profile holds (`not_judged` says what is missing).
A check and a finding about the same quantity may seem to disagree (a check's threshold asks
whether the whole profile is healthy; a finding's, whether a fix wins time back): the check
then carries one line (`note`) that says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mldiag.analysis.judgement.model import Triage
from mldiag.analysis.judgement.summary import ordered, summarize
from mldiag.analysis.judgement.triage import FAILED, NEEDS_ATTENTION, OPTIMAL

INSUFFICIENT_DATA = "INSUFFICIENT_DATA"
# Every verdict analysis.json's `status` can hold (FAILED: the analysis itself failed).
VERDICTS = (OPTIMAL, NEEDS_ATTENTION, INSUFFICIENT_DATA, FAILED)

# Each OPTIMAL check → the finding categories that measure the same quantity, and why the
# check can pass beside an urgent finding of theirs.
RELATED: dict[str, tuple[tuple[str, ...], str]] = {
    "compute utilization is high": (
        ("compute_bound", "memory_bound", "other"),
        "the check measures whether the device is busy computing; {ids} measure{s} how fast "
        "that computing runs against its roofline, which a busy device can still fall short "
        "of"),
    "idle + communication overhead is low": (
        ("idle", "communication", "host_bound", "straggler"),
        "the check asks whether idle and collective time together stay within what a healthy "
        "profile allows; {ids} count{s} {what} on its own, from a lower threshold, as time a "
        "fix can win back"),
    "OOM risk is LOW": (
        ("memory_pressure",),
        "the check reads peak over capacity; {ids} name{s} what fills that memory"),
    "no detector finding has a material impact": (
        ("layout_copy", "unfused_reshape", "convert_reduce"),
        "the check counts detector findings of material impact; {ids} {are} below it"),
}


@dataclass(frozen=True)
class Conclusion:
    """What a page says, all from the same final list."""

    status: str
    findings: list[dict[str, Any]]
    checks: list[dict[str, Any]]
    summary: str


def verdict(triage: Triage, findings: Sequence[Mapping[str, Any]],
            checks: Sequence[Mapping[str, Any]]) -> str:
    urgent = any(f.get("priority") in ("P0", "P1") for f in findings)
    if urgent or any(c.get("passed") is False for c in checks):
        return NEEDS_ATTENTION
    if triage.status == OPTIMAL:
        return OPTIMAL
    # Triage's NEEDS_ATTENTION rested on hypotheses that no finding survived to state, or on
    # checks that had no data: nothing to attend to, and health is not shown either.
    return INSUFFICIENT_DATA


def annotated_checks(checks: Sequence[Mapping[str, Any]],
                     findings: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The checks, each with a one-line `note` where a finding about the same quantity seems
    to disagree with it: a passed check beside a P0/P1 finding, or a failed check that no
    finding explains."""
    out = []
    for c in checks:
        c = dict(c)
        related, why = RELATED.get(str(c.get("check")), ((), ""))
        about = [f for f in findings if f.get("category") in related]
        urgent = [f for f in about if f.get("priority") in ("P0", "P1")]
        if c.get("passed") is True and urgent:
            ids = ", ".join(str(f.get("id")) for f in urgent)
            one = len(urgent) == 1
            what = " and ".join(f"{f.get('category')} ({_impact_text(f)})" for f in urgent)
            c["note"] = (f"Passed ({_value(c.get('value'))} against {c.get('target')}): "
                         + why.format(ids=ids, s="s" if one else "", what=what,
                                      are="is" if one else "are") + ".")
        elif c.get("passed") is False and not any(
                f.get("priority") in ("P0", "P1") for f in findings):
            c["note"] = ("Failed, and no finding names a cause: the verdict rests on this check "
                         "(see the summary).")
        out.append(c)
    return out


def _value(value: Any) -> str:
    return f"{value:g}%" if isinstance(value, float) else str(value)


def _impact_text(f: Mapping[str, Any]) -> str:
    raw = f.get("impact")
    impact: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    value, unit = impact.get("value"), impact.get("unit") or ""
    if not isinstance(value, int | float):
        return "not measured"
    return f"{value:g}{'' if str(unit).startswith('%') else ' '}{unit}"


def conclude(triage: Triage, findings: Sequence[Mapping[str, Any]]) -> Conclusion:
    """The verdict, checks and summary of the final list of findings (after every filter)."""
    final = ordered(findings)
    status = verdict(triage, final, triage.checks)
    checks = annotated_checks(triage.checks, final)
    if triage.reading is None:
        raise ValueError("conclude needs the triage's reading (triage(), or Triage.from_dict "
                         "with the session's reading)")
    return Conclusion(status, final, checks, summarize(triage.reading, triage, final, status))


def none_found(status: str, checks: Sequence[Mapping[str, Any]]) -> str:
    """What a page says where its findings would be, when there are none (the report and the
    console say the same)."""
    if status == OPTIMAL:
        return "No bottleneck was found: the triage criteria for OPTIMAL hold."
    if status == INSUFFICIENT_DATA:
        return ("No bottleneck was found, and health could not be confirmed either: what the "
                "profile lacks is listed under \"Not judged\".")
    if any(c.get("passed") is False for c in checks):
        return "No finding names a cause: the verdict rests on the failed health check(s)."
    return "No findings were produced for this session."


def judged_over(reading: Mapping[str, Any]) -> str:
    """One line of what the verdict was judged over, from analysis.json's `reading`: the
    steps behind the step time (one step said as one sample), the window idle and the checks
    were judged over (the report's "Judged over …" line), the device and the hosts."""
    raw = reading.get("steps")
    steps: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    metrics = reading.get("metrics") if isinstance(reading.get("metrics"), Mapping) else {}
    idle = metrics.get("device_idle_percent") if isinstance(metrics, Mapping) else None
    window = str((idle or {}).get("over") or "") if isinstance(idle, Mapping) else ""
    count = int(steps.get("count") or 0)
    device = str(reading.get("device_type") or reading.get("device") or "unknown device")
    hosts = len(reading.get("hosts") or [])
    if steps.get("micro_benchmark"):
        said = "a micro-benchmark's short window (no steps)"
    else:
        said = ("step time from one step (a single sample, not an average)" if count == 1 else
                f"step time averaged over {count} steps" if count else
                "no step markers, so no step time")
        said += "; idle and the checks judged over " + (
            "the steps" if window == "steps" else "the capture window")
    return f"{device}, {hosts} host{'s' if hosts != 1 else ''}: {said}."
