"""The analysis summary: 3-5 sentences of the verdict, the top finding, its fix and the
measured figures, shared by both investigators (the rule-based one writes it; a model's
summary that states an untraceable number is replaced by it)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mldiag.analysis.judgement.model import Triage
from mldiag.analysis.judgement.reading import SessionReading

_PRIORITY_ORDER = {"P0": 0, "P1": 1, "P2": 2}


def ordered(findings: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The findings most urgent first (priority, then impact), renumbered F1, F2, … in that
    order, so the summary's top issue is the first finding on the page."""
    out = sorted((dict(f) for f in findings),
                 key=lambda f: (_PRIORITY_ORDER.get(str(f.get("priority")), 3),
                                -(_impact(f) or 0.0)))
    return [{**f, "id": f"F{i}"} for i, f in enumerate(out, start=1)]


def _impact(f: Mapping[str, Any]) -> float | None:
    value = (f.get("impact") or {}).get("value") if isinstance(f.get("impact"), Mapping) \
        else None
    return float(value) if isinstance(value, int | float) else None


def _first_sentence(text: str, limit: int = 320) -> str:
    """The fix's first sentence (the change to make), whole: when it is too long, without
    its parenthesised examples, and cut at a clause when still too long."""
    text = " ".join(text.split())
    sentence = _sentence(text)
    if len(sentence) <= limit:
        return sentence
    bare = " ".join(_without_asides(sentence).split()).replace(" ,", ",").replace(
        " .", ".").replace(" :", ":")
    if len(bare) <= limit:
        return bare
    cut = max(bare.rfind(", ", 0, limit), bare.rfind("; ", 0, limit))
    return (bare[:cut] if cut > 0 else bare[: limit - 1]).rstrip(",; ") + "."


def _sentence(text: str) -> str:
    depth = ticks = 0
    for i, ch in enumerate(text):
        if ch == "`":
            ticks += 1
        elif ticks % 2 == 0 and ch in "([":
            depth += 1
        elif ticks % 2 == 0 and ch in ")]":
            depth = max(0, depth - 1)
        elif (ch in ".;" and depth == 0 and ticks % 2 == 0 and text[i + 1:i + 2] == " "
              and not text[max(0, i - 3):i + 1].endswith(("e.g.", "i.e."))):
            return text[:i] + "."
    return text


def _without_asides(text: str) -> str:
    out, depth, ticks = [], 0, 0
    for ch in text:
        if ch == "`":
            ticks += 1
        if ticks % 2 == 0 and ch == "(":
            depth += 1
            continue
        if ticks % 2 == 0 and ch == ")" and depth:
            depth -= 1
            continue
        if depth == 0:
            out.append(ch)
    return "".join(out)


def _check_value(value: Any) -> str:
    return f"measured {value:.1f}%" if isinstance(value, float) else f"measured {value}"


def step_named(step: Mapping[str, Any], among: Sequence[Mapping[str, Any]]) -> str:
    """`step 3`, or `host1 step 3` when the steps come from several hosts."""
    several = len({x.get("host") for x in among}) > 1
    return (f"{step['host']} " if several and step.get("host") else "") + (
        f"step {step.get('step_index')}")


def excluded_steps_said(metrics: Mapping[str, Any]) -> str:
    """The compile and warm-up steps left out of the step figures, said once."""
    gone = metrics.get("steps_excluded") or []
    if not gone:
        return ""
    said = ", ".join(f"{step_named(x, gone)} ({x['reason']}, {x['step_time_ms']:.1f} ms)"
                     for x in gone[:3])
    more = f" and {len(gone) - 3} more" if len(gone) > 3 else ""
    return f" (left out as not the workload's steady state: {said}{more})"


