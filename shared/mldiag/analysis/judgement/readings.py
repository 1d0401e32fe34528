"""What the judgement reads from a health snapshot in more than one place: device idle and
its sources, the program the steps ran, the op profile's categories, collectives on the
timeline, custom calls.

Triage's metrics and checks and several rules share these readings, so they live in this leaf
module, and imports point one way (triage → rules → readings).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.model import Hypothesis, impact_of, priority_of

# Data transfer and collective communication (a share of device time) raise a hypothesis at
# these shares.
OP_CATEGORY_P0_PERCENT = 30.0
OP_CATEGORY_P1_PERCENT = 10.0
LARGE_MODULE_GIB = 0.5
CUSTOM_CALL_REPORT_PERCENT = 10.0

TRANSFER_CATEGORIES = ("copy-done", "copy-start", "host-to-device", "device-to-host", "infeed",
                        "outfeed", "send", "recv", "send-done", "recv-done", "memcpy")

COLLECTIVE_CATEGORIES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                          "collective-permute", "all-reduce-start", "all-reduce-done",
                          "all-gather-start", "all-gather-done", "collective-permute-done")


def category_fraction(
    snapshot: Mapping[str, Any], names: tuple[str, ...]
) -> list[Mapping[str, Any]]:
    rows = ev.get(snapshot, "get_hlo_op_profile", "category_summary", []) or []
    return [r for r in rows if isinstance(r, Mapping) and str(r.get("category")) in names]


def op_category_hypothesis(snapshot: Mapping[str, Any], category: str,
                           names: tuple[str, ...], label: str) -> list[Hypothesis]:
    """The op profile's rows of `names` (xprof's op categories) as one hypothesis of
    `category` when together they take at least OP_CATEGORY_P1_PERCENT of device time."""
    rows = category_fraction(snapshot, names)
    if not rows:
        return []
    total = 100.0 * sum(float(r.get("fraction_of_total_time") or 0.0) for r in rows)
    if total < OP_CATEGORY_P1_PERCENT:
        return []
    top = max(rows, key=lambda r: float(r.get("fraction_of_total_time") or 0.0))
    cat = top["category"]
    proof = [
        ev.cite(snapshot, "get_hlo_op_profile",
                f"category_summary[category={cat}].fraction_of_total_time"),
        ev.cite(snapshot, "get_hlo_op_profile",
                f"category_summary[category={cat}].total_self_time_ms"),
        ev.cite(snapshot, "get_hlo_op_profile", f"category_summary[category={cat}].top_op"),
        ev.cite(snapshot, "get_hlo_op_profile", f"category_summary[category={cat}].op_count"),
        ev.cite(snapshot, "get_hlo_op_profile", "total_profile_time_ms"),
    ]
    return [Hypothesis(
        category=category,
        priority=priority_of(total, OP_CATEGORY_P0_PERCENT, OP_CATEGORY_P1_PERCENT),
        title=f"{label} ({cat}) takes {total:.1f}% of device time",
        evidence=proof,
        impact=impact_of(total, "% of device time",
                         f"{total:.1f}% of profiled device time is {cat}"),
        details={"op_category": cat, "top_op": top.get("top_op"),
                 "categories": [r["category"] for r in rows]},
    )]

_PROGRAM_ID = re.compile(r"\((\d+)\)$")


def stepped_module(snapshot: Mapping[str, Any]) -> tuple[int, int]:
    """(index in summary.top_modules, index in modules) of the largest compiled program that
    ran in the measured steps, so memory is judged on the training step and not on a setup
    program (weights init, RNG); (0, 0) when the timeline names no program."""
    hb = ev.tool_data(snapshot, ev.TIMELINE) or {}
    # The programs with an op inside a measured step; without steps (or from an older
    # snapshot), every program that ran while the profiler was on.
    ran = {str(k) for k in hb.get("programs_in_steps") or ()} or {
        str(k) for k in (hb.get("op_time_ms_by_program") or {}) if k}
    top = ev.get(snapshot, "get_peak_allocations", "summary.top_modules", []) or []
    modules = ev.get(snapshot, "get_peak_allocations", "modules", []) or []
    if not ran:
        return 0, 0
    for i, m in enumerate(top):
        match = _PROGRAM_ID.search(str(m.get("module_name", "")) if isinstance(m, Mapping)
                                   else "")
        if match and match.group(1) in ran:
            name = m.get("module_name")
            j = next((k for k, x in enumerate(modules) if isinstance(x, Mapping)
                      and x.get("module_name") == name), 0)
            return i, j
    return 0, 0

MIN_STEPS_FOR_STEP_IDLE = 3


@dataclass(frozen=True)
class IdleSource:
    """One measurement of device idle: what it is, over what window, and its citations."""

    label: str
    value: float
    window: str  # "steps" or "capture window"
    cites: tuple[tuple[str, str], ...]


def idle_sources(snapshot: Mapping[str, Any], cpu: bool) -> list[IdleSource]:
    """Every measurement of device idle the profile has, the one to judge by first.

    On CPU: the timeline's host wait per step or, with no step markers, the busy share of
    the active span (the capture window from the first op to the last). Elsewhere: xprof's
    overview (per step), the step trace when it has at least 3 steps, the op profile's IDLE
    row (over the profiled window; not when IDLE is its only row, i.e. it saw no op at all),
    our timeline (busy share of each host's active span), then a step trace of 1 or 2 steps.
    """
    out: list[IdleSource] = []
    hb = ev.tool_data(snapshot, ev.TIMELINE) or {}
    hosts = [h for h in hb.get("per_host") or []
             if ev.number(h.get("busy_in_active_span_percent")) is not None]
    timeline = None
    if hosts:
        busy = sum(float(h["busy_in_active_span_percent"]) for h in hosts) / len(hosts)
        timeline = IdleSource("timeline (busy share of the active span)", 100.0 - busy,
                              "capture window", (
                                  (ev.TIMELINE, "per_host[0].busy_in_active_span_percent"),
                                  (ev.TIMELINE, "per_host[0].active_span_ms")))
    if cpu:
        wait = ev.number(hb.get("host_wait_percent"))
        if wait is not None:
            out.append(IdleSource("timeline host wait per step", wait, "steps", (
                (ev.TIMELINE, "host_wait_percent"),
                (ev.TIMELINE, "steps_analyzed"))))
        elif timeline is not None:
            out.append(timeline)
        return out
    path = "performance_summary.device_idle_time_percent"
    overview = ev.percent(ev.get(snapshot, "get_xprof_overview", path))
    steps = int(ev.number(ev.get(snapshot, "get_step_trace", "summary.total_steps")) or 0)
    if overview is not None:
        # Without step markers xprof's overview measures the whole capture.
        out.append(IdleSource("xprof overview", overview,
                              "steps" if steps else "capture window",
                              (("get_xprof_overview", path),)))
    step_idle = ev.number(ev.get(snapshot, "get_step_trace", "summary.idle_percent"))
    step_source = None
    if step_idle is not None:
        step_source = IdleSource(f"step trace ({steps} step{'s' if steps != 1 else ''})",
                                 step_idle, "steps", (
                                     ("get_step_trace", "summary.idle_percent"),
                                     ("get_step_trace", "summary.idle_time_ms_average"),
                                     ("get_step_trace", "summary.total_steps")))
        if steps >= MIN_STEPS_FOR_STEP_IDLE:
            out.append(step_source)
    rows = ev.get(snapshot, "get_hlo_op_profile", "category_summary", []) or []
    idle_row = next((r for r in rows if isinstance(r, Mapping)
                     and str(r.get("category")) == "IDLE"), None)
    if idle_row is not None and len(rows) > 1:
        frac = ev.number(idle_row.get("fraction_of_total_time"))
        if frac is not None:
            out.append(IdleSource("op profile IDLE row", 100.0 * frac, "capture window", (
                ("get_hlo_op_profile", "category_summary[category=IDLE].fraction_of_total_time"),
                ("get_hlo_op_profile", "category_summary[category=IDLE].total_self_time_ms"),
                ("get_hlo_op_profile", "total_profile_time_ms"))))
    if timeline is not None:
        out.append(timeline)
    if step_source is not None and steps < MIN_STEPS_FOR_STEP_IDLE:
        out.append(step_source)
    return out


def device_idle_evidence(snapshot: Mapping[str, Any], cpu: bool) -> list[dict[str, Any]]:
    sources = idle_sources(snapshot, cpu)
    if not sources:
        return []
    out = []
    for tool, path in sources[0].cites:
        try:
            out.append(ev.cite(snapshot, tool, path))
        except ev.MissingField:
            continue
    return out


def timeline_collective_percent(snapshot: Mapping[str, Any]) -> float | None:
    """One device's (or XLA:CPU executor's) share of the step in collectives, from our
    timeline pass: the communication figure where the op profile has no collective rows."""
    return ev.percent(ev.get(snapshot, ev.TIMELINE, "collectives.percent_of_step"))

_OP_PATH_CALL = re.compile(r"jit\((\w+)\)")


def custom_call_api(source: str, primitive: str) -> str:
    """The JAX function a custom call came from: the first `jit(name)` under the step's own
    jit in its op path (`jit(step)/jit(solve)/lu` → `solve`), else its primitive."""
    op_path = source.partition(" (")[2].rstrip(")") if " (" in source else source
    calls = [c for c in _OP_PATH_CALL.findall(op_path) if not c.startswith("_")]
    return calls[1] if len(calls) > 1 else primitive or (op_path.rsplit("/", 1)[-1])


def custom_call_share(snapshot: Mapping[str, Any]) -> tuple[float, list[int]] | None:
    """The timed custom calls' summed share of step (or window) time, and their indices."""
    calls = ev.get(snapshot, ev.CUSTOM_CALLS, "custom_calls", []) or []
    timed = [i for i, c in enumerate(calls) if isinstance(c, Mapping)
             and ev.number(c.get("percent_of_step")) is not None]
    if not timed:
        return None
    return sum(float(calls[i]["percent_of_step"]) for i in timed), timed


