"""The one reading of a session: a typed, read-only view of its health snapshot.

Built once (`read_session`) and passed down: triage, the rules, the investigators, the report
and the console read the device kind, the steps (or window), the per-host figures, each
headline metric (with its unit and provenance) and the tool results from it, instead of each
reading the raw snapshot its own way. The raw snapshot stays reachable (`snapshot`) for what
only it has: the field paths that evidence cites.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.readings import (
    LARGE_MODULE_GIB,
    idle_sources,
    short_window,
    stepped_module,
)
from mldiag.analysis.judgement.roofline import judged_roofline_efficiency, roofline_efficiency

DeviceKind = Literal["TPU", "GPU", "CPU", "unknown"]

CPU_MEMORY_RULE = (f"CPU: no device capacity in the profile; LOW when the live buffers of the "
                   f"largest compiled program that ran in the measured steps (or, without "
                   f"steps, in the capture) are under {LARGE_MODULE_GIB:g} GiB")

# The OOM-risk shares of capacity.
OOM_HIGH_SHARE = 0.9
OOM_MEDIUM_SHARE = 0.75


@dataclass(frozen=True)
class ToolResult:
    """One collection tool's (or mldiag pass's) result: DATA, NO_DATA or ERROR."""

    name: str
    status: str
    data: Any = None
    reason: str | None = None
    error: str | None = None

    @property
    def has_data(self) -> bool:
        return self.status == "DATA" and self.data is not None


@dataclass(frozen=True)
class Metric:
    """One headline figure, once: its value, unit and who made it (an xprof tool and field,
    or mldiag's own pass), and what it covers."""

    name: str
    value: Any
    unit: str
    source: str | None
    over: str | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "unit": self.unit, "source": self.source,
                "over": self.over, "note": self.note}


@dataclass(frozen=True)
class Steps:
    """What the per-step figures are averaged over: `count` measured steps (0: the trace has
    no step markers, and figures cover the capture window)."""

    count: int
    step_time_ms: float | None
    spread: Mapping[str, Any] | None = None
    excluded: tuple[Mapping[str, Any], ...] = ()
    # (window ms, op executions) of a capture with no steps that is a micro-benchmark.
    short_window: tuple[float, int | None] | None = None

    @property
    def basis(self) -> str:
        return "steps" if self.count else "capture window"

    @property
    def one_step(self) -> bool:
        """A single measured step: its figures are one sample, not an average."""
        return self.count == 1

    @property
    def micro_benchmark(self) -> bool:
        return self.short_window is not None


@dataclass(frozen=True)
class DeviceFigures:
    """One device's idle share of its host's active span: mldiag's own figure
    (`mldiag.timeline per_host[i].devices[j]`), since xprof states idle only for all devices
    together (the pass's `device_idle_basis` says why)."""

    name: str
    idle_percent: float | None


@dataclass(frozen=True)
class HostFigures:
    """One host's figures from mldiag's timeline pass (`mldiag.timeline per_host[i]`)."""

    name: str
    busy_percent: float | None
    active_span_ms: float | None
    devices: tuple[DeviceFigures, ...] = ()
    idle_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Straggler:
    """A host the others wait for at the collectives (`mldiag.timeline pod.stragglers[i]`)."""

    index: int
    host: str
    lateness_ms: float
    others_wait_ms: float
    others_wait_percent: float | None
    cause: str
    cause_excess_ms: float
    session_step_ms: float
    session_step_ms_if_median: float
    function: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class PodFigures:
    """The hosts side by side (`mldiag.timeline pod`, `collection/hosts/pod.py`): present for a
    session of two or more hosts with steps."""

    hosts: int
    common_steps: int
    stragglers: tuple[Straggler, ...]
    # Of the collectives' time on every host, the share spent waiting for the last arrival.
    wait_percent: float | None
    transfer_ms_per_step: float | None
    hosts_with_other_steps: tuple[str, ...]
    # Hosts of the session left out (unreadable, never arrived, their pass failed): why.
    failed_hosts: Mapping[str, str] = field(default_factory=dict)
    data: Mapping[str, Any] = field(repr=False, default_factory=dict)

    @property
    def unit(self) -> str:
        """What the hosts were compared over: "step", or "round" (between executions of a
        collective, for hosts without step annotations)."""
        return str(self.data.get("unit") or "step")

    @property
    def waiting_dominates(self) -> bool:
        return self.wait_percent is not None and self.wait_percent >= 50.0

    def to_dict(self) -> dict[str, Any]:
        """analysis.json's `hosts` section: the pass's per-host table, stragglers, collective
        split and heat map, and how they were computed."""
        keep = ("method", "hosts", "unit", "marker", "common_steps", "steps_matched_by",
                "step_ranges",
                "hosts_with_other_steps", "note", "clock_offsets_ms", "median_step_ms", "per_host",
                "per_host_rest",
                "collective_split", "straggler_test", "stragglers", "heat_map")
        return {k: self.data[k] for k in keep if k in self.data} | (
            {"failed_hosts": dict(self.failed_hosts)} if self.failed_hosts else {})


