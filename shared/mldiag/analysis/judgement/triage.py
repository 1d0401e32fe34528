"""Triage: headline metrics, the OPTIMAL test, and the hypotheses worth investigating.

OPTIMAL needs positive evidence that the device computes (the utilization check), no failed
check and no P0/P1 hypothesis. A check whose data is missing is listed under `not_judged`: it
is said, and on its own it does not make a healthy profile NEEDS_ATTENTION.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mldiag.analysis.judgement import evidence as ev

OPTIMAL, NEEDS_ATTENTION, FAILED = "OPTIMAL", "NEEDS_ATTENTION", "FAILED"

CATEGORIES = (
    "host_bound", "idle", "layout_copy", "unfused_reshape", "convert_reduce", "memory_pressure",
    "memory_bound", "compute_bound", "communication", "data_transfer", "other",
)

# Thresholds, as shares of step (or device) time.
HIGH_UTILIZATION_PERCENT = 80.0
LOW_OVERHEAD_PERCENT = 15.0
HOST_WAIT_P0_PERCENT = 50.0
HOST_WAIT_P1_PERCENT = 20.0
IDLE_P0_PERCENT = 30.0
IDLE_P1_PERCENT = 10.0
OP_CATEGORY_P0_PERCENT = 30.0
OP_CATEGORY_P1_PERCENT = 10.0
DETECTOR_P0_PERCENT = 10.0
DETECTOR_P1_PERCENT = 3.0
MATERIAL_DETECTOR_PERCENT = 1.0
ROOFLINE_LOW_PERCENT = 50.0
LARGE_MODULE_GIB = 0.5
CPU_MEMORY_RULE = (f"CPU: no device capacity in the profile; LOW when the live buffers of the "
                   f"largest compiled program that ran in the measured steps (or, without "
                   f"steps, in the capture) are under {LARGE_MODULE_GIB:g} GiB")

_TRANSFER_CATEGORIES = ("copy-done", "copy-start", "host-to-device", "device-to-host", "infeed",
                        "outfeed", "send", "recv", "send-done", "recv-done", "memcpy")
_COLLECTIVE_CATEGORIES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                          "collective-permute", "all-reduce-start", "all-reduce-done",
                          "all-gather-start", "all-gather-done", "collective-permute-done")

DETECTOR_CATEGORY = {
    "detect_layout_mismatch_copies": "layout_copy",
    "detect_unfused_reshapes": "unfused_reshape",
    "detect_unnecessary_convert_reduce": "convert_reduce",
}


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


def _is_cpu(snapshot: Mapping[str, Any]) -> bool:
    dtype = ev.get(snapshot, "get_xprof_overview", "run_environment.device_type")
    return str(dtype or "").upper() == "CPU"


def _impact(value: float | None, unit: str, text: str) -> dict[str, Any]:
    return {"value": round(value, 2) if value is not None else None, "unit": unit, "text": text}


def _priority(value: float, p0: float, p1: float) -> str:
    return "P0" if value >= p0 else "P1" if value >= p1 else "P2"


def compute_metrics(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """The headline metrics of analysis.json, each read from a tool output (None if absent)."""
    hb = ev.get(snapshot, "get_step_trace", "host_bound_analysis", {}) or {}
    # Our timeline's steps are the denominator of every per-step figure in the report, so the
    # headline step time comes from the same steps (xprof's step trace may drop some).
    step = ev.number(hb.get("step_time_ms_average")) if hb.get("steps_analyzed") else None
    if not step:
        step = ev.number(ev.get(snapshot, "get_step_trace", "summary.step_time_ms_average"))
    if not step:
        step = ev.number(ev.get(snapshot, "get_xprof_overview",
                                "performance_summary.steptime_ms_average")) or None
    sources = idle_sources(snapshot)
    chosen = sources[0] if sources else None
    idle = chosen.value if chosen else None
    roofline = _roofline_efficiency(snapshot)
    peak = ev.number(ev.get(snapshot, "get_memory_profile", "peak_memory_usage_gib"))
    capacity = ev.number(ev.get(snapshot, "get_memory_profile", "memory_capacity_gib"))
    source = "get_memory_profile" if peak is not None else None
    program = None
    if peak is None:
        top_i, _ = stepped_module(snapshot)
        mib = ev.number(ev.get(snapshot, "get_peak_allocations",
                               f"summary.top_modules[{top_i}].total_hbm_mib"))
        peak = round(mib / 1024.0, 4) if mib is not None else None
        source = "get_peak_allocations" if peak is not None else None
        if peak is not None:
            program = ev.get(snapshot, "get_peak_allocations",
                             f"summary.top_modules[{top_i}].module_name")
    if capacity is not None and capacity <= 0:
        capacity = None
    risk = oom_risk(peak, capacity)
    rule = None
    if _is_cpu(snapshot) and capacity is None and peak is not None:
        # XLA:CPU buffers live in host RAM, whose size the profile does not record: the stated
        # rule judges the live buffers of the largest compiled program instead.
        rule = CPU_MEMORY_RULE
        risk = "LOW" if peak < LARGE_MODULE_GIB else "UNKNOWN"
    return {
        "step_time_ms": round(step, 3) if step else None,
        "device_idle_percent": round(idle, 2) if idle is not None else None,
        "roofline_efficiency_percent": roofline,
        "peak_memory_gib": peak,
        "memory_capacity_gib": capacity,
        "oom_risk": risk,
        "oom_risk_rule": rule,
        "peak_memory_source": source,
        # The compiled program whose buffers peak_memory_gib is (get_peak_allocations only).
        "peak_memory_program": program,
        # Where device idle came from, over what, and what every source said.
        "device_idle_source": chosen.label if chosen else None,
        "device_idle_window": chosen.window if chosen else None,
        "device_idle_sources": {x.label: round(x.value, 2) for x in sources},
        "judged_over": chosen.window if chosen else ("steps" if step else "capture window"),
        # The spread of the same steps the headline step time averages (our timeline's).
        "step_time_spread": hb.get("step_time_spread") if hb.get("steps_analyzed") else None,
    }


_PROGRAM_ID = re.compile(r"\((\d+)\)$")


def stepped_module(snapshot: Mapping[str, Any]) -> tuple[int, int]:
    """(index in summary.top_modules, index in modules) of the largest compiled program that
    ran in the measured steps, so memory is judged on the training step and not on a setup
    program (weights init, RNG); (0, 0) when the timeline names no program."""
    hb = ev.get(snapshot, "get_step_trace", "host_bound_analysis", {}) or {}
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


def _roofline_efficiency(snapshot: Mapping[str, Any]) -> float | None:
    """Roofline efficiency, or None when xprof could not place the program on a roofline."""
    program = ev.get(snapshot, "get_roofline_model", "program")
    if not isinstance(program, Mapping):
        return None
    bound = str(program.get("bound_by") or "").strip().lower()
    if bound in ("", "unknown") or not ev.number(program.get("measured_flop_rate_gflops")) and \
            not ev.number(program.get("measured_memory_bw_gibs")):
        return None
    return ev.percent(program.get("roofline_efficiency_percent"))


MIN_STEPS_FOR_STEP_IDLE = 3


@dataclass(frozen=True)
class IdleSource:
    """One measurement of device idle: what it is, over what window, and its citations."""

    label: str
    value: float
    window: str  # "steps" or "capture window"
    cites: tuple[tuple[str, str], ...]


def idle_sources(snapshot: Mapping[str, Any]) -> list[IdleSource]:
    """Every measurement of device idle the profile has, the one to judge by first.

    On CPU: the timeline's host wait per step or, with no step markers, the busy share of
    the active span (the capture window from the first op to the last). Elsewhere: xprof's
    overview (per step), the step trace when it has at least 3 steps, the op profile's IDLE
    row (over the profiled window; not when IDLE is its only row, i.e. it saw no op at all),
    our timeline (busy share of each host's active span), then a step trace of 1 or 2 steps.
    """
    out: list[IdleSource] = []
    hb = ev.get(snapshot, "get_step_trace", "host_bound_analysis", {}) or {}
    hosts = [h for h in hb.get("per_host") or []
             if ev.number(h.get("busy_in_active_span_percent")) is not None]
    timeline = None
    if hosts:
        busy = sum(float(h["busy_in_active_span_percent"]) for h in hosts) / len(hosts)
        timeline = IdleSource("timeline (busy share of the active span)", 100.0 - busy,
                              "capture window", (
                                  ("get_step_trace",
                                   "host_bound_analysis.per_host[0].busy_in_active_span_percent"),
                                  ("get_step_trace",
                                   "host_bound_analysis.per_host[0].active_span_ms")))
    if _is_cpu(snapshot):
        wait = ev.number(hb.get("host_wait_percent"))
        if wait is not None:
            out.append(IdleSource("timeline host wait per step", wait, "steps", (
                ("get_step_trace", "host_bound_analysis.host_wait_percent"),
                ("get_step_trace", "host_bound_analysis.steps_analyzed"))))
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


def _device_idle_evidence(snapshot: Mapping[str, Any]) -> list[dict[str, Any]]:
    sources = idle_sources(snapshot)
    if not sources:
        return []
    out = []
    for tool, path in sources[0].cites:
        try:
            out.append(ev.cite(snapshot, tool, path))
        except ev.MissingField:
            continue
    return out


def oom_risk(peak: float | None, capacity: float | None) -> str:
    if peak is None or capacity is None or capacity <= 0:
        return "UNKNOWN"
    ratio = peak / capacity
    return "HIGH" if ratio >= 0.9 else "MEDIUM" if ratio >= 0.75 else "LOW"


def _category_fraction(
    snapshot: Mapping[str, Any], names: tuple[str, ...]
) -> list[Mapping[str, Any]]:
    rows = ev.get(snapshot, "get_hlo_op_profile", "category_summary", []) or []
    return [r for r in rows if isinstance(r, Mapping) and str(r.get("category")) in names]


def hypotheses(snapshot: Mapping[str, Any], metrics: Mapping[str, Any]) -> list[Hypothesis]:
    """Every suspected bottleneck, strongest first."""
    out: list[Hypothesis] = []
    out += _host_bound(snapshot)
    out += _idle(snapshot, metrics)
    out += _op_categories(snapshot)
    out += _roofline(snapshot, metrics)
    out += _memory(snapshot, metrics)
    out += _detectors(snapshot)
    out += _custom_calls(snapshot)
    out += _suggestions(snapshot)
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


def _host_bound(snapshot: Mapping[str, Any]) -> list[Hypothesis]:
    hb = ev.get(snapshot, "get_step_trace", "host_bound_analysis")
    if not hb or not hb.get("steps_analyzed"):
        return []
    tool, base = "get_step_trace", "host_bound_analysis"
    wait = ev.number(hb.get("host_wait_percent"))
    hosts = [h for h in hb.get("per_host") or [] if h.get("host_wait_percent") is not None]
    proof: list[dict[str, Any]] = []
    if len(hosts) > 1:
        # An average over hosts hides a straggler: judge and cite the worst host.
        i, worst = max(enumerate(hosts), key=lambda kv: kv[1]["host_wait_percent"])
        index = (hb.get("per_host") or []).index(worst)
        wait = float(worst["host_wait_percent"])
        proof += [ev.cite(snapshot, tool, f"{base}.per_host[{index}].{k}") for k in (
            "host", "host_wait_percent", "step_time_ms_average", "compute_busy_ms_average")]
        step_ms = float(worst["step_time_ms_average"])
        wait_ms = step_ms - float(worst["compute_busy_ms_average"] or 0.0)
        who = f"host {worst['host']} waits"
    else:
        step_ms = float(hb["step_time_ms_average"])
        wait_ms = ev.number(hb.get("host_wait_ms_average")) or 0.0
        who = "the device waits"
    if wait is None or wait < HOST_WAIT_P1_PERCENT:
        return []
    proof += [ev.cite(snapshot, tool, f"{base}.{k}") for k in (
        "host_wait_percent", "step_time_ms_average", "compute_busy_ms_average",
        "steps_mostly_waiting", "steps_analyzed")]
    return [Hypothesis(
        category="host_bound",
        priority=_priority(wait, HOST_WAIT_P0_PERCENT, HOST_WAIT_P1_PERCENT),
        title=f"Host-bound: {who} {wait:.1f}% of each step for the host",
        evidence=proof,
        impact=_impact(wait, "% of step",
                       f"up to {wait_ms:.1f} ms of each {step_ms:.1f} ms step ({wait:.1f}%) is "
                       "spent outside compiled XLA work"),
        details={"host_wait_ms": wait_ms},
    )]


def _idle(snapshot: Mapping[str, Any], metrics: Mapping[str, Any]) -> list[Hypothesis]:
    if _is_cpu(snapshot) and metrics.get("device_idle_window") == "steps":
        return []  # On CPU with steps, the host-bound analysis covers idle time.
    idle = metrics.get("device_idle_percent")
    if idle is None or idle < IDLE_P1_PERCENT:
        return []
    proof = _device_idle_evidence(snapshot)
    window = metrics.get("device_idle_window") or "capture window"
    per_step = window == "steps" and proof[0]["tool"] == "get_step_trace"
    steps = int(ev.number(ev.get(snapshot, "get_step_trace", "summary.total_steps")) or 0)
    duty = ev.get(snapshot, "get_xprof_overview", "performance_summary.device_duty_cycle_percent")
    if duty is not None and not _is_cpu(snapshot):  # xprof's device metrics are not CPU's
        proof.append(ev.cite(snapshot, "get_xprof_overview",
                             "performance_summary.device_duty_cycle_percent"))
    hb = ev.get(snapshot, "get_step_trace", "host_bound_analysis", {}) or {}
    hosts = hb.get("per_host") or []
    busy = "host_bound_analysis.per_host[0].busy_in_active_span_percent"
    if hosts and hosts[0].get("busy_in_active_span_percent") is not None and not any(
            p["field"] == busy for p in proof):
        proof.append(ev.cite(snapshot, "get_step_trace", busy))
    idle_devices: list[str] = []
    devices = (hosts[0].get("devices") or []) if hosts else []
    if len(devices) > 1 and hosts[0].get("idle_devices"):
        idle_devices = list(hosts[0]["idle_devices"])
        proof.append(ev.cite(snapshot, "get_step_trace",
                             "host_bound_analysis.per_host[0].idle_devices"))
    priority = _priority(idle, IDLE_P0_PERCENT, IDLE_P1_PERCENT)
    scope = "the profiled time" if window == "steps" else "the capture window"
    if per_step:
        scope = "each step"
        if steps < 3:
            # One or two steps are too few to call critical: warm-up or a one-off stall.
            scope = f"the {steps} captured step{'s' if steps != 1 else ''}"
            priority = "P1" if priority == "P0" else priority
    title = f"Device idle {idle:.1f}% of {scope}"
    if idle_devices:
        names = ", ".join(d.rsplit("/", 1)[-1].replace("device:", "") for d in idle_devices)
        title += f"; {len(idle_devices)} of {len(devices)} devices ran no work ({names})"
    return [Hypothesis(
        category="idle",
        priority=priority,
        title=title,
        evidence=proof,
        impact=_impact(idle, "% of step" if per_step else "% of device time",
                       f"{idle:.1f}% of {'step' if per_step else 'device'} time has no op "
                       f"running (source: {metrics.get('device_idle_source')})"),
        details={"source": metrics.get("device_idle_source"), "window": window,
                 "sources": metrics.get("device_idle_sources"),
                 "idle_devices": idle_devices, "cpu": _is_cpu(snapshot)},
    )]


def _op_categories(snapshot: Mapping[str, Any]) -> list[Hypothesis]:
    out = []
    for category, names, label in (
        ("data_transfer", _TRANSFER_CATEGORIES, "Data transfer"),
        ("communication", _COLLECTIVE_CATEGORIES, "Collective communication"),
    ):
        rows = _category_fraction(snapshot, names)
        if not rows:
            if category == "communication":
                out.extend(_timeline_collectives(snapshot))
            continue
        total = 100.0 * sum(float(r.get("fraction_of_total_time") or 0.0) for r in rows)
        if total < OP_CATEGORY_P1_PERCENT:
            continue
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
        out.append(Hypothesis(
            category=category,
            priority=_priority(total, OP_CATEGORY_P0_PERCENT, OP_CATEGORY_P1_PERCENT),
            title=f"{label} ({cat}) takes {total:.1f}% of device time",
            evidence=proof,
            impact=_impact(total, "% of device time",
                           f"{total:.1f}% of profiled device time is {cat}"),
            details={"op_category": cat, "top_op": top.get("top_op"),
                     "categories": [r["category"] for r in rows]},
        ))
    return out


def timeline_collective_percent(snapshot: Mapping[str, Any]) -> float | None:
    """One device's (or XLA:CPU executor's) share of the step in collectives, from our
    timeline pass: the communication figure where the op profile has no collective rows."""
    return ev.percent(ev.get(snapshot, "get_step_trace",
                             "host_bound_analysis.collectives.percent_of_step"))


def _timeline_collectives(snapshot: Mapping[str, Any]) -> list[Hypothesis]:
    share = timeline_collective_percent(snapshot)
    if share is None or share < OP_CATEGORY_P1_PERCENT:
        return []
    block = ev.get(snapshot, "get_step_trace", "host_bound_analysis.collectives", {}) or {}
    top = (block.get("ops") or [{}])[0]
    base = "host_bound_analysis.collectives"
    proof = [
        ev.cite(snapshot, "get_step_trace", f"{base}.percent_of_step"),
        ev.cite(snapshot, "get_step_trace", f"{base}.ms_per_step_per_executor"),
        ev.cite(snapshot, "get_step_trace", f"{base}.ops[0].op"),
        ev.cite(snapshot, "get_step_trace", f"{base}.ops[0].executors"),
        ev.cite(snapshot, "get_step_trace", f"{base}.ops[0].percent_of_step"),
        ev.cite(snapshot, "get_step_trace", "host_bound_analysis.steps_analyzed"),
    ]
    op = str(top.get("op") or "collectives")
    executors = top.get("executors")
    return [Hypothesis(
        category="communication",
        priority=_priority(share, OP_CATEGORY_P0_PERCENT, OP_CATEGORY_P1_PERCENT),
        title=(f"Collective communication ({op}) takes {share:.1f}% of each step per device"
               + (f" ({executors} devices)" if executors else "")),
        evidence=proof,
        impact=_impact(share, "% of step",
                       f"each device spends {share:.1f}% of its step in collectives "
                       f"({ev.number(block.get('ms_per_step_per_executor')) or 0:.1f} ms "
                       "per step; timeline, normalised per device)"),
        details={"op_category": "collective", "top_op": op, "source": "timeline",
                 "categories": sorted({_collective_kind(str(o.get("op") or ""))
                                       for o in block.get("ops") or []}),
                 "executors": executors,
                 "ms_per_step": ev.number(block.get("ms_per_step_per_executor"))},
    )]


def _collective_kind(op: str) -> str:
    """`all_gather.3` → `all-gather`: the collective without its instance number."""
    return re.sub(r"([-_](start|done))?(\.\d+)?$", "", op).replace("_", "-")


ROOFLINE_IDLE_LIMIT_PERCENT = 50.0
_DATA_MOVEMENT = ("copy-done", "copy-start", "copy", "broadcast", "bitcast", "slice",
                  "dynamic-slice", "dynamic-update-slice", "transpose", "reshape", "pad",
                  "concatenate", *_TRANSFER_CATEGORIES)


def roofline_ops_split(snapshot: Mapping[str, Any]) -> dict[str, float] | None:
    """Per-op roofline of the top operations, split into zero-FLOP data movement and the ops
    that compute: each group's share of the profiled time and time-weighted efficiency."""
    ops = ev.get(snapshot, "get_roofline_model", "top_operations", []) or []
    groups: dict[str, list[tuple[float, float]]] = {"moving": [], "computing": []}
    for op in ops:
        if not isinstance(op, Mapping):
            continue
        share = ev.percent(op.get("total_self_time_percent"))
        eff = ev.percent(op.get("roofline_efficiency_percent"))
        oi = ev.number(op.get("bottleneck_operational_intensity_flop_per_byte"))
        if oi is None:
            oi = ev.number(op.get("operational_intensity_flop_per_byte"))
        if share is None or eff is None or share <= 0:
            continue
        # Collectives move data between devices: not compute either.
        moving = not oi or str(op.get("category") or "") in (*_DATA_MOVEMENT,
                                                              *_COLLECTIVE_CATEGORIES)
        groups["moving" if moving else "computing"].append((share, min(eff, 100.0)))
    if not groups["computing"] and not groups["moving"]:
        return None
    out: dict[str, float] = {}
    for name, rows in groups.items():
        total = sum(share for share, _ in rows)
        out[f"{name}_share_percent"] = round(total, 2)
        out[f"{name}_efficiency_percent"] = (round(sum(sh * e for sh, e in rows) / total, 2)
                                             if total else 0.0)
    return out