def summarize(reading: SessionReading, triage: Triage, findings: list[dict[str, Any]],
              status: str | None = None) -> str:
    """Three to five sentences: verdict, the top finding, key metrics, what was not judged.

    `findings` is the final list, most urgent first (`verdict.ordered`), and `status` the
    verdict of that list (default: triage's)."""
    m = triage.metrics
    status = status or triage.status
    device = reading.device_type or "unknown device"
    hosts = len(reading.hosts)
    sentences = []
    top = findings
    if status == "OPTIMAL":
        sentences.append(f"This {device} profile ({hosts} host(s)) looks healthy: every "
                         "OPTIMAL check passed with measured evidence.")
    elif top:
        n0 = sum(1 for f in findings if f["priority"] == "P0")
        n1 = sum(1 for f in findings if f["priority"] == "P1")
        n2 = len(findings) - n0 - n1
        counts = f"{n0} P0 and {n1} P1 finding(s)" + (f" ({n2} P2)" if n2 else "")
        if status == "NEEDS_ATTENTION":
            sentences.append(f"This {device} profile ({hosts} host(s)) needs attention: "
                             f"{counts}.")
        else:
            sentences.append(f"Health could not be confirmed for this {device} profile "
                             f"({hosts} host(s)) from the data it holds; {counts}, none urgent.")
        title, impact = top[0]["title"].rstrip("."), top[0]["impact"]
        value = impact.get("value")
        # The impact line adds to the title only when it states a number the title lacks.
        said = impact.get("text")
        extra = "" if not said or value is not None and f"{value:.1f}" in title else \
            f"; {said}"
        sentences.append(f"Top issue ({top[0]['priority']}): {title}{extra}.")
        fix = _first_sentence(str(top[0].get("fix") or ""))
        if fix:
            sentences.append(f"Fix first: {fix}")
    else:
        failed = [c for c in triage.checks if c.get("passed") is False]
        if failed:
            # A failed check is the reason for the verdict even when no finding names a cause.
            sentences.append(
                f"This {device} profile ({hosts} host(s)) needs attention although no finding "
                "names a cause: " + "; ".join(
                    f"the check \"{c['check']}\" failed ({_check_value(c['value'])}, "
                    f"target {c['target']}, "
                    f"from {c['source']})" for c in failed) + ".")
        elif not reading.judgeable:
            what = reading.device_type or "host-only"
            sentences.append(f"Nothing in this {what} profile ({hosts} host(s)) could be "
                             "judged: it has no step time, device idle, roofline or memory "
                             "figure to judge by.")
        else:
            sentences.append(f"No bottleneck was found in this {device} profile ({hosts} "
                             "host(s)), but health could not be confirmed from the data "
                             "available.")
    parts = []
    if m.get("step_time_ms") is not None:
        spread = m.get("step_time_spread") or {}
        extra = ""
        if spread.get("stddev_ms") is not None:
            extra = f" ± {spread['stddev_ms']:.2f} ms"
            if spread.get("outlier_count"):
                extra += (f" ({spread['outlier_count']} outlier step(s), up to "
                          f"{spread['max_ms']:.2f} ms)")
        one = (" (one step: a single sample, not an average)" if reading.steps.one_step
               else "")
        parts.append(f"step time {m['step_time_ms']:.2f} ms{one}{extra}"
                     f"{excluded_steps_said(m)}")
    if m.get("device_idle_percent") is not None:
        window = " of the capture window" if m.get("device_idle_window") == "capture window" \
            else ""
        parts.append(f"device idle {m['device_idle_percent']:.1f}%{window}")
    if m.get("roofline_efficiency_percent") is not None:
        parts.append(f"roofline efficiency {m['roofline_efficiency_percent']:.2f}%")
    if m.get("peak_memory_gib") is not None:
        cap = m.get("memory_capacity_gib")
        peak = float(m["peak_memory_gib"])
        amount = f"{peak:.2f}" + (f" of {cap:.2f} GiB" if cap else " GiB")
        if not cap and peak < 0.1:
            amount = f"{peak * 1024:.1f} MiB"
        if m.get("peak_memory_source") == "get_peak_allocations":
            rule = " by the CPU rule" if m.get("oom_risk_rule") else ""
            program = f" ({m['peak_memory_program']})" if m.get("peak_memory_program") else ""
            which = "step program" if m.get("step_time_ms") is not None else "program"
            parts.append(f"live buffers of the largest {which}{program} {amount} (no "
                         f"device memory profile, OOM risk {m.get('oom_risk') or 'UNKNOWN'}"
                         f"{rule})")
        else:
            parts.append(f"peak memory {amount} (OOM risk {m['oom_risk']})")
    if parts:
        sentences.append("Measured: " + ", ".join(parts) + ".")
    if triage.not_judged:
        sentences.append("Could not be judged for lack of data: "
                         + "; ".join(f"whether {s.split(':')[0]}" if "is" in s.split(":")[0]
                                     else s.split(":")[0] for s in triage.not_judged) + ".")
    return " ".join(sentences[:5])