@dataclass(frozen=True)
class SessionReading:
    """The typed view of one health snapshot (see the module docstring)."""

    device: DeviceKind
    device_type: str
    hosts: tuple[str, ...]
    host_figures: tuple[HostFigures, ...]
    steps: Steps
    metrics: Mapping[str, Metric]
    tools: Mapping[str, ToolResult]
    snapshot: Mapping[str, Any] = field(repr=False)
    # The analysis.json `metrics` block: each metric's value and the fields that say where it
    # came from (the contract's names, kept as they were).
    values: Mapping[str, Any] = field(repr=False, default_factory=dict)
    # The hosts side by side, for two or more hosts with steps.
    pod: PodFigures | None = None

    @property
    def cpu(self) -> bool:
        return self.device == "CPU"

    @property
    def gpu(self) -> bool:
        return self.device == "GPU"

    @property
    def tpu(self) -> bool:
        return self.device == "TPU"

    @property
    def judgeable(self) -> bool:
        """Whether any device or host work was measured at all: a step time, an idle share, a
        roofline or a memory figure."""
        return any(self.values.get(k) is not None for k in (
            "step_time_ms", "device_idle_percent", "roofline_efficiency_percent",
            "peak_memory_gib"))

    def value(self, name: str) -> Any:
        return self.values.get(name)

    def entry(self, tool: str) -> Mapping[str, Any]:
        """A tool's (or pass's) result as the snapshot files it, `{name, status, data, error}`
        (NO_DATA's data holds its reason); {} when it was not collected."""
        result = self.tools.get(tool)
        if result is None:
            return {}
        data = result.data if result.has_data else (
            {"reason": result.reason} if result.reason else {})
        return {"name": result.name, "status": result.status, "data": data,
                **({"error": result.error} if result.error else {})}

    def data(self, tool: str) -> Any:
        """A tool's (or pass's) data when its status is DATA, else None."""
        return ev.tool_data(self.snapshot, tool)

    def get(self, tool: str, path: str, default: Any = None) -> Any:
        return ev.get(self.snapshot, tool, path, default)

    def cite(self, tool: str, path: str) -> dict[str, Any]:
        return ev.cite(self.snapshot, tool, path)

    def to_dict(self) -> dict[str, Any]:
        """The reading as analysis.json carries it (`reading`): what the console, the CLI and a
        model read without the snapshot."""
        return {
            "device": self.device, "device_type": self.device_type,
            "hosts": list(self.hosts),
            "steps": {"count": self.steps.count, "basis": self.steps.basis,
                      "one_step": self.steps.one_step,
                      "micro_benchmark": self.steps.micro_benchmark},
            "host_figures": [
                {"host": h.name, "busy_percent": h.busy_percent,
                 "active_span_ms": h.active_span_ms, "devices": len(h.devices),
                 "idle_devices": list(h.idle_devices),
                 "device_idle_percent": {d.name: d.idle_percent for d in h.devices
                                         if d.idle_percent is not None}}
                for h in self.host_figures],
            "metrics": {name: m.to_dict() for name, m in self.metrics.items()},
            "tools": {name: {"status": t.status} | ({"reason": t.reason} if t.reason else {})
                      for name, t in self.tools.items()},
        }