def roofline_caveats(snapshot: Mapping[str, Any]) -> list[str]:
    """xprof's own warnings about its FLOP counts (custom calls count as 0 FLOPs)."""
    program = ev.get(snapshot, "get_roofline_model", "program") or {}
    if not isinstance(program, Mapping):
        return []
    out = []
    if str(program.get("flops_provenance") or "") == "opaque_custom_call":
        out.append("the program's FLOPs come from custom calls xprof cannot count "
                   "(flops_provenance=opaque_custom_call), so its FLOP rate and bound "
                   "understate the work")
    elif program.get("has_opaque_custom_calls") is True:
        out.append("some custom calls count as 0 FLOPs (has_opaque_custom_calls), so the FLOP "
                   "rate is a lower bound")
    return out


def _roofline(snapshot: Mapping[str, Any], metrics: Mapping[str, Any]) -> list[Hypothesis]:
    program = ev.get(snapshot, "get_roofline_model", "program")
    eff = _roofline_efficiency(snapshot)
    if not isinstance(program, Mapping) or eff is None:
        return []
    bound = str(program.get("bound_by") or "")
    if eff >= ROOFLINE_LOW_PERCENT or not bound:
        return []
    idle = metrics.get("device_idle_percent")
    caveats = roofline_caveats(snapshot)
    if idle is not None and idle >= ROOFLINE_IDLE_LIMIT_PERCENT:
        return []  # not busy enough for its bound to mean anything (see health_checks)
    if str(program.get("flops_provenance") or "") == "opaque_custom_call":
        return []  # its FLOP count is not the program's (see health_checks)
    split = roofline_ops_split(snapshot)
    oi_field = ("program.bottleneck_operational_intensity_flop_per_byte"
                if "bottleneck_operational_intensity_flop_per_byte" in program
                else "program.operational_intensity_flop_per_byte")
    fields = ["program.bound_by", "program.roofline_efficiency_percent", oi_field,
              "program.bound_by_ridge_point_flop_per_byte", "program.flops_provenance"]
    proof = [ev.cite(snapshot, "get_roofline_model", f) for f in fields
             if f.split(".", 1)[1] in program]
    is_compute = bound.lower() in ("compute", "flops", "mxu")
    category = "compute_bound" if is_compute else "memory_bound"
    priority = "P1" if eff < 10.0 else "P2"
    note = ""
    if split and split["moving_share_percent"] > split["computing_share_percent"]:
        # Zero-FLOP copies drag the program's efficiency down; the ops that compute are judged
        # on their own, and the copies are the data-transfer finding's.
        note = (f"; zero-FLOP data movement is {split['moving_share_percent']:.1f}% of the "
                f"time, the computing ops ({split['computing_share_percent']:.1f}%) run at "
                f"{split['computing_efficiency_percent']:.1f}% of their roofline")
        if split["computing_efficiency_percent"] >= ROOFLINE_LOW_PERCENT:
            priority = "P2"
    title = (f"{'Compute' if is_compute else bound + '-bandwidth'}-bound at {eff:.2f}% "
             "roofline efficiency")
    if note:
        title += (f", dragged down by zero-FLOP data movement (computing ops at "
                  f"{split['computing_efficiency_percent']:.1f}%)") if split else ""
    if caveats:
        note += "; " + "; ".join(caveats)
    return [Hypothesis(
        category=category,
        priority=priority,
        title=title,
        evidence=proof,
        impact=_impact(100.0 - eff, "% of device time",
                       f"upper bound: at its roofline this work would take {eff:.2f}% of its "
                       f"current device time, so up to {100.0 - eff:.1f}% is headroom{note}")
        | {"upper_bound": True},
        details={"bound_by": bound, "ops_split": split, "caveats": caveats,
                 "operational_intensity_field": oi_field.split(".", 1)[1]},
    )]


