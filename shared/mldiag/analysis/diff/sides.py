"""One side of a diff: what an analysed session measured, in the terms a comparison needs.

A step of a profile splits into the time the device (on CPU, XLA's runtime threads) spent
waiting for the host and the time it was busy; the busy time splits into ops, grouped by the
program (HLO module) they belong to. The ops come from our timeline on XLA:CPU (ms per step,
summed over the threads and devices that ran them) or from xprof's op profile elsewhere (a
share of device time). Both are turned into *wall* milliseconds per step here, so the ops of a
side add up to its busy time and two sides can be subtracted op by op.

Every number keeps the tool output and field it was read from, so a diff cites its evidence
the way findings do: `{tool, field, value}`, read from the snapshot, never typed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mldiag.analysis.collection.hlo.digest import COLLECTIVES, module_base, opcodes_of, program_id
from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.triage import compute_metrics

MS_PER_STEP = "ms per step"
PERCENT = "% of device time"
# Op-profile categories that are waiting, not work.
_IDLE_CATEGORIES = ("IDLE",)
HLO_DIGESTS = "hlo_digests"


@dataclass(frozen=True)
class Side:
    """An analysed session to compare: its health snapshot and analysis.json (and, when
    stored, investigation.json, whose follow-ups hold kernel statistics), with what the
    state store knows about it (`context`: run configs, framework, capture) and where the
    snapshot came from (`source`: a stored snapshot, or analysed for this diff)."""

    label: str
    snapshot: Mapping[str, Any]
    analysis: Mapping[str, Any]
    investigation: Mapping[str, Any] | None = None
    context: Mapping[str, Any] = field(default_factory=dict)
    source: str = "stored snapshot"


@dataclass
class Op:
    """One op of one side: its module (without program id), wall ms per step (or share of
    device time), what kind of op it is, and the field its time was read from."""

    module: str
    name: str
    value: float
    raw: float
    kind: str = ""  # its HLO signature (or the op profile's category)
    cite: tuple[str, str] | None = None


def cite(snapshot: Mapping[str, Any], tool: str, path: str, side: str) -> dict[str, Any] | None:
    """`{side, tool, field, value}` with the value read from the snapshot, or None."""
    try:
        if tool == HLO_DIGESTS:
            value = ev.lookup(snapshot.get(HLO_DIGESTS) or [], path)
        else:
            value = ev.cite(snapshot, tool, path)["value"]
    except ev.MissingField:
        return None
    return {"side": side, "tool": tool, "field": path, "value": value}


@dataclass
class Profile:
    """What one side measured (see the module docstring). `name` is "A" or "B"."""

    side: Side
    name: str
    device_type: str = ""
    hosts: int = 0
    step_ms: float | None = None
    step_sd: float | None = None
    steps: int = 0
    step_path: tuple[str, str] | None = None
    # Each step's time as xprof's step trace lists it (`step_breakdown`), for the test of
    # run-to-run variation.
    step_samples: list[float] = field(default_factory=list)
    wait_ms: float | None = None
    wait_path: tuple[str, str] | None = None
    idle_percent: float | None = None
    unit: str = MS_PER_STEP
    op_source: str = ""
    ops: dict[tuple[str, str], Op] = field(default_factory=dict)
    runtime_ms: float = 0.0  # busy time not in any op (XLA:CPU runtime, waits)
    digests: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    has_digests: bool = False
    digest_gap: str = ""  # why there are no digests
    step_names: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def snapshot(self) -> Mapping[str, Any]:
        return self.side.snapshot

    @property
    def busy_ms(self) -> float | None:
        if self.step_ms is None or self.wait_ms is None:
            return None
        return max(self.step_ms - self.wait_ms, 0.0)

    def as_percent(self) -> None:
        """Express this side's ops in % of its step, to compare with a side without steps."""
        if self.unit == PERCENT or not self.step_ms:
            return
        for op in self.ops.values():
            op.value = 100.0 * op.value / self.step_ms
        if self.idle_percent is None and self.wait_ms is not None:
            self.idle_percent = 100.0 * self.wait_ms / self.step_ms
        self.unit = PERCENT

    def cite(self, tool: str, path: str) -> dict[str, Any] | None:
        return cite(self.snapshot, tool, path, self.name)

    def module_time(self, module: str) -> float:
        return sum(o.value for (m, _), o in self.ops.items() if m == module)

    def modules(self) -> set[str]:
        return {m for m, _ in self.ops}


