"""Step-level timeline analysis straight from the xplanes.

xprof's `check_host_boundness` says NOT_HOST_BOUND on every CPU profile (its thresholds are TPU
counters), and its step breakdown books all CPU execution as idle. We measure it ourselves:
for each annotated step, how much of the wall time had device (or XLA:CPU) work running.
"""

from __future__ import annotations

import ctypes
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Lines of device planes that summarise other lines rather than record execution.
_SUMMARY_LINES = frozenset(
    {
        "Steps",
        "XLA Modules",
        "Framework Ops",
        "Framework Name Scope",
        "Source code",
        "XLA TraceMe",
        "TensorFlow Name Scope",
        "TensorFlow Ops",
        "Launch Stats",
        "SparseCore Steps",
    }
)
_CPU_XLA_LINE_PREFIXES = ("tf_XLA",)
_MARKER_PREFIXES = ("ThreadpoolListener::",)


@dataclass
class HostTimeline:
    """Step and busy-time figures for one host (one xplane)."""

    host: str
    source: str = ""
    steps: list[tuple[float, float]] = field(default_factory=list)
    busy_per_step_ns: list[float] = field(default_factory=list)
    # Keyed by (program_id, HLO op name); program_id is "" when the event does not carry one.
    op_time_ns: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    op_count: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    active_span_ns: float = 0.0
    busy_in_span_ns: float = 0.0


def _is_runtime_event(name: str) -> bool:
    # Runtime bookkeeping on the execution threads ("SlinkyThreadPool::Await", "end: fusion"),
    # not HLO ops: it counts as busy time but is not an op to attribute.
    return "::" in name or name.startswith("end: ")


def _hlo_name(event_name: str) -> str:
    # TPU timelines name events by the full HLO text: "%copy-done.2 = f32[...] copy-done(...)".
    if event_name.startswith("%") and " = " in event_name:
        return event_name[1:].split(" = ", 1)[0]
    return event_name


def _program_id(stats: Any) -> str:
    for k, v in stats:
        if k == "program_id":
            return str(v)
    return ""