def _memory(snapshot: Mapping[str, Any], metrics: Mapping[str, Any]) -> list[Hypothesis]:
    risk = metrics.get("oom_risk")
    peak, cap = metrics.get("peak_memory_gib"), metrics.get("memory_capacity_gib")
    if risk in ("HIGH", "MEDIUM") and peak is not None and cap:
        proof = [ev.cite(snapshot, "get_memory_profile", "peak_memory_usage_gib"),
                 ev.cite(snapshot, "get_memory_profile", "memory_capacity_gib")]
        _, mi = stepped_module(snapshot)
        buffer = f"modules[{mi}].top_buffers[0]"
        if ev.get(snapshot, "get_peak_allocations", buffer) is not None:
            proof.append(ev.cite(snapshot, "get_peak_allocations", buffer))
        return [Hypothesis(
            category="memory_pressure", priority="P0" if risk == "HIGH" else "P1",
            title=f"OOM risk {risk}: peak {peak:.2f} of {cap:.2f} GiB",
            evidence=proof,
            impact=_impact(peak, "GiB", f"{100.0 * peak / cap:.1f}% of device memory at peak"),
        )]
    if cap is None:
        ti, mi = stepped_module(snapshot)
        mib = ev.number(ev.get(snapshot, "get_peak_allocations",
                               f"summary.top_modules[{ti}].total_hbm_mib"))
        if mib is not None and mib / 1024.0 >= LARGE_MODULE_GIB:
            gib = mib / 1024.0
            proof = [ev.cite(snapshot, "get_peak_allocations",
                             f"summary.top_modules[{ti}].module_name"),
                     ev.cite(snapshot, "get_peak_allocations",
                             f"summary.top_modules[{ti}].total_hbm_mib")]
            buffer = f"modules[{mi}].top_buffers[0]"
            if ev.get(snapshot, "get_peak_allocations", buffer) is not None:
                proof.append(ev.cite(snapshot, "get_peak_allocations",
                                     f"modules[{mi}].top_buffers[0]"))
            return [Hypothesis(
                category="memory_pressure", priority="P1",
                title=f"Large live memory: {gib:.2f} GiB allocated by one compiled program",
                evidence=proof,
                impact=_impact(gib, "GiB", f"{gib:.2f} GiB of buffers live at the module's peak; "
                               "capacity is not in this profile, so OOM risk is unknown"),
            )]
    return []