# A capture without steps this short, or with this few op executions, is a micro-benchmark:
# its idle share is launch gaps around a handful of calls, not a workload's behaviour.
SHORT_WINDOW_MS = 5.0
SHORT_WINDOW_CALLS = 10


def short_window(snapshot: Mapping[str, Any]) -> tuple[float, int | None] | None:
    """(window ms, op executions) when the capture has no steps and is a short window: under
    SHORT_WINDOW_MS of device time or at most SHORT_WINDOW_CALLS op executions; else None."""
    if ev.number(ev.get(snapshot, ev.TIMELINE, "steps_analyzed")):
        return None
    if ev.number(ev.get(snapshot, "get_step_trace", "summary.total_steps")):
        return None
    calls: int | None = None
    groups = ev.get(snapshot, "get_hlo_op_profile", "grouped_operations", {}) or {}
    rows = [r for ops in groups.values() if isinstance(ops, list) for r in ops
            if isinstance(r, Mapping) and not str(r.get("name", "")).endswith("IDLE")]
    if rows:
        calls = int(sum(ev.number(r.get("occurrences")) or 0 for r in rows))
    window = ev.number(ev.get(snapshot, "get_hlo_op_profile", "total_profile_time_ms"))
    if window is None:
        window = ev.number(ev.get(snapshot, ev.TIMELINE, "per_host[0].active_span_ms"))
    if window is None:
        return None
    if window < SHORT_WINDOW_MS or (calls is not None and 0 < calls <= SHORT_WINDOW_CALLS):
        return window, calls
    return None
