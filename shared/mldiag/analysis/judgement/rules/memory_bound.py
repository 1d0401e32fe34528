"""memory_bound: the program runs far below its roofline, bound by memory bandwidth.

Raised by the roofline rule (`roofline.bound_hypotheses`) when xprof names a memory bound
(HBM, ...) and the efficiency is low; an upper bound on what could be gained.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement import op_kinds
from mldiag.analysis.judgement.context import Context, Plan, finding_of
from mldiag.analysis.judgement.model import Hypothesis
from mldiag.analysis.judgement.reading import SessionReading
from mldiag.analysis.judgement.roofline import bound_hypotheses

CATEGORY = "memory_bound"
RAISE_ORDER = 50


def hypotheses(reading: SessionReading) -> list[Hypothesis]:
    snapshot, metrics = reading.snapshot, reading.values
    return [h for h in bound_hypotheses(snapshot, metrics) if h.category == CATEGORY]


def follow_ups(snapshot: Mapping[str, Any], h: Hypothesis) -> list[Plan]:
    return []


def _hbm_bound_kind(snapshot: Mapping[str, Any]) -> tuple[str, list[str]]:
    """The kind of op that holds most of the memory-bound time among the roofline's top
    operations (matmul fusions, elementwise loops, data movement, Pallas kernels), and those
    ops, largest first."""
    by_kind: dict[str, list[tuple[float, str]]] = {}
    for op in ev.get(snapshot, "get_roofline_model", "top_operations", []) or []:
        if not isinstance(op, Mapping) or str(op.get("bound_by") or "").lower() in (
                "compute", "unknown", ""):
            continue
        share = ev.percent(op.get("total_self_time_percent")) or 0.0
        kind = op_kinds.kind_of(str(op.get("name") or ""), category=str(op.get("category") or ""))
        if kind == op_kinds.LIBRARY_GEMM:
            kind = op_kinds.GEMM_FUSION
        elif kind not in (op_kinds.GEMM_FUSION, op_kinds.DATA_MOVEMENT, op_kinds.PALLAS):
            kind = op_kinds.LOOP_FUSION
        by_kind.setdefault(kind, []).append((share, str(op.get("name"))))
    if not by_kind:
        return op_kinds.LOOP_FUSION, []
    kind = max(by_kind, key=lambda k: sum(s for s, _ in by_kind[k]))
    return kind, [name for _, name in sorted(by_kind[kind], reverse=True)]


def finding(h: Hypothesis, ctx: Context) -> dict[str, Any]:
    top = ev.get(ctx.snapshot, "get_roofline_model", "program", {}) or {}
    oi = top.get("bottleneck_operational_intensity_flop_per_byte",
                 top.get("operational_intensity_flop_per_byte"))
    what = (f"The program is bound by {h.details.get('bound_by')} bandwidth at "
            f"{oi} FLOP/byte (its bottleneck operational intensity), far below the ridge "
            f"point of {top.get('bound_by_ridge_point_flop_per_byte')} FLOP/byte; it reaches "
            f"{top.get('roofline_efficiency_percent')} of the roofline.")
    kind, ops = _hbm_bound_kind(ctx.snapshot)
    fix = op_kinds.memory_bound_fix(kind, ops)
    if ops:
        what += (f" Its largest HBM-bound ops are {op_kinds.LABELS[kind]}: "
                 + ", ".join(f"`{o}`" for o in ops[:3]) + ".")
    return finding_of(h, what, fix)