def _detectors(snapshot: Mapping[str, Any]) -> list[Hypothesis]:
    """One hypothesis per executing op, with every detector's cause for it."""
    groups: dict[tuple[str, str], list[tuple[str, int, Mapping[str, Any]]]] = {}
    for tool in DETECTOR_CATEGORY:
        found = ev.get(snapshot, tool, "detections", []) or []
        for i, d in enumerate(found):
            if d.get("executed_in_profile") is False:
                continue
            groups.setdefault((str(d.get("module")), str(d.get("instruction"))), []).append(
                (tool, i, d))

    # A link of a chain is part of the chain's finding, not one of its own.
    for key in list(groups):
        for _, _, d in list(groups.get(key, [])):
            for member in d.get("chain") or ():
                other = (key[0], str(member))
                if other != key and other in groups:
                    groups[key] += groups.pop(other)

    def pct_of(d: Mapping[str, Any]) -> float | None:
        return ev.number(d.get("percent_of_step"))

    ranked = sorted(groups.values(), key=lambda g: -max(pct_of(d) or 0.0 for _, _, d in g))
    out = []
    per_category: dict[str, int] = {}
    for group in ranked:
        # The cause that costs most leads (a chain's sum beats its first link alone).
        tool, i, d = max(group, key=lambda t: pct_of(t[2]) or 0.0)
        category = DETECTOR_CATEGORY[tool]
        rank = per_category.get(category, 0)
        if rank >= 3:
            continue
        pct = pct_of(d)
        if pct is None:
            priority = "P2"
        else:
            # A fused transpose's share is its whole fusion's, an upper bound: below 1% it
            # is noise even when it is the only one.
            if pct < MATERIAL_DETECTOR_PERCENT and (rank > 0 or d.get("fused_with")):
                continue
            priority = _priority(pct, DETECTOR_P0_PERCENT, DETECTOR_P1_PERCENT)
            if d.get("fused_with") and priority == "P0":
                priority = "P1"  # the fusion's whole time bounds the transpose's, above
        per_category[category] = rank + 1
        fields = ["instruction", "module", "input_shape", "output_shape", "input_layout",
                  "output_layout", "time_ms", "percent_of_step"]
        proof = [ev.cite(snapshot, tool, f"detections[{i}].{f}") for f in fields if f in d]
        for k, link in enumerate(d.get("links") or []):
            if link.get("time_ms") is not None:
                proof.append(ev.cite(snapshot, tool, f"detections[{i}].links[{k}].time_ms"))
        causes = [{"category": DETECTOR_CATEGORY[t], "tool": t, "index": j,
                   "description": x.get("description", "")} for t, j, x in group]
        for other_tool, j, _ in group:
            if other_tool != tool:
                proof.append(ev.cite(snapshot, other_tool, f"detections[{j}].instruction"))
        labels = list(dict.fromkeys(_DETECTOR_TITLES[c["category"]] for c in causes))
        fused = list(d.get("fused_with") or ())
        if fused and tool == "detect_layout_mismatch_copies":
            labels[0] = f"Transpose fused into the {'/'.join(fused[:3])} kernel"
        # Without steps the op's time is a share of the capture window, not of a step.
        window = d.get("share_of") == "capture window"
        unit = "% of device time" if window else "% of step"
        share = (f"{pct:.1f}{unit}" if pct is not None else "time not measured")
        links = len(d.get("chain") or ())
        what = f"{links}-link chain from {d.get('instruction')}" if links > 1 else str(
            d.get("instruction"))
        out.append(Hypothesis(
            category=category, priority=priority,
            title=f"{' and '.join(labels)}: {what} ({share})",
            evidence=proof,
            impact=_impact(pct, unit,
                           f"{d.get('time_ms')} ms ({share}"
                           + (" over the capture window" if window else "")
                           + f") spent in {what}"
                           + (", the whole fusion's time: an upper bound on the transpose's"
                              if fused else "") if pct is not None else
                           "not found on the timeline; impact not measured"),
            details={"detection": d, "tool": tool, "index": i, "causes": causes,
                     "estimate": bool(fused)},
        ))
        if fused and pct is not None:
            out[-1].impact["upper_bound"] = True
    return out