def device_kind(snapshot: Mapping[str, Any], hint: str | None = None
                ) -> tuple[DeviceKind, str]:
    """(kind, the profile's own name for it): decided here and nowhere else. xprof's run
    environment first, then the session, the device information, the KPI metrics, and last
    `hint` (the device type an analysis.json recorded, for a snapshot that names none)."""
    candidates = [
        ev.get(snapshot, "get_xprof_overview", "run_environment.device_type"),
        (snapshot.get("session") or {}).get("device_type"),
        ev.get(snapshot, "get_device_information", "device_type"),
        ev.get(snapshot, "get_kpi_metrics", "accelerator_info.device_type"),
        hint,
    ]
    named = [str(c).strip() for c in candidates if isinstance(c, str) and str(c).strip()]
    for text in named:
        upper = text.upper()
        if "TPU" in upper:
            return "TPU", text
        if "GPU" in upper or any(v in upper for v in ("NVIDIA", "AMD INSTINCT", "MI300",
                                                      "MI355")):
            return "GPU", text
        if "CPU" in upper:
            return "CPU", text
    return "unknown", named[0] if named else ""


def _tools(snapshot: Mapping[str, Any]) -> Mapping[str, ToolResult]:
    out: dict[str, ToolResult] = {}
    for name, entry in (snapshot.get("tools") or {}).items():
        if not isinstance(entry, Mapping):
            continue
        data = entry.get("data")
        # Why a tool has no data, in its own words (older snapshots: `message` or `info`).
        reason = next((data[k] for k in ("reason", "message", "info")
                       if str(data.get(k) or "").strip()), None) if isinstance(
            data, Mapping) and entry.get("status") != "DATA" else None
        out[str(name)] = ToolResult(str(name), str(entry.get("status") or ""),
                                    data if entry.get("status") == "DATA" else None,
                                    str(reason) if reason else None,
                                    str(entry["error"]) if entry.get("error") else None)
    for name, entry in ev.passes(snapshot).items():
        out.setdefault(name, ToolResult(name, str(entry.get("status") or ""),
                                        entry.get("data") if entry.get("status") == "DATA"
                                        else None, None,
                                        str(entry["error"]) if entry.get("error") else None))
    return MappingProxyType(out)


def _hosts(snapshot: Mapping[str, Any]) -> tuple[HostFigures, ...]:
    hb = ev.tool_data(snapshot, ev.TIMELINE) or {}
    out = []
    for i, h in enumerate(hb.get("per_host") or []):
        if not isinstance(h, Mapping):
            continue
        out.append(HostFigures(
            str(h.get("host") or h.get("hostname") or f"host {i}"),
            ev.number(h.get("busy_in_active_span_percent")), ev.number(h.get("active_span_ms")),
            tuple(_device(d) for d in h.get("devices") or ()),
            tuple(str(d) for d in h.get("idle_devices") or ())))
    return tuple(out)


def _device(entry: Any) -> DeviceFigures:
    """A device of the timeline's per-host list: a name (older snapshots) or its figures."""
    if isinstance(entry, Mapping):
        return DeviceFigures(str(entry.get("device") or ""),
                             ev.number(entry.get("idle_in_active_span_percent")))
    return DeviceFigures(str(entry), None)


def oom_risk(peak: float | None, capacity: float | None) -> str:
    if peak is None or capacity is None or capacity <= 0:
        return "UNKNOWN"
    ratio = peak / capacity
    return "HIGH" if ratio >= OOM_HIGH_SHARE else "MEDIUM" if ratio >= OOM_MEDIUM_SHARE else "LOW"


