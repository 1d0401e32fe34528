"""communication: collectives (all-reduce, all-gather, ...) take a large share of time.

Raised from the op profile's collective categories or, where the op profile has none
(XLA:CPU), from our timeline's per-device share of the step; the fix depends on the
collective (gather less, reduce fewer bytes, overlap).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.context import Context, Plan, finding_of
from mldiag.analysis.judgement.model import Hypothesis, impact_of, priority_of
from mldiag.analysis.judgement.reading import SessionReading
from mldiag.analysis.judgement.readings import (
    COLLECTIVE_CATEGORIES,
    OP_CATEGORY_P0_PERCENT,
    OP_CATEGORY_P1_PERCENT,
    category_fraction,
    op_category_hypothesis,
    timeline_collective_percent,
)

CATEGORY = "communication"
RAISE_ORDER = 40


def hypotheses(reading: SessionReading) -> list[Hypothesis]:
    snapshot = reading.snapshot
    """From the op profile's collective rows or, where it has none (XLA:CPU), the timeline."""
    if not category_fraction(snapshot, COLLECTIVE_CATEGORIES):
        return _timeline_collectives(snapshot)
    return op_category_hypothesis(snapshot, CATEGORY, COLLECTIVE_CATEGORIES,
                                  "Collective communication")


def _timeline_collectives(snapshot: Mapping[str, Any]) -> list[Hypothesis]:
    share = timeline_collective_percent(snapshot)
    if share is None or share < OP_CATEGORY_P1_PERCENT:
        return []
    block = ev.get(snapshot, ev.TIMELINE, "collectives", {}) or {}
    top = (block.get("ops") or [{}])[0]
    base = "collectives"
    proof = [
        ev.cite(snapshot, ev.TIMELINE, f"{base}.percent_of_step"),
        ev.cite(snapshot, ev.TIMELINE, f"{base}.ms_per_step_per_executor"),
        ev.cite(snapshot, ev.TIMELINE, f"{base}.ops[0].op"),
        ev.cite(snapshot, ev.TIMELINE, f"{base}.ops[0].executors"),
        ev.cite(snapshot, ev.TIMELINE, f"{base}.ops[0].percent_of_step"),
        ev.cite(snapshot, ev.TIMELINE, "steps_analyzed"),
    ]
    op = str(top.get("op") or "collectives")
    executors = top.get("executors")
    return [Hypothesis(
        category="communication",
        priority=priority_of(share, OP_CATEGORY_P0_PERCENT, OP_CATEGORY_P1_PERCENT),
        title=(f"Collective communication ({op}) takes {share:.1f}% of each step per device"
               + (f" ({executors} devices)" if executors else "")),
        evidence=proof,
        impact=impact_of(share, "% of step",
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


def follow_ups(snapshot: Mapping[str, Any], h: Hypothesis) -> list[Plan]:
    return []


def finding(h: Hypothesis, ctx: Context) -> dict[str, Any]:
    kinds = [str(k) for k in h.details.get("categories", [])]
    if h.details.get("source") == "timeline":
        op = h.details.get("top_op")
        ms = h.details.get("ms_per_step")
        n = h.details.get("executors")
        what = (f"Each device spends {ms:.1f} ms of every step in collectives, mostly "
                f"`{op}`" + (f" (on all {n} devices)" if n else "") + "; the compute between "
                "them is short, so the exchange sets the step time.") if ms is not None else (
            f"Collectives ({', '.join(kinds)}) take a large share of each step.")
    else:
        what = f"Collectives ({', '.join(kinds)}) take a large share of time."
    fixes = {
        "all-gather": (
            "Do not gather what each device only partly uses: compute on the local shard "
            "inside `shard_map` and exchange only the (smaller) result: a reduction of a "
            "gathered array, `jnp.sum(jax.lax.all_gather(x, axis), 0)`, is "
            "`jax.lax.psum(jnp.sum(x, 0), axis)`; if every device needs the whole array, "
            "shard its consumer too (`NamedSharding(mesh, P(axis))` on the output) so XLA "
            "can overlap the gather with compute."),
        "all-reduce": (
            "Reduce fewer bytes, less often: `jax.lax.psum_scatter` (reduce-scatter) with "
            "sharded optimizer state instead of a full all-reduce, bf16 gradients, and "
            "gradient accumulation over micro-batches before one reduction; enable XLA's "
            "async collectives so the reduction overlaps the backward pass."),
        "reduce-scatter": (
            "Overlap the reduce-scatter with compute (XLA's latency-hiding scheduler) and "
            "reduce its bytes (bf16); check that the scattered axis maps onto the fastest "
            "interconnect of the mesh."),
    }
    fix = next((fixes[k] for k in kinds if k in fixes), (
        "Overlap collectives with compute (enable XLA's async collectives / latency-hiding "
        "scheduler), reduce bytes exchanged (bf16 gradients, `reduce_scatter` + sharded "
        "optimizer state instead of full all-reduce), and check the mesh maps the collective "
        "axis onto the fastest interconnect."))
    return finding_of(h, what, fix)