def profile(side: Side, name: str) -> Profile:
    """Read one side's measurements out of its snapshot."""
    snap = side.snapshot
    p = Profile(side=side, name=name)
    session = snap.get("session") or {}
    p.device_type = str(session.get("device_type") or ev.get(
        snap, "get_xprof_overview", "run_environment.device_type") or "")
    p.hosts = len(session.get("hosts") or []) or int(ev.number(ev.get(
        snap, "get_xprof_overview", "run_environment.host_count")) or 0)
    p.metrics = compute_metrics(snap)
    p.idle_percent = p.metrics.get("device_idle_percent")
    _steps(p)
    _digests(p)
    _ops(p)
    return p


def _steps(p: Profile) -> None:
    snap = p.snapshot
    hb = ev.tool_data(snap, ev.TIMELINE) or {}
    tool = "get_step_trace"
    if hb.get("steps_analyzed") and ev.number(hb.get("step_time_ms_average")):
        p.step_ms = ev.number(hb["step_time_ms_average"])
        p.steps = int(hb["steps_analyzed"])
        p.step_path = (ev.TIMELINE, "step_time_ms_average")
        spread = hb.get("step_time_spread") or {}
        p.step_sd = ev.number(spread.get("stddev_ms"))
        if ev.number(hb.get("host_wait_ms_average")) is not None:
            p.wait_ms = ev.number(hb["host_wait_ms_average"])
            p.wait_path = (ev.TIMELINE, "host_wait_ms_average")
    else:
        summary = ev.get(snap, tool, "summary", {}) or {}
        if ev.number(summary.get("step_time_ms_average")):
            p.step_ms = ev.number(summary["step_time_ms_average"])
            p.steps = int(ev.number(summary.get("total_steps")) or 0)
            p.step_path = (tool, "summary.step_time_ms_average")
            p.step_sd = ev.number(summary.get("step_time_ms_stddev"))
            if ev.number(summary.get("idle_time_ms_average")) is not None:
                p.wait_ms = ev.number(summary["idle_time_ms_average"])
                p.wait_path = (tool, "summary.idle_time_ms_average")
    rows = ev.get(snap, tool, "step_breakdown", []) or []
    p.step_samples = [float(r["step_time_ms"]) for r in rows if isinstance(r, Mapping)
                      and ev.number(r.get("step_time_ms")) is not None]
    names = {str(r.get("step_num", "")).rsplit(" ", 1)[0] for r in rows
             if isinstance(r, Mapping) and " " in str(r.get("step_num", ""))}
    p.step_names = sorted(names)
    if p.step_ms is None:
        p.unit = PERCENT


def _digests(p: Profile) -> None:
    found = p.snapshot.get(HLO_DIGESTS)
    p.has_digests = isinstance(found, list) and bool(found)
    if not isinstance(found, list) or not found:
        modules = ev.get(p.snapshot, "list_hlo_modules", "modules", []) or []
        p.digest_gap = ("the profile holds no HLO modules" if not modules else
                        "its snapshot was collected before mldiag recorded HLO digests"
                        if HLO_DIGESTS not in p.snapshot else
                        "its HLO texts could not be read")
        return
    by_base: dict[str, list[Mapping[str, Any]]] = {}
    for d in found:
        if isinstance(d, Mapping) and d.get("module"):
            by_base.setdefault(str(d.get("base") or module_base(str(d["module"]))), []).append(d)
    # Several compiles of one program (its name with different ids): the one that ran in the
    # steps, else the last compiled.
    hb = ev.tool_data(p.snapshot, ev.TIMELINE) or {}
    ran = {str(k) for k in (hb.get("op_time_ms_by_program") or {}) if k}
    for base, mods in by_base.items():
        running = [d for d in mods if str(d.get("program_id")) in ran]
        p.digests[base] = (running or mods)[-1]


def _module_of_program(p: Profile) -> dict[str, str]:
    names = ev.get(p.snapshot, "list_hlo_modules", "modules", []) or []
    out = {program_id(str(n)): str(n) for n in names if program_id(str(n))}
    for d in p.snapshot.get(HLO_DIGESTS) or []:
        if isinstance(d, Mapping) and d.get("program_id"):
            out.setdefault(str(d["program_id"]), str(d.get("module")))
    return out


def _kind(p: Profile, module: str, op: str, fallback: str = "") -> str:
    digest = p.digests.get(module) or {}
    return str((digest.get("ops") or {}).get(op) or fallback)


