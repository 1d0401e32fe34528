"""Triage: headline metrics, the OPTIMAL test, and the hypotheses worth investigating.

OPTIMAL needs positive evidence that the device computes (the utilization check), no failed
check and no P0/P1 hypothesis. A check whose data is missing is listed under `not_judged`: it
is said, and on its own it does not make a healthy profile NEEDS_ATTENTION.

Each finding category's rule is a module of `rules/`; triage runs them all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement import detections, op_kinds, rules
from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.detections import DETECTOR_P1_PERCENT
from mldiag.analysis.judgement.model import Hypothesis, Triage
from mldiag.analysis.judgement.reading import (
    SessionReading,
    read_session,
    reading_of,
)
from mldiag.analysis.judgement.readings import (
    COLLECTIVE_CATEGORIES,
    CUSTOM_CALL_REPORT_PERCENT,
    LARGE_MODULE_GIB,
    TRANSFER_CATEGORIES,
    category_fraction,
    custom_call_share,
    timeline_collective_percent,
)
from mldiag.analysis.judgement.roofline import (
    ROOFLINE_IDLE_LIMIT_PERCENT,
    roofline_caveats,
    roofline_ops,
)

OPTIMAL, NEEDS_ATTENTION, FAILED = "OPTIMAL", "NEEDS_ATTENTION", "FAILED"

CATEGORIES = rules.CATEGORIES

# Thresholds of the OPTIMAL checks, as shares of step (or device) time.
HIGH_UTILIZATION_PERCENT = 80.0
LOW_OVERHEAD_PERCENT = 15.0

def compute_metrics(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """The headline metrics of analysis.json (the session reading's `values`)."""
    return dict(read_session(snapshot).values)


def hypotheses(reading: SessionReading) -> list[Hypothesis]:
    """Every suspected bottleneck, strongest first: each rule's, in raise order, then sorted
    by priority and impact (stably, so the raise order decides ties)."""
    out: list[Hypothesis] = []
    detectors_raised = False
    for rule in rules.IN_RAISE_ORDER:
        if isinstance(rule, rules.DetectorRule):
            if not detectors_raised:
                # One op, one finding: the detector categories are raised in one pass.
                out += detections.hypotheses(reading.snapshot, rules.DETECTORS)
                detectors_raised = True
        else:
            out += rule.hypotheses(reading)
    if reading.steps.micro_benchmark and any(
            h.details.get("kind") == "judged_call" for h in out):
        # A kernel micro-benchmark's program is its kernel: the kernel's own finding is the
        # verdict, and the program's bound would say the same thing with the wrong fix.
        out = [h for h in out if h.category not in _ESTIMATES]
    order = {"P0": 0, "P1": 1, "P2": 2}
    out.sort(key=lambda h: (order[h.priority], -(h.impact.get("value") or 0.0)))
    share_of_one_whole(out)
    return out

# Upper bounds (what could be gained) overlap the measured shares: they are counted last.
_ESTIMATES = ("memory_bound", "compute_bound")


def share_of_one_whole(found: list[Hypothesis]) -> None:
    """Make the impacts that are shares of step or device time add up to at most 100%.

    Measured shares (idle, transfers, host wait, detectors) are counted first, strongest
    first; upper-bound estimates (roofline headroom) last. An impact that would pass 100% is
    cut to what is left, and says it was (`impact.overlap_trimmed_from`)."""
    left = 100.0

    def estimate(h: Hypothesis) -> bool:
        return h.category in _ESTIMATES or bool(h.details.get("estimate"))
    measured = [h for h in found if not estimate(h)]
    for h in measured + [h for h in found if estimate(h)]:
        value = h.impact.get("value")
        if h.impact.get("unit") not in ("% of step", "% of device time") or value is None:
            continue
        if value > left:
            h.impact["overlap_trimmed_from"] = value
            h.impact["value"] = round(max(left, 0.0), 2)
            h.impact["text"] += (f" (counted as {h.impact['value']:.1f}%: the findings "
                                 f"above already cover the other {100.0 - left:.1f}%)")
        left -= h.impact["value"]


def health_checks(reading: SessionReading, found: list[Hypothesis]
                  ) -> tuple[list[dict[str, Any]], list[str]]:
    """The four OPTIMAL checks: each passes, fails, or could not be judged."""
    snapshot, metrics = reading.snapshot, reading.values
    checks: list[dict[str, Any]] = []
    not_judged: list[str] = []
    cpu = reading.cpu
    hb = ev.tool_data(snapshot, ev.TIMELINE) or {}

    util: float | None = None
    util_source = ("XLA:CPU busy share of step (timeline)" if cpu else
                   "op time outside IDLE, transfers and collectives (get_hlo_op_profile)")
    if cpu:
        wait = ev.number(hb.get("host_wait_percent"))
        if wait is not None:
            util = 100.0 - wait
            collectives = timeline_collective_percent(snapshot)
            if collectives:
                # Waiting in a collective is not computing, as on devices (below).
                util = round(max(0.0, util - collectives), 2)
                util_source = ("XLA:CPU busy share of step outside collectives (timeline)")
        elif metrics.get("device_idle_window") == "capture window" and (
                metrics.get("device_idle_percent") is not None):
            # No step markers: judged over the capture window instead.
            util = round(100.0 - float(metrics["device_idle_percent"]), 2)
            util_source = "XLA:CPU busy share of the capture window (timeline, no step markers)"
    else:
        # A busy device is not a computing one: time in copies, collectives and IDLE does not
        # count (a duty cycle of 86% is mostly copy-done on the TPU fixture).
        rows = ev.get(snapshot, "get_hlo_op_profile", "category_summary", []) or []
        # An op profile whose only row is IDLE saw no op at all (a TensorFlow GPU trace):
        # it says nothing about utilization.
        if any(isinstance(r, Mapping) and str(r.get("category")) != "IDLE" for r in rows):
            waste = sum(float(r.get("fraction_of_total_time") or 0.0) for r in rows
                        if str(r.get("category")) in ("IDLE", *TRANSFER_CATEGORIES,
                                                      *COLLECTIVE_CATEGORIES))
            util = round(100.0 * (1.0 - waste), 2)
        else:
            util = ev.percent(ev.get(snapshot, "get_xprof_overview",
                                     "performance_summary.device_duty_cycle_percent"))
            util_source = "device duty cycle (get_xprof_overview)"
        if util is None and (metrics.get("device_idle_source") or "").startswith("timeline"):
            util = round(100.0 - float(metrics["device_idle_percent"]), 2)
            util_source = "busy share of the active span (timeline, mldiag.timeline)"
        if util is None:
            util = ev.number(ev.get(snapshot, "get_step_trace", "summary.compute_percent"))
            util_source = "compute share of step (get_step_trace)"
    micro = reading.steps.micro_benchmark
    # A micro-benchmark's time shares are the gaps around a handful of calls: said, not judged.
    gaps = ("not judged: a micro-benchmark's few calls, whose gaps are launch overhead, not a "
            "workload's behaviour (see the short-window note)")
    checks.append(_check("compute utilization is high", util, util_source,
                         None if util is None or micro else util >= HIGH_UTILIZATION_PERCENT,
                         f">= {HIGH_UTILIZATION_PERCENT:g}%", gaps if micro else None))

    overhead: float | None = None
    idle = metrics.get("device_idle_percent")
    comm_rows = category_fraction(snapshot, COLLECTIVE_CATEGORIES)
    comm = 100.0 * sum(float(r.get("fraction_of_total_time") or 0.0) for r in comm_rows)
    comm_source = "collective % of device time"
    if not comm_rows and timeline_collective_percent(snapshot) is not None:
        # No op profile rows (XLA:CPU): the timeline's per-device share of the step.
        comm = float(timeline_collective_percent(snapshot) or 0.0)
        comm_source = "collective % of each device's step (timeline)"
    if idle is not None:
        overhead = float(idle) + comm
    checks.append(_check("idle + communication overhead is low", overhead,
                         f"device idle % + {comm_source}",
                         None if overhead is None or micro else
                         overhead <= LOW_OVERHEAD_PERCENT,
                         f"<= {LOW_OVERHEAD_PERCENT:g}%", gaps if micro else None))

    risk = metrics.get("oom_risk")
    if metrics.get("oom_risk_rule"):
        checks.append(_check("OOM risk is LOW", risk, str(metrics["oom_risk_rule"]),
                             None if risk in (None, "UNKNOWN") else risk == "LOW",
                             f"LOW (< {LARGE_MODULE_GIB:g} GiB live per program on CPU)"))
    else:
        checks.append(_check("OOM risk is LOW", risk,
                             "peak memory / capacity (get_memory_profile)",
                             None if risk in (None, "UNKNOWN") else risk == "LOW", "LOW"))

    det_tools = [t for t in rules.DETECTORS if ev.tool_data(snapshot, t) is not None]
    detector_categories = {category for category, _ in rules.DETECTORS.values()}
    material = [h for h in found if h.category in detector_categories
                and h.priority in ("P0", "P1")]
    checks.append(_check("no detector finding has a material impact", len(material),
                         "HLO detectors with a share of step (or, without steps, window) time",
                         None if not det_tools else not material,
                         f"0 findings >= {DETECTOR_P1_PERCENT:g}% of "
                         + ("step" if metrics.get("step_time_ms") is not None else
                            "device time (capture window)"),
                         None if det_tools else detectors_failed(reading)))
    for c in checks:
        if c["passed"] is None:
            not_judged.append(f"{c['check']}: {c['why_unknown']}")
    idle_now = metrics.get("device_idle_percent")
    if metrics.get("roofline_efficiency_percent") is not None and idle_now is not None and (
            idle_now >= ROOFLINE_IDLE_LIMIT_PERCENT) and not micro:
        not_judged.append(f"roofline bound: the device is idle {idle_now:.1f}% of the "
                          f"{metrics.get('judged_over') or 'window'}, so the bound of the "
                          "little work it does says nothing about the program (fix the idle "
                          "time first)")
    for caveat in roofline_caveats(snapshot):
        not_judged.append(f"roofline FLOP rate: {caveat}")
    not_judged += opaque_call_notes(snapshot, metrics, found)
    short = reading.steps.short_window
    if short is not None:
        window_ms, calls = short
        idle_now = metrics.get("device_idle_percent")
        not_judged.append(
            f"short window: the capture is {window_ms:.3g} ms of device time"
            + (f" with {calls} op execution(s)" if calls else "")
            + " and no steps, a micro-benchmark rather than a workload; its figures describe "
            "those calls only"
            + (f", and its {idle_now:.1f}% device idle is the gaps around them, not judged "
               "as a bottleneck" if idle_now is not None else "")
            + " (profile many steps of the real loop to judge it)")
    if metrics.get("step_time_ms") is None:
        not_judged.append("step time: the trace has no step markers, so idle, utilization and "
                          "impacts are judged over the capture window (wrap each training step "
                          "in jax.profiler.StepTraceAnnotation to get per-step figures)")
    return checks, not_judged


def opaque_call_notes(snapshot: Mapping[str, Any], metrics: Mapping[str, Any],
                      found: list[Hypothesis]) -> list[str]:
    """The custom calls whose efficiency cannot be judged, as a note: only those xprof marks
    opaque (flops_provenance=opaque_custom_call) or, without a roofline (XLA:CPU), those no
    finding covers. Shape-derived calls are judged like any op and need no note."""
    if ev.tool_data(snapshot, "get_roofline_model") is not None:
        opaque = [op for op in roofline_ops(snapshot) if op.opaque]
        share = sum(op.share_percent or 0.0 for op in opaque)
        if not opaque or share < CUSTOM_CALL_REPORT_PERCENT:
            return []
        named = ", ".join(
            f"`{op.name}` ({op_kinds.LABELS[op_kinds.kind_of(op.name, category=op.category)]})"
            for op in opaque[:3])
        they = "they" if len(opaque) > 1 else "it"
        return [f"custom-call efficiency: {named} take {share:.1f}% of device time and xprof "
                f"marks {'them' if len(opaque) > 1 else 'it'} opaque "
                f"(flops_provenance=opaque_custom_call): {they} count as 0 FLOPs, so {their(they)} "
                "efficiency is not judged and the program's roofline efficiency leaves that "
                "work out; the time is still in every time share"]
    calls = custom_call_share(snapshot)
    if calls is None or calls[0] < CUSTOM_CALL_REPORT_PERCENT:
        return []
    if any(h.details.get("kind") == "custom_calls" for h in found):
        return []  # a finding covers them, with each call's own fix
    return [f"custom-call efficiency: custom calls run {calls[0]:.1f}% of the "
            f"{'step' if metrics.get('step_time_ms') is not None else 'window'}; this profile "
            "has no roofline (XLA:CPU) and the calls no FLOP count, so their efficiency is not "
            "judged"]


_UNKNOWN_OPCODE = re.compile(r"Unknown opcode: ([\w.-]+)")


def detectors_failed(reading: SessionReading) -> str | None:
    """Why no HLO detector has data, when they failed (None when they did not run or found
    nothing to read). xprof's HLO parser refuses an opcode it does not know: a profile from a
    newer XLA (jax 0.12.1 emits `fma`) then has no HLO findings at all, and says so."""
    failed = [r for name in rules.DETECTORS if (r := reading.tools.get(name)) is not None
              and r.status == "ERROR"]
    if not failed:
        return None
    errors = sorted({r.error or "no error text recorded" for r in failed})
    xprof = str(reading.snapshot.get("xprof_version") or "installed")
    if m := _UNKNOWN_OPCODE.search(" ".join(errors)):
        return (f"the HLO detectors could not read this profile's programs: xprof {xprof}'s "
                f"HLO parser does not know the opcode `{m.group(1)}`, which the XLA that ran "
                "the workload emits (jax 0.12.1 emits `fma`); layout copies, unfused reshapes "
                "and convert-reduce chains are not judged until xprof knows it (or the "
                "workload runs on jax < 0.12.1)")
    return f"the HLO detectors failed ({len(failed)} of {len(rules.DETECTORS)}): {errors[0]}"


def their(they: str) -> str:
    return "their" if they == "they" else "its"


def _check(name: str, value: Any, source: str, passed: bool | None, target: str,
           why_unknown: str | None = None) -> dict[str, Any]:
    why = ""
    if passed is None:
        why = why_unknown or f"no data ({source} unavailable in this profile)"
    return {"check": name, "value": value, "target": target, "source": source,
            "passed": passed, "why_unknown": why}


def triage(source: Mapping[str, Any] | SessionReading) -> Triage:
    """Decide OPTIMAL vs NEEDS_ATTENTION and list the hypotheses for the investigator.

    `source` is the session's reading, or a snapshot read here once."""
    reading = reading_of(source)
    metrics = dict(reading.values)
    found = hypotheses(reading)
    checks, not_judged = health_checks(reading, found)
    # OPTIMAL needs positive evidence that the device computes (the utilization check) and no
    # failed check or P0/P1 hypothesis. A check without data is listed as not judged; on its
    # own it does not turn a healthy profile into NEEDS_ATTENTION.
    healthy = (checks[0]["passed"] is True
               and not any(c["passed"] is False for c in checks)
               and not any(h.priority in ("P0", "P1") for h in found))
    return Triage(
        status=OPTIMAL if healthy else NEEDS_ATTENTION,
        metrics=metrics, checks=checks, not_judged=not_judged, hypotheses=found,
        reading=reading,
    )
