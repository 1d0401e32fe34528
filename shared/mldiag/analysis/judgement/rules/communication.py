"""communication: collectives (all-reduce, all-gather, ...) take a large share of time.

Raised from the op profile's collective categories or, where the op profile has none
(XLA:CPU), from our timeline's per-device share of the step; the fix depends on the
collective (gather less, reduce fewer bytes, overlap).

In a session of several hosts, the cross-host pass (`mldiag.timeline pod`) splits that time
into waiting for the last host to arrive and transfer. Fewer bytes, reduce-scatter or bf16
only shorten the transfer: when waiting is most of it, the finding says so, points at the
straggler (its own finding) or at the imbalance, and its priority is the transfer's share.
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
    """From the op profile's collective rows or, where it has none (XLA:CPU), the timeline;
    in a pod whose collectives are mostly waiting, said so."""
    snapshot = reading.snapshot
    if not category_fraction(snapshot, COLLECTIVE_CATEGORIES):
        found = _timeline_collectives(snapshot)
    else:
        found = op_category_hypothesis(snapshot, CATEGORY, COLLECTIVE_CATEGORIES,
                                       "Collective communication")
    return [_waiting(h, reading) for h in found]


def _waiting(h: Hypothesis, reading: SessionReading) -> Hypothesis:
    pod = reading.pod
    if pod is None or not pod.waiting_dominates:
        return h
    snapshot = reading.snapshot
    step = ev.number(pod.data.get("median_step_ms"))
    transfer = pod.transfer_ms_per_step or 0.0
    transfer_share = 100.0 * transfer / step if step else 0.0
    who = ", ".join(s.host for s in pod.stragglers)
    h.title += (f"; {pod.wait_percent:.0f}% of it is waiting for "
                + (f"the straggler {who}" if who else "the last host to arrive")
                + f", {transfer:.1f} ms per step transfer")
    h.priority = priority_of(transfer_share, OP_CATEGORY_P0_PERCENT, OP_CATEGORY_P1_PERCENT)
    h.impact = impact_of(transfer_share, "% of step",
                         f"the transfer itself is {transfer:.1f} ms per step "
                         f"({transfer_share:.1f}%); the rest of the collectives' time is "
                         "waiting, which only the slow host can give back")
    h.evidence = h.evidence + [
        ev.cite(snapshot, ev.TIMELINE, f"pod.collective_split.{k}")
        for k in ("wait_percent", "wait_ms_per_step", "transfer_ms_per_step")]
    h.details["waiting"] = {"percent": pod.wait_percent, "stragglers": [
        s.host for s in pod.stragglers], "transfer_ms": transfer, "hosts": pod.hosts}
    return h


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
    waiting = h.details.get("waiting")
    if isinstance(waiting, Mapping):
        stragglers = [str(s) for s in waiting.get("stragglers") or []]
        what = (f"Of the collectives' time across the {waiting.get('hosts')} hosts, "
                f"{waiting.get('percent'):.0f}% is waiting for the last host to arrive and "
                f"{waiting.get('transfer_ms'):.1f} ms per step is the transfer itself.")
        if stragglers:
            fix = (f"Make {' and '.join(stragglers)} arrive on time (see the straggler "
                   "finding): the other hosts wait for it inside the collective. Fewer "
                   "bytes, reduce-scatter or bf16 would only shorten the transfer.")
        else:
            fix = ("No one host is late in most steps: a different host arrives last each "
                   "step. Even out the work per host (equal batch and sequence lengths, no "
                   "per-host side work on the step's path) before touching the collective: "
                   "fewer bytes or bf16 would only shorten the transfer.")
        return finding_of(h, what, fix)
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
