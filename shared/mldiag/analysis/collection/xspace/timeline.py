"""Step-level timeline analysis straight from the xplanes.

xprof's `check_host_boundness` says NOT_HOST_BOUND on every CPU profile (its thresholds are TPU
counters), and its step breakdown books all CPU execution as idle. We measure it ourselves:
for each annotated step, how much of the wall time had device (or XLA:CPU) work running.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mldiag.analysis.collection.xspace import collectives
from mldiag.analysis.collection.xspace.scan import Line, Plane, XSpaceScan, unique_ids

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
# Host events of compilation: JAX's Python frames (`$compiler.py:436 compile_or_get_cached`,
# `$pxla.py:1229 compile`, `backend_compile`), XLA's TraceMes (`FusionCompiler::Compile`,
# `XlaCompile`, a PJRT client's `Compile`).
_COMPILE_EVENT = re.compile(
    r"compile_or_get_cached|backend_compile|_compile_and_write_cache|_cached_compilation|"
    r"\.py:\d+ compile$|FusionCompiler::Compile|XlaCompile|PjRt\w*::Compile|"
    r"^jit_\w+.*[Cc]ompil")
# A leading step this many times the median of the others is warm-up even without a compile
# event (first-call allocation, autotuning, cache fill).
WARMUP_STEP_FACTOR = 2.0
# ... but only while at least this many steps follow it: a short window (Tunix's
# `profile_steps=range(10, 13)`, a 2 s capture of slow steps) is all the evidence there is,
# and a median of one or two steps cannot say that a step before them is an outlier.
WARMUP_MIN_AFTER = 3
# A step with compilation over this share of its wall time is a compile step.
COMPILE_STEP_SHARE = 0.10
_MARKER_PREFIXES = ("ThreadpoolListener::",)



@dataclass
class HostTimeline:
    """Step and busy-time figures for one host (one xplane)."""

    host: str
    source: str = ""
    # One row per step: (start_ns, end_ns).
    steps: NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, 2)))
    busy_per_step_ns: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    # Keyed by (program_id, HLO op name); program_id is "" when the event does not carry one.
    op_time_ns: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    op_count: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    # How many executions of the op overlapped at most (8 devices running an all-gather at
    # once: 8; one device whose ops alternate between two threads: 1). Its time summed over
    # every line, divided by this, is one executor's (one device's).
    op_lines: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    active_span_ns: float = 0.0
    busy_in_span_ns: float = 0.0
    events_scanned: int = 0
    # Per device plane: (name, busy ns, events); a device that ran nothing has 0 events.
    devices: list[tuple[str, float, int]] = field(default_factory=list)
    # XLA:CPU program ids with an op starting inside an annotated step: the programs the
    # measured steps ran (a setup program run before the first step is not one of them).
    programs_in_steps: set[str] = field(default_factory=set)
    # Compile and warm-up steps inside the window, left out of `steps` and every step figure:
    # {step_index (in the window), step_time_ms, compile_ms, reason}.
    excluded_steps: list[dict[str, Any]] = field(default_factory=list)
    # The first start and last end of the active span (ns; 0 when nothing ran): what time
    # windows of one host need to combine their spans (`combine_windows`).
    active_from_ns: float = 0.0
    active_to_ns: float = 0.0
    # Per step (aligned with `steps`): the step number its annotation carries (-1: none), and
    # how much of the step had a collective running (union over the compute lines).
    step_numbers: list[int] = field(default_factory=list)
    collective_per_step_ns: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    # Every collective execution inside a step, one row per (step index, op, occurrence of
    # the op in that step), its start and end averaged over the host's executors (devices):
    # what the cross-host pass (`hosts.pod`) matches across hosts. At most MAX_INSTANCES.
    collective_instances: collectives.CollectiveInstances = field(
        default_factory=lambda: collectives.CollectiveInstances.empty())
    # The union of the collectives' executions over the whole capture (ns): what the
    # cross-host pass reads when the host has no annotated steps.
    collective_busy_ns: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-able copy, so one host's pass can run elsewhere and be combined later."""
        return {"host": self.host, "source": self.source, "steps": self.steps.tolist(),
                "busy_per_step_ns": self.busy_per_step_ns.tolist(),
                "ops": [[p, n, t, self.op_count[(p, n)], self.op_lines[(p, n)]]
                        for (p, n), t in sorted(self.op_time_ns.items())],
                "active_span_ns": self.active_span_ns, "busy_in_span_ns": self.busy_in_span_ns,
                "events_scanned": self.events_scanned,
                "devices": [list(d) for d in self.devices],
                "programs_in_steps": sorted(self.programs_in_steps),
                "excluded_steps": self.excluded_steps,
                "active_from_ns": self.active_from_ns, "active_to_ns": self.active_to_ns,
                "step_numbers": list(self.step_numbers),
                "collective_per_step_ns": self.collective_per_step_ns.tolist(),
                "collective_instances": self.collective_instances.to_json(),
                "collective_busy_ns": self.collective_busy_ns}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HostTimeline:
        h = cls(host=str(d["host"]), source=str(d["source"]),
                steps=np.array(d["steps"], dtype=np.float64).reshape(-1, 2),
                busy_per_step_ns=np.array(d["busy_per_step_ns"], dtype=np.float64),
                active_span_ns=float(d["active_span_ns"]),
                busy_in_span_ns=float(d["busy_in_span_ns"]),
                events_scanned=int(d.get("events_scanned", 0)),
                devices=[(str(n), float(b), int(c)) for n, b, c in d.get("devices", [])],
                programs_in_steps={str(p) for p in d.get("programs_in_steps", [])},
                excluded_steps=list(d.get("excluded_steps", [])),
                active_from_ns=float(d.get("active_from_ns", 0.0)),
                active_to_ns=float(d.get("active_to_ns", 0.0)),
                step_numbers=[int(n) for n in d.get("step_numbers", [])],
                collective_per_step_ns=np.array(d.get("collective_per_step_ns", []),
                                                dtype=np.float64),
                collective_instances=collectives.CollectiveInstances.from_json(
                    d.get("collective_instances")),
                collective_busy_ns=float(d.get("collective_busy_ns", 0.0)))
        for program, name, t, count, *lines in d["ops"]:
            h.op_time_ns[(program, name)] = float(t)
            h.op_count[(program, name)] = int(count)
            h.op_lines[(program, name)] = int(lines[0]) if lines else 1
        return h


