"""memory_bound: the program runs far below its roofline, bound by memory bandwidth.

Raised by the roofline rule (`roofline.bound_hypotheses`) when xprof names a memory bound
(HBM, ...) and the efficiency is low; an upper bound on what could be gained.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.context import Context, Plan, finding_of
from mldiag.analysis.judgement.model import Hypothesis
from mldiag.analysis.judgement.roofline import bound_hypotheses

CATEGORY = "memory_bound"
RAISE_ORDER = 50


def hypotheses(snapshot: Mapping[str, Any], metrics: Mapping[str, Any]
               ) -> list[Hypothesis]:
    return [h for h in bound_hypotheses(snapshot, metrics) if h.category == CATEGORY]


def follow_ups(snapshot: Mapping[str, Any], h: Hypothesis) -> list[Plan]:
    return []


def finding(h: Hypothesis, ctx: Context) -> dict[str, Any]:
    top = ev.get(ctx.snapshot, "get_roofline_model", "program", {}) or {}
    oi = top.get("bottleneck_operational_intensity_flop_per_byte",
                 top.get("operational_intensity_flop_per_byte"))
    what = (f"The program is bound by {h.details.get('bound_by')} bandwidth at "
            f"{oi} FLOP/byte (its bottleneck operational intensity), far below the ridge "
            f"point of {top.get('bound_by_ridge_point_flop_per_byte')} FLOP/byte; it reaches "
            f"{top.get('roofline_efficiency_percent')} of the roofline.")
    fix = ("Raise arithmetic intensity: fuse elementwise work into its producers (avoid "
           "materialising intermediates, e.g. replace separate `x + b` then `jnp.maximum` calls "
           "inside Python loops with one jitted expression), use bf16 storage for activations, "
           "and batch more work per kernel; first remove the larger data-transfer finding if one "
           "is listed above, since it inflates the bytes moved.")
    return finding_of(h, what, fix)