CUSTOM_CALL_P1_PERCENT = 50.0
CUSTOM_CALL_REPORT_PERCENT = 10.0
_OP_PATH_CALL = re.compile(r"jit\((\w+)\)")


def custom_call_api(source: str, primitive: str) -> str:
    """The JAX function a custom call came from: the first `jit(name)` under the step's own
    jit in its op path (`jit(step)/jit(solve)/lu` → `solve`), else its primitive."""
    op_path = source.partition(" (")[2].rstrip(")") if " (" in source else source
    calls = [c for c in _OP_PATH_CALL.findall(op_path) if not c.startswith("_")]
    return calls[1] if len(calls) > 1 else primitive or (op_path.rsplit("/", 1)[-1])


def custom_call_share(snapshot: Mapping[str, Any]) -> tuple[float, list[int]] | None:
    """The timed custom calls' summed share of step (or window) time, and their indices."""
    calls = ev.get(snapshot, "detect_layout_mismatch_copies", "custom_calls", []) or []
    timed = [i for i, c in enumerate(calls) if isinstance(c, Mapping)
             and ev.number(c.get("percent_of_step")) is not None]
    if not timed:
        return None
    return sum(float(calls[i]["percent_of_step"]) for i in timed), timed


def _custom_calls(snapshot: Mapping[str, Any]) -> list[Hypothesis]:
    """Custom calls (LAPACK, cuSOLVER, FFI): what share of the time XLA cannot see into."""
    found = custom_call_share(snapshot)
    if found is None or found[0] < CUSTOM_CALL_REPORT_PERCENT:
        return []
    share, timed = found
    calls = ev.get(snapshot, "detect_layout_mismatch_copies", "custom_calls")
    tool = "detect_layout_mismatch_copies"
    proof = []
    for i in timed[:4]:
        proof += [ev.cite(snapshot, tool, f"custom_calls[{i}].{f}")
                  for f in ("instruction", "target", "time_ms", "percent_of_step", "source")
                  if calls[i].get(f) not in (None, "")]
    window = calls[timed[0]].get("share_of") == "capture window"
    unit = "% of device time" if window else "% of step"
    names = list(dict.fromkeys(
        custom_call_api(str(calls[i].get("source") or ""), str(calls[i].get("linalg") or ""))
        or str(calls[i].get("target")) for i in timed))
    return [Hypothesis(
        category="other",
        # A large share of opaque calls is worth the user's attention, but it measures no
        # waste: never P0, and its share is counted after the measured waste.
        priority="P1" if share >= CUSTOM_CALL_P1_PERCENT else "P2",
        title=(f"Custom calls ({', '.join(names[:4])}) take {share:.1f}"
               f"{unit}; XLA cannot fuse them and counts them as 0 FLOPs"),
        evidence=proof,
        impact=_impact(share, unit, f"{share:.1f}{unit} runs in {len(timed)} custom call(s) "
                       "whose efficiency this profile cannot judge (no FLOP count)"),
        details={"kind": "custom_calls", "estimate": True, "indices": timed,
                 "apis": names},
    )]