def _values(snapshot: Mapping[str, Any], cpu: bool) -> dict[str, Any]:
    """The headline metrics of analysis.json, each read from a tool output (None if absent)."""
    hb = ev.tool_data(snapshot, ev.TIMELINE) or {}
    # Our timeline's steps are the denominator of every per-step figure in the report, so the
    # headline step time comes from the same steps (xprof's step trace may drop some).
    step = ev.number(hb.get("step_time_ms_average")) if hb.get("steps_analyzed") else None
    step_source = "mldiag.timeline step_time_ms_average" if step else None
    if not step:
        step = ev.number(ev.get(snapshot, "get_step_trace", "summary.step_time_ms_average"))
        step_source = "get_step_trace summary.step_time_ms_average" if step else None
    if not step:
        step = ev.number(ev.get(snapshot, "get_xprof_overview",
                                "performance_summary.steptime_ms_average")) or None
        step_source = ("get_xprof_overview performance_summary.steptime_ms_average"
                       if step else None)
    sources = idle_sources(snapshot, cpu)
    chosen = sources[0] if sources else None
    idle = chosen.value if chosen else None
    roofline = judged_roofline_efficiency(snapshot)
    xprof_roofline = roofline_efficiency(snapshot)
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
    capacity_source = "get_memory_profile memory_capacity_gib" if capacity else None
    capacity_note = None
    allocator = _peak_allocator(snapshot)
    if source == "get_memory_profile" and allocator is not None:
        # XProf's Memory Profile page (its memory_profile converter) gives each allocator its
        # own capacity; `xprof get_memory_profile` prints the peak allocator's peak beside the
        # largest capacity of any allocator (a GPU's host pool: 64 GiB beside a 14.41 GiB
        # device). The peak is judged against its own allocator's capacity.
        own = ev.number(allocator.get("memory_capacity_gib"))
        if own:
            cli, capacity = capacity, own
            capacity_source = (f"{ev.MEMORY_ALLOCATORS} peak.memory_capacity_gib (XProf's "
                               f"memory profile, allocator {allocator.get('memory_id')})")
            if cli and abs(cli - own) > 0.005:
                capacity_note = (f"`xprof get_memory_profile` prints {cli:g} GiB: the largest "
                                 "capacity of any allocator, not the one that peaked")
            if allocator.get("capacity_is_stack_heap_free") is False:
                capacity_note = ((capacity_note + "; ") if capacity_note else "") + (
                    "its stack + heap + free does not add up to it")
    if capacity is not None and capacity <= 0:
        capacity = None
    risk = oom_risk(peak, capacity)
    rule = None
    if cpu and capacity is None and peak is not None:
        # XLA:CPU buffers live in host RAM, whose size the profile does not record: the stated
        # rule judges the live buffers of the largest compiled program instead.
        rule = CPU_MEMORY_RULE
        risk = "LOW" if peak < LARGE_MODULE_GIB else "UNKNOWN"
    steps_analyzed = int(ev.number(hb.get("steps_analyzed")) or 0)
    return {
        "step_time_ms": round(step, 3) if step else None,
        "device_idle_percent": round(idle, 2) if idle is not None else None,
        "roofline_efficiency_percent": roofline,
        # Where roofline_efficiency_percent comes from: xprof's program row, or that row
        # with shape-derived custom-call FLOPs counted once per call (see roofline.py).
        "roofline_efficiency_basis": None if roofline is None else (
            "get_roofline_model program.roofline_efficiency_percent" if roofline == xprof_roofline
            else f"mldiag.roofline: xprof's {xprof_roofline}% counts one call's shape-derived "
                 "FLOPs of each custom call against all its calls' time; recounted per call "
                 "from the op profile's occurrences"),
        "peak_memory_gib": peak,
        "memory_capacity_gib": capacity,
        # Whose capacity it is (XProf's memory profile, per allocator), and what disagrees.
        "memory_capacity_source": capacity_source if capacity is not None else None,
        "memory_capacity_note": capacity_note,
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
        # Compile and warm-up steps inside the window, left out of every step figure.
        "steps_excluded": list(hb.get("excluded_steps") or []) if hb.get("steps_analyzed")
        else [],
        # Where the step time came from, and over how many steps (1: one sample, no average).
        "step_time_source": step_source,
        "steps_measured": _steps_count(snapshot, steps_analyzed) if step else 0,
    }