def _union_length(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    total = 0.0
    cur_s: float | None = None
    cur_e = 0.0
    for s, e in intervals:
        s, e = max(s, lo), min(e, hi)
        if e <= s:
            continue
        if cur_s is None or s > cur_e:
            if cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_s is not None:
        total += cur_e - cur_s
    return total


def _events(line: Any) -> Iterator[tuple[str, float, float, int]]:
    """(name, start_ns, duration_ns, handle) of each event on a line.

    Straight through xprof's C API: `ProfileLine.events` builds a Python object with a
    weakref finalizer per event, which costs more than the analysis itself on large traces.
    The handle is valid only until the next iteration.
    """
    lib = _native()
    handle = line._handle
    for i in range(lib.profile_line_num_events(handle)):
        ev = lib.profile_line_get_event(handle, i)
        try:
            raw = lib.profile_event_name(ev)
            name = raw.decode("utf-8", errors="replace") if raw else ""
            yield name, lib.profile_event_start_ns(ev), lib.profile_event_duration_ns(ev), ev
        finally:
            lib.profile_event_free(ev)


def _event_stats(ev: int) -> Iterator[tuple[str, str]]:
    lib = _native()
    for i in range(lib.profile_event_num_stats(ev)):
        name_p, val_p = ctypes.c_char_p(), ctypes.c_char_p()
        lib.profile_event_get_stat(ev, i, ctypes.byref(name_p), ctypes.byref(val_p))
        yield ((name_p.value or b"").decode("utf-8", errors="replace"),
               (val_p.value or b"").decode("utf-8", errors="replace"))


def _native() -> Any:
    from xprof import profile_data

    return profile_data._lib


def _step_events(planes: Any) -> list[tuple[float, float]]:
    steps: list[tuple[float, float]] = []
    for plane in planes:
        if not plane.name.startswith("/host:"):
            continue
        for line in plane.lines:
            # Reading stats costs native calls per event: decide per event name, from its
            # first occurrence on the line, whether it is a step annotation (has step_num).
            is_step: dict[str, bool] = {}
            for name, start, dur, ev in _events(line):
                flag = is_step.get(name)
                if flag is None:
                    flag = is_step[name] = any(k == "step_num" for k, _ in _event_stats(ev))
                if flag and dur > 0:
                    steps.append((start, start + dur))
    steps.sort()
    # Nested annotations of the same step (e.g. two StepTraceAnnotations) count once.
    outer: list[tuple[float, float]] = []
    for s, e in steps:
        if outer and s < outer[-1][1]:
            continue
        outer.append((s, e))
    return outer


def _compute_lines(planes: Any) -> tuple[str, list[Any]]:
    device_lines = []
    for plane in planes:
        if plane.name.startswith("/device:") and "CUSTOM" not in plane.name:
            lines = list(plane.lines)
            xla_ops = [ln for ln in lines if ln.name == "XLA Ops"]
            device_lines.extend(xla_ops or [ln for ln in lines if ln.name not in _SUMMARY_LINES])
    if device_lines:
        return "device", device_lines
    cpu_lines: list[Any] = []
    for plane in planes:
        if plane.name.startswith("/host:CPU"):
            cpu_lines.extend(
                ln for ln in plane.lines if ln.name.startswith(_CPU_XLA_LINE_PREFIXES)
            )
    return "xla_cpu", cpu_lines


def analyze_host(path: Path, host: str) -> HostTimeline:
    """Measure steps and busy time in one xplane file."""
    from xprof.profile_data import ProfileData

    result = HostTimeline(host=host)
    with ProfileData.from_file(str(path)) as data:
        planes = data.planes
        result.steps = _step_events(planes)
        source, lines = _compute_lines(planes)
        result.source = source
        intervals: list[tuple[float, float]] = []
        for line in lines:
            for name, start, dur, ev in _events(line):
                if dur <= 0 or name.startswith(_MARKER_PREFIXES):
                    continue
                intervals.append((start, start + dur))
                if _is_runtime_event(name):
                    continue
                # Device ops are attributed through xprof's op profile; only XLA:CPU events
                # need their program to tell same-named ops of different modules apart.
                program = _program_id(_event_stats(ev)) if source == "xla_cpu" else ""
                key = (program, _hlo_name(name))
                result.op_time_ns[key] += dur
                result.op_count[key] += 1
    intervals.sort()
    if intervals:
        lo, hi = intervals[0][0], max(e for _, e in intervals)
        result.active_span_ns = hi - lo
        result.busy_in_span_ns = _union_length(intervals, lo, hi)
    result.busy_per_step_ns = [_union_length(intervals, s, e) for s, e in result.steps]
    return result


def _round(x: float, nd: int = 3) -> float:
    return round(float(x), nd)


def summarize(hosts: list[HostTimeline], top_n: int = 25) -> dict[str, Any]:
    """The JSON block we attach to the step-trace tool result as `host_bound_analysis`."""
    per_host = []
    all_steps_ms: list[float] = []
    all_busy_ms: list[float] = []
    op_time: dict[tuple[str, str], float] = defaultdict(float)
    op_count: dict[tuple[str, str], int] = defaultdict(int)
    for h in hosts:
        steps_ms = [(e - s) / 1e6 for s, e in h.steps]
        busy_ms = [b / 1e6 for b in h.busy_per_step_ns]
        all_steps_ms.extend(steps_ms)
        all_busy_ms.extend(busy_ms)
        for k, v in h.op_time_ns.items():
            op_time[k] += v
            op_count[k] += h.op_count[k]
        host_step = sum(steps_ms) / len(steps_ms) if steps_ms else None
        host_busy = sum(busy_ms) / len(busy_ms) if busy_ms else None
        host_wait = (100.0 * (host_step - host_busy) / host_step
                     if host_step and host_busy is not None else None)
        per_host.append(
            {
                "host": h.host,
                "compute_source": h.source,
                "steps": len(steps_ms),
                "host_wait_percent": _round(host_wait, 2) if host_wait is not None else None,
                "step_time_ms_average": _round(host_step) if host_step is not None else None,
                "compute_busy_ms_average": _round(host_busy) if host_busy is not None else None,
                "active_span_ms": _round(h.active_span_ns / 1e6),
                "busy_in_active_span_percent": _round(
                    100.0 * h.busy_in_span_ns / h.active_span_ns, 2
                )
                if h.active_span_ns
                else None,
            }
        )
    n_steps = len(all_steps_ms)
    total_step = sum(all_steps_ms)
    total_busy = sum(all_busy_ms)
    step_avg = total_step / n_steps if n_steps else None
    busy_avg = total_busy / n_steps if n_steps else None
    wait_pct = 100.0 * (total_step - total_busy) / total_step if total_step > 0 else None
    per_step_wait = [
        100.0 * (s - b) / s for s, b in zip(all_steps_ms, all_busy_ms, strict=True) if s > 0
    ]
    steps_mostly_waiting = sum(1 for w in per_step_wait if w >= 50.0)
    # Per-step op time, so the detectors can state a share of step time without an op profile.
    denom = n_steps if n_steps else 1
    top_ops = sorted(op_time.items(), key=lambda kv: (-kv[1], kv[0]))[:top_n]
    return {
        "method": (
            "mldiag: per annotated step, wall time vs the union of execution events on "
            + ("device XLA op lines" if any(h.source == "device" for h in hosts) else
               "XLA:CPU runtime threads (tf_XLA*)")
        ),
        "compute_source": hosts[0].source if hosts else "",
        "steps_analyzed": n_steps,
        "step_time_ms_average": _round(step_avg) if step_avg is not None else None,
        "compute_busy_ms_average": _round(busy_avg) if busy_avg is not None else None,
        "host_wait_ms_average": _round(step_avg - busy_avg)
        if step_avg is not None and busy_avg is not None
        else None,
        "host_wait_percent": _round(wait_pct, 2) if wait_pct is not None else None,
        "steps_mostly_waiting": steps_mostly_waiting,
        "per_host": per_host,
        "op_time_per_step": [
            {
                "op": name,
                "program_id": program,
                "ms_per_step": _round(t / 1e6 / denom, 4),
                "count": op_count[(program, name)],
                "percent_of_step": _round(100.0 * t / 1e6 / total_step, 2) if total_step else None,
            }
            for (program, name), t in top_ops
        ],
        "op_time_ms_by_program": _by_program(op_time, denom),
    }


def _by_program(op_time: dict[tuple[str, str], float], denom: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (program, name), t in sorted(op_time.items()):
        out[program][name] = _round(t / 1e6 / denom, 4)
    return dict(out)


def analyze(xplanes: list[tuple[Path, str]]) -> dict[str, Any]:
    """Analyse every host of a session; `xplanes` holds (path, host) pairs."""
    return summarize([analyze_host(p, h) for p, h in xplanes])