_DETECTOR_TITLES = {
    "layout_copy": "Layout-changing copy",
    "unfused_reshape": "Unfused reshape/transpose chain",
    "convert_reduce": "Low-precision tensor converted to f32 before a reduce",
}


def _suggestions(snapshot: Mapping[str, Any]) -> list[Hypothesis]:
    found = ev.get(snapshot, "get_smart_suggestions", "suggestions", []) or []
    out = []
    for i, s in enumerate(found[:3]):
        if not isinstance(s, Mapping):
            continue
        text = str(s.get("suggestion") or s.get("text") or s)
        key = next(iter(s.keys()), None)
        if key is None:
            continue
        out.append(Hypothesis(
            category="other", priority="P2", title=f"XProf suggestion: {text[:120]}",
            evidence=[ev.cite(snapshot, "get_smart_suggestions", f"suggestions[{i}].{key}")],
            impact=_impact(None, "% of step", "not quantified by XProf"),
            details={"suggestion": text},
        ))
    return out


def health_checks(snapshot: Mapping[str, Any], metrics: Mapping[str, Any],
                  found: list[Hypothesis]) -> tuple[list[dict[str, Any]], list[str]]:
    """The four OPTIMAL checks: each passes, fails, or could not be judged."""
    checks: list[dict[str, Any]] = []
    not_judged: list[str] = []
    cpu = _is_cpu(snapshot)
    hb = ev.get(snapshot, "get_step_trace", "host_bound_analysis", {}) or {}

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
                        if str(r.get("category")) in ("IDLE", *_TRANSFER_CATEGORIES,
                                                      *_COLLECTIVE_CATEGORIES))
            util = round(100.0 * (1.0 - waste), 2)
        else:
            util = ev.percent(ev.get(snapshot, "get_xprof_overview",
                                     "performance_summary.device_duty_cycle_percent"))
            util_source = "device duty cycle (get_xprof_overview)"
        if util is None and (metrics.get("device_idle_source") or "").startswith("timeline"):
            util = round(100.0 - float(metrics["device_idle_percent"]), 2)
            util_source = "busy share of the active span (timeline, get_step_trace)"
        if util is None:
            util = ev.number(ev.get(snapshot, "get_step_trace", "summary.compute_percent"))
            util_source = "compute share of step (get_step_trace)"
    checks.append(_check("compute utilization is high", util, util_source,
                         None if util is None else util >= HIGH_UTILIZATION_PERCENT,
                         f">= {HIGH_UTILIZATION_PERCENT:g}%"))

    overhead: float | None = None
    idle = metrics.get("device_idle_percent")
    comm_rows = _category_fraction(snapshot, _COLLECTIVE_CATEGORIES)
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
                         None if overhead is None else overhead <= LOW_OVERHEAD_PERCENT,
                         f"<= {LOW_OVERHEAD_PERCENT:g}%"))

    risk = metrics.get("oom_risk")
    if metrics.get("oom_risk_rule"):
        checks.append(_check("OOM risk is LOW", risk, str(metrics["oom_risk_rule"]),
                             None if risk in (None, "UNKNOWN") else risk == "LOW",
                             f"LOW (< {LARGE_MODULE_GIB:g} GiB live per program on CPU)"))
    else:
        checks.append(_check("OOM risk is LOW", risk,
                             "peak memory / capacity (get_memory_profile)",
                             None if risk in (None, "UNKNOWN") else risk == "LOW", "LOW"))

    det_tools = [t for t in DETECTOR_CATEGORY if ev.tool_data(snapshot, t) is not None]
    material = [h for h in found if h.category in DETECTOR_CATEGORY.values()
                and h.priority in ("P0", "P1")]
    checks.append(_check("no detector finding has a material impact", len(material),
                         "HLO detectors with a share of step (or, without steps, window) time",
                         None if not det_tools else not material,
                         f"0 findings >= {DETECTOR_P1_PERCENT:g}% of "
                         + ("step" if metrics.get("step_time_ms") is not None else
                            "device time (capture window)")))
    for c in checks:
        if c["passed"] is None:
            not_judged.append(f"{c['check']}: {c['why_unknown']}")
    idle_now = metrics.get("device_idle_percent")
    if metrics.get("roofline_efficiency_percent") is not None and idle_now is not None and (
            idle_now >= ROOFLINE_IDLE_LIMIT_PERCENT):
        not_judged.append(f"roofline bound: the device is idle {idle_now:.1f}% of the "
                          f"{metrics.get('judged_over') or 'window'}, so the bound of the "
                          "little work it does says nothing about the program (fix the idle "
                          "time first)")
    for caveat in roofline_caveats(snapshot):
        not_judged.append(f"roofline FLOP rate: {caveat}")
    calls = custom_call_share(snapshot)
    if calls is not None and calls[0] >= CUSTOM_CALL_REPORT_PERCENT and not roofline_caveats(
            snapshot):
        not_judged.append(f"custom-call efficiency: custom calls run {calls[0]:.1f}% of the "
                          f"{'step' if metrics.get('step_time_ms') is not None else 'window'} "
                          "and XLA's cost model counts them as 0 FLOPs, so no FLOP rate or "
                          "roofline bound is claimed for that time")
    if metrics.get("step_time_ms") is None:
        not_judged.append("step time: the trace has no step markers, so idle, utilization and "
                          "impacts are judged over the capture window (wrap each training step "
                          "in jax.profiler.StepTraceAnnotation to get per-step figures)")
    return checks, not_judged


def _check(name: str, value: Any, source: str, passed: bool | None, target: str) -> dict[str, Any]:
    why = ""
    if passed is None:
        why = f"no data ({source} unavailable in this profile)"
    return {"check": name, "value": value, "target": target, "source": source,
            "passed": passed, "why_unknown": why}


def triage(snapshot: Mapping[str, Any]) -> Triage:
    """Decide OPTIMAL vs NEEDS_ATTENTION and list the hypotheses for the investigator."""
    metrics = compute_metrics(snapshot)
    found = hypotheses(snapshot, metrics)
    checks, not_judged = health_checks(snapshot, metrics, found)
    # OPTIMAL needs positive evidence that the device computes (the utilization check) and no
    # failed check or P0/P1 hypothesis. A check without data is listed as not judged; on its
    # own it does not turn a healthy profile into NEEDS_ATTENTION.
    healthy = (checks[0]["passed"] is True
               and not any(c["passed"] is False for c in checks)
               and not any(h.priority in ("P0", "P1") for h in found))
    return Triage(
        status=OPTIMAL if healthy else NEEDS_ATTENTION,
        metrics=metrics, checks=checks, not_judged=not_judged, hypotheses=found,
    )