def _ops(p: Profile) -> None:
    snap = p.snapshot
    hb = ev.tool_data(snap, ev.TIMELINE) or {}
    by_program = hb.get("op_time_ms_by_program") or {}
    groups = ev.get(snap, "get_hlo_op_profile", "grouped_operations", {}) or {}
    if hb.get("compute_source") == "xla_cpu" and by_program:
        p.op_source = "timeline"
        _timeline_ops(p, hb, by_program)
    elif groups:
        p.op_source = "op profile"
        _op_profile_ops(p, groups)


def _timeline_ops(p: Profile, hb: Mapping[str, Any],
                  by_program: Mapping[str, Mapping[str, Any]]) -> None:
    modules = _module_of_program(p)
    listed = {(str(o.get("program_id")), str(o.get("op")))
              for o in hb.get("op_time_per_step") or [] if isinstance(o, Mapping)}
    raw: dict[tuple[str, str], tuple[float, tuple[str, str] | None]] = {}
    runtime = 0.0
    for program, ops in by_program.items():
        if not isinstance(ops, Mapping):
            continue
        if not program:
            # Runtime events on the XLA threads (rendezvous, buffer handling): inside the busy
            # time, but not HLO ops.
            runtime += sum(float(v) for v in ops.values() if ev.number(v) is not None)
            continue
        module = module_base(modules.get(str(program), f"program {program}"))
        for op, ms in ops.items():
            value = ev.number(ms)
            if value is None:
                continue
            path = ((ev.TIMELINE, f"op_time_per_step"
                     f"[op={op}&program_id={program}].ms_per_step")
                    if (str(program), op) in listed else None)
            key = (module, str(op))
            before = raw.get(key, (0.0, None))[0]
            raw[key] = (before + value, path)
    busy = p.busy_ms
    if not p.steps:
        # No steps: the op times are totals over the capture. In % of the active span
        # instead, with the busy share of that span as the busy time.
        hosts = [h for h in hb.get("per_host") or []
                 if ev.number(h.get("busy_in_active_span_percent")) is not None]
        if not hosts:
            p.ops.clear()
            return
        busy = sum(float(h["busy_in_active_span_percent"]) for h in hosts) / len(hosts)
        if p.idle_percent is None:
            p.idle_percent = 100.0 - busy
    total = sum(v for v, _ in raw.values())
    # Threads and devices run ops side by side, and XLA:CPU's runtime waits between them: so
    # that a side's ops add up to its busy (wall) time, each is scaled by busy / sum of ops.
    scale = busy / total if busy and total > 0 else 1.0
    for (module, op), (value, path) in raw.items():
        p.ops[(module, op)] = Op(module, op, value * scale, value, _kind(p, module, op), path)
    p.runtime_ms = runtime


def _op_profile_ops(p: Profile, groups: Mapping[str, Any]) -> None:
    total = ev.number(ev.get(p.snapshot, "get_hlo_op_profile", "total_profile_time_ms"))
    if not total:
        return
    for category, ops in groups.items():
        if str(category) in _IDLE_CATEGORIES or not isinstance(ops, list):
            continue
        for o in ops:
            if not isinstance(o, Mapping):
                continue
            parts = str(o.get("name", "")).split("/")
            if len(parts) < 3 or parts[0] != "by_program":
                continue
            module, op = module_base(parts[1]), parts[-1]
            ms = ev.number(o.get("total_self_time_ms"))
            if ms is None:
                continue
            share = ms / total
            # A share of device time is a share of each step: in ms when the step is known.
            value = share * p.step_ms if p.step_ms else 100.0 * share
            path = ("get_hlo_op_profile",
                    f"grouped_operations.{category}[name={o.get('name')}].total_self_time_ms")
            key = (module, op)
            if key in p.ops:
                p.ops[key].value += value
                p.ops[key].raw += ms
            else:
                p.ops[key] = Op(module, op, value, ms, _kind(p, module, op, str(category)),
                                path if "." not in str(category) else None)


def device_changed(a: Profile, b: Profile) -> bool:
    """Whether the two sides ran on different device types."""
    return bool(a.device_type and b.device_type and a.device_type != b.device_type)


def is_collective(kind: str) -> bool:
    """Whether an op's signature (or op-profile category) is a collective."""
    return bool(opcodes_of(kind) & COLLECTIVES) or kind in COLLECTIVES


def noise_ms(a: Profile, b: Profile) -> float | None:
    """Two standard errors of the difference of the two mean step times: a delta below it is
    within run-to-run variation. None when either side has fewer than 3 steps."""
    if a.step_sd is None or b.step_sd is None or a.steps < 3 or b.steps < 3:
        return None
    return 2.0 * (a.step_sd ** 2 / a.steps + b.step_sd ** 2 / b.steps) ** 0.5
