"""The program's roofline: how efficient it is, and whether it is memory- or compute-bound.

One rule raises the hypothesis of both `memory_bound` and `compute_bound` (xprof names the
bound; at most one of them is raised); each category's module (`rules/`) writes its finding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.model import Hypothesis, impact_of
from mldiag.analysis.judgement.readings import COLLECTIVE_CATEGORIES, TRANSFER_CATEGORIES

ROOFLINE_LOW_PERCENT = 50.0


def roofline_efficiency(snapshot: Mapping[str, Any]) -> float | None:
    """Roofline efficiency, or None when xprof could not place the program on a roofline."""
    program = ev.get(snapshot, "get_roofline_model", "program")
    if not isinstance(program, Mapping):
        return None
    bound = str(program.get("bound_by") or "").strip().lower()
    if bound in ("", "unknown") or not ev.number(program.get("measured_flop_rate_gflops")) and \
            not ev.number(program.get("measured_memory_bw_gibs")):
        return None
    return ev.percent(program.get("roofline_efficiency_percent"))

ROOFLINE_IDLE_LIMIT_PERCENT = 50.0

SHAPE_DERIVED = "derived_from_shapes"
OPAQUE = "opaque_custom_call"


@dataclass(frozen=True)
class RooflineOp:
    """One of get_roofline_model's top operations, as the judgement reads it.

    `efficiency_percent` is xprof's. For a custom call whose FLOPs xprof derives from its
    shapes, those are ONE call's FLOPs, which xprof divides by the op's total self time over
    every call (get_roofline_model_tool.py: `derived_flops / self_time`): with `calls` > 1
    (the op profile's occurrences) its compute efficiency is `calls` times what xprof says.
    `judged_efficiency_percent` is the efficiency over the op's own calls, per-call FLOPs
    times calls against the time of those calls; None when it has no FLOP count.
    """

    index: int
    name: str
    category: str
    provenance: str
    self_time_ms: float | None
    share_percent: float | None
    efficiency_percent: float | None
    calls: int | None
    judged_efficiency_percent: float | None

    @property
    def per_call_flops_scaled(self) -> bool:
        return self.judged_efficiency_percent != self.efficiency_percent and (
            self.judged_efficiency_percent is not None)

    @property
    def opaque(self) -> bool:
        return self.provenance == OPAQUE


def op_calls(snapshot: Mapping[str, Any], name: str) -> int | None:
    """How many times the op profile saw `name` run (its occurrences)."""
    groups = ev.get(snapshot, "get_hlo_op_profile", "grouped_operations", {}) or {}
    for rows in groups.values():
        for row in rows if isinstance(rows, list) else ():
            if isinstance(row, Mapping) and str(row.get("name", "")).split("/")[-1] == name:
                n = ev.number(row.get("occurrences"))
                return int(n) if n else None
    return None


def roofline_ops(snapshot: Mapping[str, Any]) -> list[RooflineOp]:
    """get_roofline_model's top operations, each with its FLOP provenance and the
    efficiency over its own calls."""
    out = []
    for i, op in enumerate(ev.get(snapshot, "get_roofline_model", "top_operations", []) or []):
        if not isinstance(op, Mapping):
            continue
        name = str(op.get("name") or "")
        provenance = str(op.get("flops_provenance") or "")
        eff = ev.percent(op.get("roofline_efficiency_percent"))
        calls = op_calls(snapshot, name)
        judged = eff
        if provenance == OPAQUE:
            judged = None
        elif provenance == SHAPE_DERIVED and calls and calls > 1:
            compute = ev.percent(op.get("compute_efficiency_percent"))
            memory = ev.percent(op.get("max_mem_bw_utilization_percent"))
            if compute is not None:
                judged = round(max(compute * calls, memory or 0.0), 2)
        out.append(RooflineOp(i, name, str(op.get("category") or ""), provenance,
                              ev.number(op.get("total_self_time_ms")),
                              ev.percent(op.get("total_self_time_percent")), eff, calls, judged))
    return out


def per_call_program_efficiency(snapshot: Mapping[str, Any]) -> float | None:
    """The program's roofline efficiency with each shape-derived custom call's FLOPs counted
    once per call, when xprof counted them once for all calls (see RooflineOp); None when no
    op needs it.

    xprof's program compute efficiency is program FLOPs over (time x peak); each such op adds
    (calls - 1) x its compute efficiency x its share of the time."""
    program = ev.get(snapshot, "get_roofline_model", "program")
    if not isinstance(program, Mapping):
        return None
    scaled = [op for op in roofline_ops(snapshot) if op.per_call_flops_scaled]
    if not scaled:
        return None
    top = ev.get(snapshot, "get_roofline_model", "top_operations", []) or []
    compute = ev.percent(program.get("compute_efficiency_percent")) or 0.0
    for op in scaled:
        op_compute = ev.percent(top[op.index].get("compute_efficiency_percent")) or 0.0
        compute += (int(op.calls or 1) - 1) * op_compute * (op.share_percent or 0.0) / 100.0
    memory = ev.percent(program.get("max_mem_bw_utilization_percent")) or 0.0
    return round(min(max(compute, memory), 100.0), 2)

_DATA_MOVEMENT = ("copy-done", "copy-start", "copy", "broadcast", "bitcast", "slice",
                  "dynamic-slice", "dynamic-update-slice", "transpose", "reshape", "pad",
                  "concatenate", *TRANSFER_CATEGORIES)


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
                                                              *COLLECTIVE_CATEGORIES)
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


def judged_roofline_efficiency(snapshot: Mapping[str, Any]) -> float | None:
    """The program's roofline efficiency to judge by: xprof's, or, when xprof counted a
    shape-derived custom call's FLOPs once for all its calls, with them counted per call."""
    eff = roofline_efficiency(snapshot)
    if eff is None:
        return None
    fixed = per_call_program_efficiency(snapshot)
    return fixed if fixed is not None else eff


def bound_hypotheses(snapshot: Mapping[str, Any], metrics: Mapping[str, Any]) -> list[Hypothesis]:
    program = ev.get(snapshot, "get_roofline_model", "program")
    eff = judged_roofline_efficiency(snapshot)
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
        impact=impact_of(100.0 - eff, "% of device time",
                       f"upper bound: at its roofline this work would take {eff:.2f}% of its "
                       f"current device time, so up to {100.0 - eff:.1f}% is headroom{note}")
        | {"upper_bound": True},
        details={"bound_by": bound, "ops_split": split, "caveats": caveats,
                 "operational_intensity_field": oi_field.split(".", 1)[1]},
    )]
