"""data_transfer: asynchronous copies and host↔device transfers take device time.

Raised from the op profile's transfer categories (copy-done, infeed, ...); its follow-ups
show what the top copy moves and who waits for it, and xprof's async-overlap analysis says
how much of each copy hides behind compute. Host-offloaded tensors (memory space S(5)) get
their own fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.context import (
    Context,
    Plan,
    clean_hlo,
    finding_of,
    hlo_excerpt,
    module_of,
    op_source,
)
from mldiag.analysis.judgement.model import Hypothesis
from mldiag.analysis.judgement.reading import SessionReading
from mldiag.analysis.judgement.readings import TRANSFER_CATEGORIES, op_category_hypothesis

CATEGORY = "data_transfer"
RAISE_ORDER = 30


def hypotheses(reading: SessionReading) -> list[Hypothesis]:
    snapshot = reading.snapshot
    return op_category_hypothesis(snapshot, CATEGORY, TRANSFER_CATEGORIES, "Data transfer")


def follow_ups(snapshot: Mapping[str, Any], h: Hypothesis) -> list[Plan]:
    if not h.details.get("top_op"):
        return []
    module = module_of(snapshot, str(h.details["top_op"]))
    args: dict[str, Any] = {"instruction_name": h.details["top_op"], "radius": 1}
    if module:
        args["module_name"] = module
    return [("get_hlo_neighborhood",
             f"Find what {h.details['top_op']} copies and who waits for it", args,
             f"hlo:{module}:{h.details['top_op']}")]


def _copy_directions(copies: list[Mapping[str, Any]]) -> str:
    """Which copies go which way (S(5) is host memory), and which are exposed (their
    copy-done takes device time) or hidden behind compute."""
    if not copies:
        return ""
    timed = [float(c["time_ms"]) for c in copies if c.get("time_ms") is not None]
    top = max(timed, default=0.0)
    parts = []
    for direction in ("host→device", "device→host", "device→device"):
        group = [c for c in copies if c.get("direction") == direction]
        if not group:
            continue
        exposed = [c for c in group if c.get("time_ms") and float(c["time_ms"]) >= 0.01 * top]
        hidden = [c for c in group if c not in exposed]
        said = f"{len(group)} {direction} ({', '.join(f'`{c['copy_done']}`' for c in group)})"
        if exposed and hidden:
            said += (f", of which {', '.join(f'`{c['copy_done']}`' for c in exposed)} "
                     f"make the device wait and {', '.join(f'`{c['copy_done']}`' for c in hidden)}"
                     " cost no wait at their copy-done")
        elif exposed:
            said += ", all making the device wait at their copy-done"
        elif timed:
            said += ", none making the device wait at its copy-done"
        parts.append(said)
    return ("Its asynchronous copies, by memory space (S(5) is pinned host memory): "
            + "; ".join(parts) + ".")


def _async_overlap(ctx: Context) -> tuple[str, list[dict[str, Any]]]:
    """What xprof's analyze_async_overlap measured (the async windows hidden behind compute
    and the exposed ones), as a sentence and its citations; empty without it."""
    data = ctx.data("async_overlap")
    summary = data.get("summary") if isinstance(data, Mapping) else None
    if not isinstance(summary, Mapping) or not summary.get("count"):
        return "", []
    ratio = ev.number(summary.get("overlap_ratio"))
    by_op = data.get("by_op") if isinstance(data.get("by_op"), Mapping) else {}
    worst = max(by_op, key=lambda k: float(by_op[k].get("exposed_ps") or 0), default=None)
    proof = [ev.cite_value("analyze_async_overlap", f"summary.{f}", data)
             for f in ("count", "exposed", "partial", "hidden", "overlap_ratio")]
    said = (f"xprof's async-overlap analysis (compute running inside each start→done "
            f"window): of {summary['count']} windows, {summary.get('exposed')} have no compute "
            f"beside them, {summary.get('partial')} some and {summary.get('hidden')} enough to "
            "hide them"
            + (f" ({100 * ratio:.1f}% of window time covered)" if ratio is not None else "")
            + (f"; the most exposed op family is {worst}" if worst else "") + ".")
    return said, proof


def finding(h: Hypothesis, ctx: Context) -> dict[str, Any]:
    op = str(h.details.get("top_op"))
    module = module_of(ctx.snapshot, op) or ""
    data = ctx.data(f"hlo:{module}:{op}")
    extra = []
    host_offload = False
    near = ""
    if isinstance(data, Mapping) and data.get("text"):
        text = clean_hlo(str(data["text"]))
        extra.append(hlo_excerpt(text))
        host_offload = "S(5)" in text
        starts = [ln.split("] ", 2)[-1] for ln in text.splitlines() if "copy-start(" in ln]
        if starts:
            near = f" It is produced by `{starts[0][:200]}`."
        consumers = [ln.split("] ", 2)[-1].split(" = ", 1)[0] for ln in text.splitlines()
                     if "[dist=1]" in ln and f"({op}" in ln and "copy-start(" not in ln]
        for consumer in consumers[:1]:
            src = op_source(ctx.snapshot, consumer)
            if src:
                extra += src
                near += (f" Its consumer `{consumer}` comes from "
                         f"`{src[0]['value']}:{src[1]['value']}`: that is the line to change.")
    cats = ", ".join(str(c) for c in h.details.get("categories", []))
    what = (f"Device time is dominated by {cats}: `{op}` and its siblings wait for "
            f"asynchronous copies to finish." + near)
    copies = ev.get(ctx.snapshot, ev.ASYNC_COPIES, "async_copies", []) or []
    copies_said = _copy_directions(copies)
    if copies_said:
        what += " " + copies_said
    overlap_said, overlap_proof = _async_overlap(ctx)
    if overlap_said:
        what += " " + overlap_said
        extra += overlap_proof
        host_offload = host_offload or any("host" in c.get("direction", "") for c in copies)
        extra.append(ev.cite(ctx.snapshot, ev.ASYNC_COPIES, "async_copies"))
    elif host_offload:
        what += (" The copy source lives in memory space S(5) (pinned host memory), so every "
                 "call streams the tensor from host to HBM.")
    if host_offload:
        fix = ("Keep these tensors in device memory: place them once with "
               "`jax.device_put(x, NamedSharding(mesh, spec, memory_kind='device'))` (or drop the "
               "`memory_kind='pinned_host'` / host-offload annotation) so the jitted function "
               "does not copy them from host every call; if they must stay on host, overlap the "
               "copy with compute by splitting the work so copy-start is issued earlier.")
        top = max((float(c["time_ms"]) for c in copies if c.get("time_ms")), default=0.0)
        back = [c["copy_done"] for c in copies if c.get("direction") == "device→host"
                and c.get("time_ms") and float(c["time_ms"]) >= 0.01 * top]
        if back:
            fix += (f" The results written back to host ({', '.join(f'`{b}`' for b in back)}) "
                    "are offloaded by `out_shardings` with `memory_kind='pinned_host'` (or "
                    "`jax.device_put(..., memory_kind='pinned_host')`): keep them on device "
                    "until they are needed on host.")
    else:
        fix = ("Keep data device-resident across steps: move `jax.device_put` of inputs out of "
               "the step, prefetch the next batch while the current one runs, and avoid "
               "`np.asarray`/`jax.device_get` round-trips inside the loop.")
    return finding_of(h, what, fix, extra)
