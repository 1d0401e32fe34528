"""memory_pressure: the peak of live memory is near the device's capacity (OOM risk), or,
where the profile records no capacity, one compiled program holds a large amount.

Raised from get_memory_profile (or get_peak_allocations of the program the steps ran); the
finding lists the largest buffers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.context import Context, Plan, finding_of
from mldiag.analysis.judgement.model import Hypothesis, impact_of
from mldiag.analysis.judgement.reading import SessionReading
from mldiag.analysis.judgement.readings import LARGE_MODULE_GIB, stepped_module

CATEGORY = "memory_pressure"
RAISE_ORDER = 60


def hypotheses(reading: SessionReading) -> list[Hypothesis]:
    snapshot, metrics = reading.snapshot, reading.values
    risk = metrics.get("oom_risk")
    peak, cap = metrics.get("peak_memory_gib"), metrics.get("memory_capacity_gib")
    if risk in ("HIGH", "MEDIUM") and peak is not None and cap:
        proof = [ev.cite(snapshot, "get_memory_profile", "peak_memory_usage_gib"),
                 ev.cite(snapshot, ev.MEMORY_ALLOCATORS, "peak.memory_capacity_gib")
                 if str(metrics.get("memory_capacity_source") or "").startswith(
                     ev.MEMORY_ALLOCATORS)
                 else ev.cite(snapshot, "get_memory_profile", "memory_capacity_gib")]
        _, mi = stepped_module(snapshot)
        buffer = f"modules[{mi}].top_buffers[0]"
        if ev.get(snapshot, "get_peak_allocations", buffer) is not None:
            proof.append(ev.cite(snapshot, "get_peak_allocations", buffer))
        return [Hypothesis(
            category="memory_pressure", priority="P0" if risk == "HIGH" else "P1",
            title=f"OOM risk {risk}: peak {peak:.2f} of {cap:.2f} GiB",
            evidence=proof,
            impact=impact_of(peak, "GiB", f"{100.0 * peak / cap:.1f}% of device memory at peak"),
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
                impact=impact_of(gib, "GiB", f"{gib:.2f} GiB of buffers live at the module's peak; "
                               "capacity is not in this profile, so OOM risk is unknown"),
            )]
    return []


def follow_ups(snapshot: Mapping[str, Any], h: Hypothesis) -> list[Plan]:
    return []


def finding(h: Hypothesis, ctx: Context) -> dict[str, Any]:
    # The program the triage judged: the largest one the measured steps ran.
    _, index = stepped_module(ctx.snapshot)
    top = ev.get(ctx.snapshot, "get_peak_allocations", f"modules[{index}]", {}) or {}
    buffers = [b for b in top.get("top_buffers", []) if isinstance(b, Mapping)][:3]
    listing = ", ".join(f"`{b.get('instruction')}` {float(b.get('size_mib', 0)):.0f} MiB"
                        for b in buffers)
    what = (f"Module `{top.get('module_name', '?')}` holds "
            f"{float(top.get('total_hbm_mib', 0)) / 1024:.2f} GiB at its peak"
            + (f"; largest buffers: {listing}." if listing else "."))
    fix = ("Cut live memory at the peak: donate inputs that are overwritten "
           "(`jax.jit(step, donate_argnums=(0,))` for params/optimizer state), rematerialise "
           "activations with `jax.checkpoint` (`jax.remat`) around the largest blocks, drop "
           "references to arrays you no longer need (del, or don't keep per-step outputs in a "
           "Python list), and shard or shrink the batch if the largest buffers are activations.")
    return finding_of(h, what, fix)