def _peak_allocator(snapshot: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The allocator that peaked, as XProf's memory profile has it (mldiag.memory_allocators
    `peak`), or None."""
    found = ev.get(snapshot, ev.MEMORY_ALLOCATORS, "peak")
    return found if isinstance(found, Mapping) else None


def _steps_count(snapshot: Mapping[str, Any], analyzed: int) -> int:
    if analyzed:
        return analyzed
    steps = int(ev.number(ev.get(snapshot, "get_step_trace", "summary.total_steps")) or 0)
    return steps


def _metrics(values: Mapping[str, Any]) -> Mapping[str, Metric]:
    over = str(values.get("judged_over") or "capture window")
    idle_over = str(values.get("device_idle_window") or over)
    out = {
        "step_time_ms": Metric(
            "step_time_ms", values.get("step_time_ms"), "ms", values.get("step_time_source"),
            "steps", "one step: a single sample, not an average"
            if values.get("steps_measured") == 1 else None),
        "device_idle_percent": Metric(
            "device_idle_percent", values.get("device_idle_percent"),
            "% of step" if idle_over == "steps" else "% of the capture window",
            values.get("device_idle_source"), idle_over),
        "roofline_efficiency_percent": Metric(
            "roofline_efficiency_percent", values.get("roofline_efficiency_percent"),
            "% of the program's attainable FLOP rate", values.get("roofline_efficiency_basis"),
            "the program (all its ops, over the profiled time)"),
        "peak_memory_gib": Metric(
            "peak_memory_gib", values.get("peak_memory_gib"), "GiB",
            values.get("peak_memory_source"), None,
            "live buffers of the largest compiled program (its buffer assignment, not a "
            "runtime peak)" if values.get("peak_memory_source") == "get_peak_allocations"
            else None),
        "memory_capacity_gib": Metric(
            "memory_capacity_gib", values.get("memory_capacity_gib"), "GiB",
            values.get("memory_capacity_source"), None, values.get("memory_capacity_note")),
        "oom_risk": Metric("oom_risk", values.get("oom_risk"), "level",
                           values.get("oom_risk_rule") or "peak memory / capacity"),
    }
    return MappingProxyType(out)


def read_session(snapshot: Mapping[str, Any], device_hint: str | None = None
                 ) -> SessionReading:
    """Read a health snapshot once into its typed view (`device_hint`: see `device_kind`)."""
    kind, device_type = device_kind(snapshot, device_hint)
    values = _values(snapshot, kind == "CPU")
    steps = Steps(
        count=int(values.get("steps_measured") or 0),
        step_time_ms=values.get("step_time_ms"),
        spread=values.get("step_time_spread"),
        excluded=tuple(values.get("steps_excluded") or ()),
        short_window=short_window(snapshot),
    )
    session = snapshot.get("session") or {}
    return SessionReading(
        device=kind, device_type=device_type,
        hosts=tuple(str(h) for h in session.get("hosts") or ()),
        host_figures=_hosts(snapshot), steps=steps, metrics=_metrics(values),
        tools=_tools(snapshot), snapshot=snapshot, values=MappingProxyType(values),
        pod=_pod(snapshot))


def _pod(snapshot: Mapping[str, Any]) -> PodFigures | None:
    pod = ev.get(snapshot, ev.TIMELINE, "pod")
    if not isinstance(pod, Mapping) or not pod.get("common_steps"):
        return None
    split = pod.get("collective_split") or {}
    stragglers = tuple(
        Straggler(index=i, host=str(s["host"]),
                  lateness_ms=float(s["lateness_ms_per_step"]),
                  others_wait_ms=float(s["others_wait_ms_per_step"]),
                  others_wait_percent=ev.number(s.get("others_wait_percent_of_step")),
                  cause=str(s["cause"]), cause_excess_ms=float(s["cause_excess_ms_per_step"]),
                  session_step_ms=float(s["session_step_ms"]),
                  session_step_ms_if_median=float(s["session_step_ms_if_median"]),
                  function=s.get("function"))
        for i, s in enumerate(pod.get("stragglers") or ()))
    session = snapshot.get("session") or {}
    failed = {str(h): str(r) for h, r in (session.get("unreadable_hosts") or {}).items()}
    failed |= {str(h): str(r) for h, r in
               ((session.get("capture") or {}).get("failed_hosts") or {}).items()}
    for line in pod.get("failed_hosts") or ():
        host, _, reason = str(line).partition(": ")
        failed.setdefault(host, reason)
    return PodFigures(
        failed_hosts=failed,
        hosts=int(pod["hosts"]), common_steps=int(pod["common_steps"]), stragglers=stragglers,
        wait_percent=ev.number(split.get("wait_percent")),
        transfer_ms_per_step=ev.number(split.get("transfer_ms_per_step")),
        hosts_with_other_steps=tuple(str(h) for h in pod.get("hosts_with_other_steps") or ()),
        data=pod)


def reading_of(source: Mapping[str, Any] | SessionReading) -> SessionReading:
    """The reading of `source`: itself, or read from a snapshot (callers that still hold a
    snapshot read it here, once, and pass the reading on)."""
    return source if isinstance(source, SessionReading) else read_session(source)