def _is_runtime_event(name: str) -> bool:
    # Runtime bookkeeping on the execution threads ("SlinkyThreadPool::Await", "end: fusion"),
    # not HLO ops: it counts as busy time but is not an op to attribute.
    return "::" in name or name.startswith("end: ")


def _hlo_name(event_name: str) -> str:
    # TPU timelines name events by the full HLO text: "%copy-done.2 = f32[...] copy-done(...)".
    if event_name.startswith("%") and " = " in event_name:
        return event_name[1:].split(" = ", 1)[0]
    return event_name


def _merge(starts: NDArray[np.float64], ends: NDArray[np.float64]
           ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The union of intervals as sorted, disjoint segments (touching intervals merge)."""
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], reach[last]


def _covered(seg_s: NDArray[np.float64], seg_e: NDArray[np.float64],
             lo: NDArray[np.float64], hi: NDArray[np.float64]) -> NDArray[np.float64]:
    """Length of the union of the segments inside each window [lo, hi)."""
    if len(seg_s) == 0 or len(lo) == 0:
        return np.zeros(len(lo))
    cum = np.concatenate([[0.0], np.cumsum(seg_e - seg_s)])
    i0 = np.searchsorted(seg_e, lo, side="right")  # first segment ending after lo
    i1 = np.searchsorted(seg_s, hi, side="left")  # segments starting before hi: [0, i1)
    total = cum[i1] - cum[np.minimum(i0, i1)]
    has = i1 > i0
    first = np.minimum(i0, len(seg_s) - 1)
    last = np.maximum(i1 - 1, 0)
    total -= np.where(has, np.maximum(0.0, lo - seg_s[first]), 0.0)
    total -= np.where(has, np.maximum(0.0, seg_e[last] - hi), 0.0)
    return np.maximum(total, 0.0)


def _has_stat(scan: XSpaceScan, plane: Plane, line: Line, index: int, stat: str) -> bool:
    ev = line.events
    names = plane.stat_names
    if any(names.get(sid) == stat for sid, _ in scan.stats_of(
            int(ev.stats_start[index]), int(ev.body_end[index]))):
        return True
    mid = int(ev.metadata_id[index])
    return any(names.get(scan.stat(s, e)[0]) == stat
               for s, e in plane.event_metadata_stats.get(mid, ()))


class HostSpans:
    """The host's steps and compilation spans, gathered line by line from its host threads'
    lines (`add` each one, decoded); `host_steps` of the lines added so far."""

    def __init__(self, scan: XSpaceScan) -> None:
        self._scan = scan
        self._steps: list[NDArray[np.float64]] = []
        self._compile_starts: list[NDArray[np.float64]] = []
        self._compile_ends: list[NDArray[np.float64]] = []

    def add(self, plane: Plane, line: Line) -> None:
        if not plane.name.startswith("/host:"):
            return
        ev = line.events
        if not len(ev):
            return
        # Whether an event is a step annotation (has step_num) is decided per metadata,
        # from its first occurrence: the column of metadata ids does the rest.
        mids, first, inverse = unique_ids(ev.metadata_id)
        step_mids = [m for m, i in zip(mids.tolist(), first.tolist(), strict=True)
                     if _has_stat(self._scan, plane, line, i, "step_num")]
        if step_mids:
            sel = np.isin(ev.metadata_id, step_mids) & (ev.duration_ps > 0)
            start = line.start_ns()[sel]
            self._steps.append(np.column_stack([start, start + line.duration_ns()[sel]]))
        hit = np.array([bool(_COMPILE_EVENT.search(plane.event_names.get(int(m), "")))
                        for m in mids.tolist()])
        if hit.any():
            sel = hit[inverse] & (ev.duration_ps > 0)
            start = line.start_ns()[sel]
            self._compile_starts.append(start)
            self._compile_ends.append(start + line.duration_ns()[sel])

    def spans(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(start_ns, end_ns) of the steps, and of the compilation events (merged)."""
        compiles = np.zeros((0, 2))
        if self._compile_starts:
            seg_s, seg_e = _merge(np.concatenate(self._compile_starts),
                                  np.concatenate(self._compile_ends))
            compiles = np.column_stack([seg_s, seg_e])
        return _distinct_steps(self._steps), compiles

    def host_steps(self) -> tuple[NDArray[np.float64], list[dict[str, Any]]]:
        return warmup_split(*self.spans())


def _host_spans(scan: XSpaceScan) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(start_ns, end_ns) of the host's steps, and of its compilation events (merged), from
    one pass over the host threads' lines."""
    spans = HostSpans(scan)
    for plane, line in scan.passing((p, ln) for p in scan.planes
                                    if p.name.startswith("/host:") for ln in p.lines):
        spans.add(plane, line)
    return spans.spans()


def _distinct_steps(parts: list[NDArray[np.float64]]) -> NDArray[np.float64]:
    if not parts:
        return np.zeros((0, 2))
    steps = np.concatenate(parts)
    steps = steps[np.lexsort((steps[:, 1], steps[:, 0]))]
    # Nested annotations of the same step (e.g. two StepTraceAnnotations) count once: keep a
    # step only when it starts after every kept step has ended.
    keep = np.ones(len(steps), dtype=bool)
    reach = -np.inf
    for i, (s, e) in enumerate(steps.tolist()):
        if s < reach:
            keep[i] = False
        else:
            reach = e
    return steps[keep]


def warmup_split(steps: NDArray[np.float64], compiles: NDArray[np.float64]
                 ) -> tuple[NDArray[np.float64], list[dict[str, Any]]]:
    """The steps to judge, and the compile and warm-up steps left out (with why).

    A step is left out when compilation fills at least COMPILE_STEP_SHARE of it, or when it
    leads the window (no judged step before it), at least WARMUP_MIN_AFTER steps follow it,
    and it takes WARMUP_STEP_FACTOR times their median. At least one step is always kept."""
    if len(steps) < 2:
        return steps, []
    dur_ns = steps[:, 1] - steps[:, 0]
    compile_ns = (_covered(compiles[:, 0], compiles[:, 1], steps[:, 0], steps[:, 1])
                  if len(compiles) else np.zeros(len(steps)))
    out: list[dict[str, Any]] = []
    keep = np.ones(len(steps), dtype=bool)
    leading = True
    for i in range(len(steps)):
        reason = ""
        if compile_ns[i] >= COMPILE_STEP_SHARE * dur_ns[i]:
            reason = "compilation"
        elif leading and len(steps) - i - 1 >= WARMUP_MIN_AFTER and dur_ns[
                i] > WARMUP_STEP_FACTOR * float(np.median(dur_ns[i + 1:])):
            reason = "warm-up (first-step outlier)"
        if reason and keep.sum() > 1:
            keep[i] = False
            out.append({"step_index": i, "step_time_ms": _round(dur_ns[i] / 1e6),
                        "compile_ms": _round(compile_ns[i] / 1e6), "reason": reason})
        else:
            leading = False
    return steps[keep], out


def _compute_lines(scan: XSpaceScan) -> tuple[str, list[tuple[Plane, Line]]]:
    device_lines: list[tuple[Plane, Line]] = []
    for plane in scan.planes:
        if plane.name.startswith("/device:") and "CUSTOM" not in plane.name:
            xla_ops = [ln for ln in plane.lines if ln.name == "XLA Ops"]
            chosen = xla_ops or [ln for ln in plane.lines if ln.name not in _SUMMARY_LINES]
            device_lines.extend((plane, ln) for ln in chosen)
    if device_lines:
        return "device", device_lines
    cpu_lines = [(plane, ln) for plane in scan.planes if plane.name.startswith("/host:CPU")
                 for ln in plane.lines if ln.name.startswith(_CPU_XLA_LINE_PREFIXES)]
    return "xla_cpu", cpu_lines


def analyze_host(path: Path, host: str) -> HostTimeline:
    """Measure steps and busy time in one xplane file (column-wise: no object per event)."""
    with XSpaceScan(path) as scan:
        return analyze_scan(scan, host)


def host_steps(scan: XSpaceScan) -> tuple[NDArray[np.float64], list[dict[str, Any]]]:
    """The host's steps to judge, and its compile and warm-up steps left out (with why),
    from its host threads' lines alone."""
    return warmup_split(*_host_spans(scan))


def analyze_scan(scan: XSpaceScan, host: str,
                 steps: tuple[NDArray[np.float64], list[dict[str, Any]]] | None = None
                 ) -> HostTimeline:
    """`analyze_host` on a file already open (its decoded lines stay cached in `scan`).

    `steps` (`host_steps` of the whole host) measures a time window of the host against
    the host's steps rather than its own: the windows' results then add up
    (`combine_windows`)."""
    result = HostTimeline(host=host)
    result.steps, result.excluded_steps = steps if steps is not None else host_steps(scan)
    source, lines = _compute_lines(scan)
    result.source = source
    starts, ends = [], []
    # Every attributed event's op (a global id), start and end, for the ops' concurrency.
    op_ids: dict[tuple[str, str], int] = {}
    spans: list[tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64]]] = []
    # Each device plane's executions (every event with a duration), for its busy time.
    device_spans: dict[str, list[tuple[NDArray[np.float64], NDArray[np.float64]]]] = {
        p.name: [] for p in scan.planes
        if p.name.startswith("/device:") and "CUSTOM" not in p.name}
    # Each line's collective executions: (start, end, op id into coll_names).
    coll_lines: list[tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int64]]] = []
    coll_names: dict[str, int] = {}
    for plane, line in scan.passing(lines):
        ev = line.events
        result.events_scanned += len(ev)
        if not len(ev):
            continue
        if source == "device":
            ran = ev.duration_ps > 0
            d_start = line.start_ns()[ran]
            device_spans.setdefault(plane.name, []).append(
                (d_start, d_start + line.duration_ns()[ran]))
        mids, _, inverse = unique_ids(ev.metadata_id)
        names = [plane.event_names.get(int(m), "") for m in mids.tolist()]
        marker = np.array([n.startswith(_MARKER_PREFIXES) for n in names])[inverse]
        runtime = np.array([_is_runtime_event(n) for n in names])[inverse]
        timed = (ev.duration_ps > 0) & ~marker
        start, dur = line.start_ns(), line.duration_ns()
        starts.append(start[timed])
        ends.append(start[timed] + dur[timed])
        attributed = timed & ~runtime
        hlo_names = [_hlo_name(n) for n in names]
        collective = np.array([collectives.is_collective(n) for n in hlo_names])
        if collective.any():
            sel = collective[inverse] & attributed
            if sel.any():
                ids = np.array([coll_names.setdefault(n, len(coll_names)) if c else -1
                                for n, c in zip(hlo_names, collective.tolist(), strict=True)],
                               dtype=np.int64)[inverse[sel]]
                coll_lines.append((start[sel], start[sel] + dur[sel], ids))
        # Device ops are attributed through xprof's op profile; only XLA:CPU events need
        # their program to tell same-named ops of different modules apart.
        program_id = plane.stat_id("program_id") if source == "xla_cpu" else None
        programs = (scan.int_stat(ev, program_id) if program_id is not None
                    else np.full(len(ev), -1, dtype=np.int64))
        # One id per (program, name): programs are -1 (none) or small non-negative ids.
        combined, _, key_index = unique_ids(
            (programs[attributed] + 1) * len(mids) + inverse[attributed])
        keys = np.column_stack([combined // len(mids) - 1, combined % len(mids)])
        if len(result.steps) and program_id is not None:
            in_step = _inside(start[attributed], result.steps)
            result.programs_in_steps.update(
                str(p) for p in np.unique(programs[attributed][in_step]).tolist() if p >= 0)
        totals = np.bincount(key_index, weights=dur[attributed], minlength=len(keys))
        counts = np.bincount(key_index, minlength=len(keys))
        local_ids = np.empty(len(keys), dtype=np.int64)
        for i, ((program, name_index), t, c) in enumerate(zip(
                keys.tolist(), totals.tolist(), counts.tolist(), strict=True)):
            key = ("" if program < 0 else str(program), _hlo_name(names[name_index]))
            result.op_time_ns[key] += t
            result.op_count[key] += c
            local_ids[i] = op_ids.setdefault(key, len(op_ids))
        s_att = start[attributed]
        spans.append((local_ids[key_index], s_att, s_att + dur[attributed]))
    for key, concurrency in _max_concurrency(op_ids, spans).items():
        result.op_lines[key] = concurrency
    if source == "device":
        result.devices = _per_device(device_spans)
    if starts:
        seg_s, seg_e = _merge(np.concatenate(starts), np.concatenate(ends))
    else:
        seg_s = seg_e = np.zeros(0)
    if len(seg_s):
        result.active_from_ns, result.active_to_ns = float(seg_s[0]), float(seg_e[-1])
        result.active_span_ns = float(seg_e[-1] - seg_s[0])
        result.busy_in_span_ns = float(np.sum(seg_e - seg_s))
    result.busy_per_step_ns = _covered(seg_s, seg_e, result.steps[:, 0], result.steps[:, 1])
    result.step_numbers = collectives.step_numbers(scan, result.steps)
    if coll_lines:
        c_s, c_e = _merge(np.concatenate([a for a, _, _ in coll_lines]),
                          np.concatenate([b for _, b, _ in coll_lines]))
        result.collective_per_step_ns = _covered(c_s, c_e, result.steps[:, 0],
                                                 result.steps[:, 1])
        result.collective_busy_ns = float(np.sum(c_e - c_s))
    else:
        result.collective_per_step_ns = np.zeros(len(result.steps))
    if source == "xla_cpu" and len(coll_lines) > 1:
        # XLA:CPU runs a program's ops on whichever pool thread is free: its lines are not
        # executors, so the host's collectives are one sequence (a device plane's line is).
        coll_lines = [(np.concatenate([a for a, _, _ in coll_lines]),
                       np.concatenate([b for _, b, _ in coll_lines]),
                       np.concatenate([i for _, _, i in coll_lines]))]
    result.collective_instances = collectives.instances(
        coll_lines, {i: n for n, i in coll_names.items()}, result.steps, result.step_numbers)
    return result



def combine_windows(parts: list[HostTimeline]) -> HostTimeline:
    """One host's timeline from its time windows' (`analyze_scan` of each window against the
    host's steps). The windows are cut between module executions, so no execution spans two
    of them: times, counts, busy time (per step, per device, in the span) add up, and an op's
    concurrency is its largest in any window."""
    if not parts:
        raise ValueError("no windows to combine")
    first = parts[0]
    out = HostTimeline(host=first.host, source=next((p.source for p in parts if p.source), ""),
                       steps=first.steps, excluded_steps=first.excluded_steps)
    out.busy_per_step_ns = np.sum([p.busy_per_step_ns for p in parts], axis=0) if len(
        first.steps) else np.zeros(0)
    n = len(first.steps)
    out.collective_per_step_ns = np.sum(
        [p.collective_per_step_ns for p in parts if len(p.collective_per_step_ns) == n],
        axis=0) if n else np.zeros(0)
    numbers = [p.step_numbers for p in parts if len(p.step_numbers) == n]
    out.step_numbers = np.max(numbers, axis=0).astype(int).tolist() if numbers and n else [
        -1] * n
    # A step the cut split between windows numbers its second part's collectives from 0
    # again; the cut falls between module executions, so this is rare.
    # Without steps, an op's executions are counted over the whole capture: each window's
    # count on from the windows before it (windows are in time order).
    seen: dict[str, int] = defaultdict(int)
    shifted = []
    for p in sorted(parts, key=lambda p: p.active_from_ns):
        ci = p.collective_instances
        whole = ci.step < 0
        if whole.any():
            occ = ci.occurrence.copy()
            for i in np.flatnonzero(whole).tolist():
                occ[i] += seen[ci.op[i]]
            for op in {o for o, w in zip(ci.op, whole.tolist(), strict=True) if w}:
                seen[op] = max(int(o) + 1 for o, name, w in zip(
                    occ.tolist(), ci.op, whole.tolist(), strict=True) if w and name == op)
            ci = collectives.CollectiveInstances(ci.step, ci.op, occ, ci.start_ns, ci.end_ns)
        shifted.append(ci)
    out.collective_instances = collectives.CollectiveInstances.concat(shifted)
    out.collective_busy_ns = sum(p.collective_busy_ns for p in parts)
    devices: dict[str, list[float]] = {}
    for p in parts:
        for key, t in p.op_time_ns.items():
            out.op_time_ns[key] += t
            out.op_count[key] += p.op_count[key]
            out.op_lines[key] = max(out.op_lines.get(key, 0), p.op_lines.get(key, 1))
        out.events_scanned += p.events_scanned
        out.busy_in_span_ns += p.busy_in_span_ns
        out.programs_in_steps |= p.programs_in_steps
        for name, busy, count in p.devices:
            acc = devices.setdefault(name, [0.0, 0])
            acc[0] += busy
            acc[1] += count
    ran = [p for p in parts if p.active_to_ns > p.active_from_ns or p.busy_in_span_ns]
    if ran:
        out.active_from_ns = min(p.active_from_ns for p in ran)
        out.active_to_ns = max(p.active_to_ns for p in ran)
        out.active_span_ns = out.active_to_ns - out.active_from_ns
    out.devices = sorted((name, float(b), int(c)) for name, (b, c) in devices.items())
    return out


def _max_concurrency(op_ids: dict[tuple[str, str], int],
                     spans: list[tuple[NDArray[np.int64], NDArray[np.float64],
                                       NDArray[np.float64]]]) -> dict[tuple[str, str], int]:
    """The most executions of each op running at once, over every line: one sweep over all
    starts (+1) and ends (-1), sorted by op then time, ends before starts at equal times."""
    if not op_ids or not spans:
        return {}
    ids = np.concatenate([g for g, _, _ in spans])
    if not len(ids):
        return {k: 1 for k in op_ids}
    begin = np.concatenate([b for _, b, _ in spans])
    end = np.concatenate([e for _, _, e in spans])
    gid = np.concatenate([ids, ids])
    when = np.concatenate([begin, end])
    delta = np.concatenate([np.ones(len(ids), np.int64), -np.ones(len(ids), np.int64)])
    order = np.lexsort((delta, when, gid))
    gid, delta = gid[order], delta[order]
    # Each op's +1s and -1s cancel, so one running sum restarts at 0 at every op boundary.
    running = np.cumsum(delta)
    firsts = np.flatnonzero(np.concatenate([[True], gid[1:] != gid[:-1]]))
    peaks = np.maximum.reduceat(running, firsts)
    by_id = {int(g): max(1, int(p)) for g, p in zip(gid[firsts].tolist(), peaks.tolist(),
                                                    strict=True)}
    return {k: by_id.get(i, 1) for k, i in op_ids.items()}


def _inside(times: NDArray[np.float64], steps: NDArray[np.float64]) -> NDArray[np.bool_]:
    """Whether each time falls inside one of the (sorted, disjoint) steps."""
    i = np.searchsorted(steps[:, 0], times, side="right") - 1
    ok = i >= 0
    return ok & (times < steps[np.maximum(i, 0), 1])


def _per_device(spans: dict[str, list[tuple[NDArray[np.float64], NDArray[np.float64]]]]
                ) -> list[tuple[str, float, int]]:
    """Busy time (union of its execution events) and event count of every device plane,
    including the devices whose planes hold no execution at all."""
    out = []
    for name, parts in spans.items():
        count = int(sum(len(s) for s, _ in parts))
        busy = 0.0
        if count:
            seg_s, seg_e = _merge(np.concatenate([s for s, _ in parts]),
                                  np.concatenate([e for _, e in parts]))
            busy = float(np.sum(seg_e - seg_s))
        out.append((name, busy, count))
    return sorted(out)


def _round(x: float, nd: int = 3) -> float:
    return round(float(x), nd)


# What the per-device idle figures of this pass are, and why they are mldiag's own.
DEVICE_IDLE_BASIS = {
    "by": "mldiag.timeline",
    "what": ("per device: 100 - busy_in_active_span_percent, where busy is the union of the "
             "device's XLA op events (its plane's op lines) and the span runs from the "
             "host's first op to its last on any device; per host (busy_in_active_span_percent): "
             "the union over all its devices, so its idle is the time no device runs an op"),
    "why": ("xprof states device idle for all devices together (get_overview "
            "performance_summary.device_idle_time_percent, get_step_trace "
            "summary.idle_percent, get_hlo_op_profile's IDLE row); per device only in the pod "
            "viewer's per-core step records (`xprof get_step_trace --device_core N`), which "
            "only a TPU trace with step markers has. Elsewhere `--device_core` answers the "
            "session-wide figure for every core (GPU), or no data (no steps)"),
}


def summarize(hosts: list[HostTimeline], top_n: int = 25) -> dict[str, Any]:
    """The JSON block we attach to the step-trace tool result as `host_bound_analysis`."""
    per_host = []
    all_steps_ms: list[float] = []
    where: list[tuple[str, int]] = []
    all_busy_ms: list[float] = []
    op_time: dict[tuple[str, str], float] = defaultdict(float)
    op_count: dict[tuple[str, str], int] = defaultdict(int)
    op_lines: dict[tuple[str, str], int] = defaultdict(int)
    for h in hosts:
        steps_ms = ((h.steps[:, 1] - h.steps[:, 0]) / 1e6).tolist()
        busy_ms = (h.busy_per_step_ns / 1e6).tolist()
        all_steps_ms.extend(steps_ms)
        where.extend((h.host, i) for i in range(len(steps_ms)))
        all_busy_ms.extend(busy_ms)
        for k, v in h.op_time_ns.items():
            op_time[k] += v
            op_count[k] += h.op_count[k]
            # Hosts run side by side: their executors add up.
            op_lines[k] += h.op_lines.get(k, 1)
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
                # Each device's busy share of this host's active span, and the rest of the
                # span as its idle share (DEVICE_IDLE_BASIS); idle devices named.
                "devices": [
                    {"device": name, "events": count, "busy_ms": _round(busy / 1e6),
                     "busy_in_active_span_percent": _round(100.0 * busy / h.active_span_ns, 2)
                     if h.active_span_ns else None,
                     "idle_in_active_span_percent": _round(
                         100.0 - 100.0 * busy / h.active_span_ns, 2)
                     if h.active_span_ns else None}
                    for name, busy, count in h.devices],
                # Devices that ran nothing, or under 1% of what the busiest device ran.
                "idle_devices": [name for name, busy, count in h.devices
                                 if count == 0 or busy < 0.01 * max(
                                     b for _, b, _ in h.devices)],
                "excluded_steps": h.excluded_steps,
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
    spread = step_spread(all_steps_ms, where)
    # Per-step op time, so the detectors can state a share of step time without an op profile.
    denom = n_steps if n_steps else 1
    top_ops = sorted(op_time.items(), key=lambda kv: (-kv[1], kv[0]))[:top_n]
    # One host's steps: what one executor's time is a share of (hosts run their steps side
    # by side, and each executor belongs to one host).
    stepped_hosts = sum(1 for h in hosts if len(h.steps)) or 1
    host_step_ns = total_step * 1e6 / stepped_hosts

    def per_executor(key: tuple[str, str]) -> float | None:
        if not host_step_ns:
            return None
        return _round(100.0 * op_time[key] / max(op_lines[key], 1) / host_step_ns, 2)
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
        # Compile and warm-up steps in the window, left out of every figure above and below.
        "excluded_steps": [dict(x, host=h.host) for h in hosts for x in h.excluded_steps],
        # The same steps' spread: stddev, min/median/max and the outlier steps.
        "step_time_spread": spread,
        "per_host": per_host,
        "device_idle_basis": DEVICE_IDLE_BASIS,
        "op_time_per_step": [
            {
                "op": name,
                "program_id": program,
                "ms_per_step": _round(t / 1e6 / denom, 4),
                "count": op_count[(program, name)],
                # Summed over every device or executor thread that ran it (8 devices each
                # busy 80% of the step give 640): percent_of_step_per_executor is one's.
                "percent_of_step": _round(100.0 * t / 1e6 / total_step, 2) if total_step else None,
                "executors": op_lines[(program, name)],
                "percent_of_step_per_executor": per_executor((program, name)),
            }
            for (program, name), t in top_ops
        ],
        "op_time_ms_by_program": _by_program(op_time, denom),
        "programs_in_steps": sorted(set().union(*(h.programs_in_steps for h in hosts)))
        if hosts else [],
        "collectives": collectives.summary(op_time, op_lines, op_count, denom / stepped_hosts,
                                    host_step_ns),
    }



OUTLIER_MADS = 3.0


def step_spread(steps_ms: list[float],
                where: list[tuple[str, int]] | None = None) -> dict[str, Any] | None:
    """Stddev, min, median and max of the step times, and the outliers: steps more than
    3 median absolute deviations (and 5%) above the median, slowest first (index, ms).
    `where` gives each step's host and index on that host: with several hosts, the outliers
    name them and `hosts` says how many the steps came from."""
    if not steps_ms:
        return None
    hosts = len({h for h, _ in where}) if where else 1
    x = np.asarray(steps_ms, dtype=float)
    median = float(np.median(x))
    mad = float(np.median(np.abs(x - median)))
    limit = median + max(OUTLIER_MADS * 1.4826 * mad, 0.05 * median)
    slow = [(int(i), float(x[i])) for i in np.argsort(-x) if x[i] > limit]
    return {
        "steps": len(steps_ms),
        "stddev_ms": _round(float(x.std(ddof=1)) if len(x) > 1 else 0.0),
        "min_ms": _round(float(x.min())), "median_ms": _round(median),
        "max_ms": _round(float(x.max())),
        "coefficient_of_variation_percent": _round(100.0 * float(x.std()) / float(x.mean()), 2)
        if x.mean() > 0 else None,
        "outlier_threshold_ms": _round(limit),
        "outliers": [{"step_index": i, "step_time_ms": _round(v)} if hosts == 1 or not where
                     else {"host": where[i][0], "step_index": where[i][1],
                           "step_time_ms": _round(v)} for i, v in slow[:10]],
        "outlier_count": len(slow),
        **({"hosts": hosts} if hosts > 1 else {}),
    }


def _by_program(op_time: dict[tuple[str, str], float], denom: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (program, name), t in sorted(op_time.items()):
        out[program][name] = _round(t / 1e6 / denom, 4)
    return dict(out)

