"""The rule-based investigator: hypotheses → at most 4 follow-ups → findings with fixes.

It stands behind the `Investigator` port so that a Gemini investigator can replace it. Every
number it states comes from a tool output and is cited as `{tool, field, value}`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.followups import HOST_PYTHON_EVENTS, FollowUpRefused, FollowUps
from mldiag.analysis.judgement.triage import Hypothesis, Triage, custom_call_api, stepped_module

_PS_PER_MS = 1e9
_RUNTIME_HOST_EVENT = re.compile(
    r"profiler\.py|stop_trace|start_trace|PjitFunction|PjRt|Execute|ThreadPool|Thunk|"
    r"block_until_ready|try_to_block|<module>|threading\.py|__exit__|__enter__",
)


class RuleBasedInvestigator:
    """Deterministic investigator that needs no network; the offline default."""

    name = "rule-based"

    def investigate(
        self, snapshot: Mapping[str, Any], triage: Triage, follow_ups: FollowUps
    ) -> dict[str, Any]:
        started = time.perf_counter()
        context = _Context(snapshot, triage)
        for plan in _plan(snapshot, triage.hypotheses):
            if follow_ups.remaining <= 0:
                break
            tool, purpose, args, key = plan
            try:
                context.results[key] = follow_ups.call(tool, purpose, **args)
            except FollowUpRefused:
                break
        findings = []
        for i, h in enumerate(triage.hypotheses, start=1):
            finding = _FINDING_BUILDERS.get(h.category, _generic)(h, context)
            findings.append({"id": f"F{i}", **finding})
        return {
            "investigator": self.name,
            "hypotheses": [h.to_dict() for h in triage.hypotheses],
            "follow_ups": follow_ups.records,
            "findings": findings,
            "summary": summarize(snapshot, triage, findings),
            "elapsed_ms": round((time.perf_counter() - started) * 1000.0, 1),
        }


class _Context:
    def __init__(self, snapshot: Mapping[str, Any], triage: Triage) -> None:
        self.snapshot = snapshot
        self.triage = triage
        self.results: dict[str, dict[str, Any]] = {}

    def data(self, key: str) -> Any:
        rec = self.results.get(key)
        if rec is None or rec.get("status") != "DATA":
            return None
        return rec.get("data")


_Plan = tuple[str, str, dict[str, Any], str]


def _plan(snapshot: Mapping[str, Any], hyps: list[Hypothesis]) -> list[_Plan]:
    """Follow-ups worth their cost, strongest hypothesis first, deduplicated."""
    plans: list[_Plan] = []
    seen: set[str] = set()

    def add(tool: str, purpose: str, args: dict[str, Any], key: str) -> None:
        if key not in seen:
            seen.add(key)
            plans.append((tool, purpose, args, key))

    for h in hyps:
        if h.priority == "P2":
            continue
        if h.category == "host_bound" or (h.category == "idle" and h.details.get("cpu")):
            add("aggregate_xplane_events",
                "Find the host-side Python work that keeps the device waiting between steps",
                dict(HOST_PYTHON_EVENTS), "host_events")
        elif h.category in ("layout_copy", "unfused_reshape", "convert_reduce"):
            d = h.details["detection"]
            add("get_hlo_neighborhood",
                f"Show producers and consumers of {d['instruction']} to place the fix",
                {"instruction_name": d["instruction"], "module_name": d["module"], "radius": 1},
                f"hlo:{d['module']}:{d['instruction']}")
        elif h.category == "data_transfer" and h.details.get("top_op"):
            module = _module_of(snapshot, str(h.details["top_op"]))
            args: dict[str, Any] = {"instruction_name": h.details["top_op"], "radius": 1}
            if module:
                args["module_name"] = module
            add("get_hlo_neighborhood",
                f"Find what {h.details['top_op']} copies and who waits for it", args,
                f"hlo:{module}:{h.details['top_op']}")
    device = str(ev.get(snapshot, "get_xprof_overview", "run_environment.device_type") or "")
    if "GPU" in device.upper() or ev.get(snapshot, "get_kpi_metrics", "accelerator_info") and (
        "GPU" in str(ev.get(snapshot, "get_kpi_metrics", "accelerator_info.device_type"))
    ):
        add("get_kernel_stats", "Rank GPU kernels by time and occupancy",
            {"limit": 10}, "kernels")
    if any(h.category in ("data_transfer", "communication") and h.priority in ("P0", "P1")
           for h in hyps) and ("TPU" in device.upper() or "GPU" in device.upper()):
        add("analyze_async_overlap", "Measure how much of each async copy or collective is "
            "hidden behind compute", {"top_k": 10}, "async_overlap")
    if "TPU" in device.upper():
        add("llo_load", "Load LLO-level events, if the capture has them", {}, "llo")
    hosts = snapshot.get("session", {}).get("hosts") or []
    if len(hosts) > 1:
        add("get_hosts", "Confirm every host's trace is present", {}, "hosts")
    return plans


def _module_of(snapshot: Mapping[str, Any], op: str) -> str | None:
    groups = ev.get(snapshot, "get_hlo_op_profile", "grouped_operations", {}) or {}
    for ops in groups.values():
        for row in ops:
            parts = str(row.get("name", "")).split("/")
            if len(parts) >= 4 and parts[-1] == op:
                return parts[1]
    return None


def _op_source(snapshot: Mapping[str, Any], op: str) -> list[dict[str, Any]]:
    """Evidence of where `op` comes from in user code, from the op profile's source info."""
    groups = ev.get(snapshot, "get_hlo_op_profile", "grouped_operations", {}) or {}
    for category, ops in groups.items():
        for i, row in enumerate(ops):
            parts = str(row.get("name", "")).split("/")
            if parts[-1] == op and row.get("source_file"):
                base = f"grouped_operations.{category}[{i}]"
                return [ev.cite(snapshot, "get_hlo_op_profile", f"{base}.source_file"),
                        ev.cite(snapshot, "get_hlo_op_profile", f"{base}.source_line")]
    return []


def _finding(h: Hypothesis, what: str, fix: str, extra: list[dict[str, Any]] | None = None
             ) -> dict[str, Any]:
    d = h.details.get("detection")
    src = str(d.get("source") or "") if isinstance(d, Mapping) else ""
    if src and src not in fix:
        # The fix says where in the user's code it applies: `train.py:41`, op
        # `jit(step)/transpose` (JAX's op name; the file and line when the HLO carries them).
        where, _, op = src.partition(" (")
        if op:
            fix = f"At `{where}` (op `{op.rstrip(')')}`): {fix}"
        elif ".py:" in src:
            fix = f"At `{src}`: {fix}"
        else:
            fix = f"In op `{src}`: {fix}"
    primary = h.details.get("tool")
    others = [c for c in h.details.get("causes") or [] if c.get("tool") != primary
              and c.get("description")]
    for cause in others:
        # One op, one finding: the other detectors' reading of the same op is part of it.
        what += f" Also a {cause['category'].replace('_', ' ')}: {cause['description']}"
    return {
        "category": h.category, "priority": h.priority, "title": h.title, "what": what,
        "evidence": h.evidence + (extra or []), "impact": h.impact, "fix": fix,
    }


_JAX_INTERNAL = re.compile(r"jax/_src|pjit\.py|dispatch\.py|api\.py|_infer_params|"
                           r"lax\.py|numpy/reductions|array_methods")


def _host_events(ctx: _Context, step_ms: float, steps: int | None = None
                 ) -> list[tuple[int, dict[str, Any]]]:
    """The host frames that fill the waits: at least 5% of each step (or of the window, with
    `step_ms` the window and `steps` 1), and shorter than one."""
    data = ctx.data("host_events")
    if not isinstance(data, Mapping):
        return []
    if steps is None:
        steps = ev.get(ctx.snapshot, "get_step_trace", "host_bound_analysis.steps_analyzed") or 1
    picked = []
    for i, row in enumerate(data.get("aggregates", [])):
        name = str(row.get("event", ""))
        if _RUNTIME_HOST_EVENT.search(name):
            continue
        per_step = float(row.get("total_duration_ps", 0)) / _PS_PER_MS / steps
        avg = float(row.get("avg_duration_ps", 0)) / _PS_PER_MS
        # Frames longer than a step enclose the loop itself, not the stall.
        if avg >= step_ms or per_step < 0.05 * step_ms:
            continue
        picked.append((i, row))
        if len(picked) == 3:
            break
    return picked


def _host_bound(h: Hypothesis, ctx: _Context) -> dict[str, Any]:
    hb = ev.get(ctx.snapshot, "get_step_trace", "host_bound_analysis", {}) or {}
    step_ms = float(hb.get("step_time_ms_average") or 0.0)
    busy_ms = float(hb.get("compute_busy_ms_average") or 0.0)
    culprits = _host_events(ctx, step_ms) if step_ms else []
    extra = []
    names = []
    for i, row in culprits:
        extra.append(ev.cite_value("aggregate_xplane_events", f"aggregates[{i}].event",
                                   ctx.data("host_events")))
        extra.append(ev.cite_value("aggregate_xplane_events", f"aggregates[{i}].avg_duration_ps",
                                   ctx.data("host_events")))
        names.append(f"`{row['event'].lstrip('$')}` ({row['avg_duration_ps'] / 1e9:.1f} ms per "
                     "call)")
    what = (f"Each step takes {step_ms:.1f} ms of wall time but compiled XLA work runs only "
            f"{busy_ms:.2f} ms of it; {hb.get('steps_mostly_waiting')} of "
            f"{hb.get('steps_analyzed')} steps spend over half their time waiting for the host.")
    if names:
        what += " The host is busy in " + ", ".join(names) + " between device executions."
    fix = ("Take host work off the step's critical path: produce batches in a background thread "
           "or process and prefetch them to the device (e.g. a `queue.Queue` filled by a "
           "producer thread plus `jax.device_put` of the next batch while the current step runs, "
           "or `grain`/`tf.data` with `.prefetch`), and avoid a host sync per step "
           "(`.block_until_ready()`, `float(loss)`, `print(loss)`) so JAX's async dispatch can "
           "overlap the host with the device.")
    jax_internal = [row for _, row in culprits if _JAX_INTERNAL.search(str(row["event"]))]
    if culprits and len(jax_internal) * 2 >= len(culprits):
        fix = ("The host time is JAX's own dispatch and tracing (" + ", ".join(
            f"`{r['event'].lstrip('$')}`" for r in jax_internal[:2]) + "): the step runs as "
            "many small un-jitted operations. Wrap the whole training step in one `jax.jit` "
            "(arguments that change shape or are Python values go in `static_argnums` or "
            "become arrays), so each step is one dispatch of one compiled program.")
    elif names:
        fix = f"Remove or overlap {names[0]} first: " + fix[0].lower() + fix[1:]
    return _finding(h, what, fix, extra)


def _detector_source(d: Mapping[str, Any]) -> str:
    src = str(d.get("source") or "")
    return f" (source: {src})" if src else ""


def _neighborhood(ctx: _Context, d: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    key = f"hlo:{d.get('module')}:{d.get('instruction')}"
    data = ctx.data(key)
    if not isinstance(data, Mapping) or not data.get("text"):
        return "", []
    text = _clean_hlo(str(data["text"]))
    lines = [ln.strip() for ln in text.splitlines() if "[dist=1]" in ln]
    if not lines:
        return "", []
    return (" Neighbours: " + "; ".join(ln.split("] ", 2)[-1][:160] for ln in lines[:3]) + ".",
            [{"tool": "get_hlo_neighborhood", "field": "text (backend_config omitted)",
              "value": text[:800]}])


_BACKEND_CONFIG = re.compile(r",\s*(backend_config|metadata|frontend_attributes)=\{.*$")


def _clean_hlo(text: str) -> str:
    """HLO lines without backend_config/metadata blobs, which bury the shapes."""
    return "\n".join(_BACKEND_CONFIG.sub("", ln) for ln in text.splitlines())


def _fed_by_parameter(ctx: _Context, d: Mapping[str, Any]) -> str | None:
    """The entry parameter that feeds the flagged instruction, if the neighbourhood shows one."""
    data = ctx.data(f"hlo:{d.get('module')}:{d.get('instruction')}")
    if not isinstance(data, Mapping):
        return None
    for line in str(data.get("text", "")).splitlines():
        body = line.split("] ", 2)[-1].strip()
        if "[dist=1]" in line and " parameter(" in body:
            return body.split(" = ", 1)[0]
    return None


def _consumes_by_dot(ctx: _Context, d: Mapping[str, Any]) -> bool:
    """Whether the neighbourhood shows a dot or convolution consuming the flagged op."""
    data = ctx.data(f"hlo:{d.get('module')}:{d.get('instruction')}")
    text = str(data.get("text", "")) if isinstance(data, Mapping) else ""
    return any("[dist=1]" in ln and f"({d.get('instruction')}" in ln
               and (" dot(" in ln or " convolution(" in ln) for ln in text.splitlines())


def _transpose_fix(ctx: _Context, d: Mapping[str, Any]) -> str:
    """The fix for a relayout that comes from a transpose in the user's code (`x.T`)."""
    param = _fed_by_parameter(ctx, d)
    # JAX names a jitted function's argument `x` in op metadata and `x.1` in the HLO.
    operand = (f"the step's argument `{re.sub(r'[.]\d+$', '', param)}` (HLO `{param}`)"
               if param else "the transposed operand")
    if _consumes_by_dot(ctx, d):
        return (f"Do not transpose {operand} before the matmul: contract over its original "
                "axes with `jnp.einsum` (e.g. `jnp.einsum('ki,kj->ij', x, w)` for `x.T @ w`) "
                "or `jax.lax.dot_general` dimension numbers, so the dot reads it in the layout "
                "it already has.")
    return (f"Keep {operand} in the order its consumer reads it instead of transposing it "
            "every step: store it transposed once where it is produced (outside the jitted "
            "step, pass `xt = x.T` computed once), or transpose the other, smaller or "
            "step-invariant operand instead; when the result feeds a matmul, contract over "
            "the original axes with `jnp.einsum`/`jax.lax.dot_general` rather than `x.T`.")


def _layout_copy(h: Hypothesis, ctx: _Context) -> dict[str, Any]:
    d = h.details["detection"]
    near, extra = _neighborhood(ctx, d)
    op_path = str(d.get("source") or "").partition(" (")[2].rstrip(")")
    if d.get("fused_with") or op_path.endswith("/transpose"):
        # The relayout is the user's `x.T` (op metadata says transpose), not an input format.
        what = f"{str(d.get('description', '')).rstrip('.')}{_detector_source(d)}." + near
        return _finding(h, what, _transpose_fix(ctx, d), extra)
    what = (f"`{d['instruction']}` in module `{d['module']}` rewrites "
            f"{d['input_shape']} into {d['output_shape']}: same elements, only the layout "
            f"changes ({d['input_layout']} → {d['output_layout']}){_detector_source(d)}."
            + near)
    param = _fed_by_parameter(ctx, d)
    if param:
        what += (f" Its input is the jitted function's argument `{param}`, which arrives in "
                 f"layout {d['input_layout']}, so the copy runs on every call.")
        fix = (f"Hand `{param}` to the jitted step in the layout it consumes: drop the "
               "column-major `Format(Layout(major_to_minor=...))` from its `jax.device_put` / "
               "`in_shardings` (or stop passing a transposed view), or let XLA choose: "
               "`step = jax.jit(f, in_shardings=(Format(Layout.AUTO), None))`, then place the "
               "array once with `jax.device_put(x, step.lower(x, w).compile()"
               ".input_formats[0][0])` so the relayout is paid once, not every step.")
    else:
        fix = ("This copy comes from a transpose the consumer does not need materialised "
               "(`x.T`, `jnp.transpose`, `jnp.swapaxes`, or `x.T @ w`). Express the contraction "
               "directly with `jnp.einsum('ij,ik->jk', x, w)` or `jax.lax.dot_general` "
               "dimension numbers so XLA reads the operand in its existing layout, or store the "
               "array pre-transposed once outside the jitted step.")
    return _finding(h, what, fix, extra)


def _unfused_reshape(h: Hypothesis, ctx: _Context) -> dict[str, Any]:
    d = h.details["detection"]
    near, extra = _neighborhood(ctx, d)
    what = f"{d.get('description', '').rstrip('.')}{_detector_source(d)}." + near
    fix = ("Collapse the `reshape`/`transpose` chain into the op that consumes it: write the "
           "contraction as one `jnp.einsum` over the original axes (e.g. "
           "`jnp.einsum('bhqd,bhkd->bhqk', q, k)` instead of reshaping heads and transposing), "
           "or pass `dimension_numbers` to `jax.lax.dot_general`; keep tensors in the layout the "
           "next op wants instead of reshape→transpose→reshape between two matmuls.")
    return _finding(h, what, fix, extra)


def _convert_reduce(h: Hypothesis, ctx: _Context) -> dict[str, Any]:
    d = h.details["detection"]
    near, extra = _neighborhood(ctx, d)
    description = str(d.get("description", "")).rstrip(".")
    what = f"{description}{_detector_source(d)}." + near
    kinds = description.split("(reducers: ", 1)[1].split(")", 1)[0] if (
        "(reducers: " in description) else ""
    if ("maximum" in kinds or "minimum" in kinds) and "add" in kinds:
        # A sum and a max of the same tensor: the max is exact in bf16, so it needs no f32
        # copy; only the sum accumulates in f32.
        fix = ("Do not share one f32 copy between a max and a sum: take the max on the "
               "low-precision input (`jnp.max(x, axis=axis)`: max is exact in bf16) and let "
               "the sum accumulate in f32 as it reads bf16 "
               "(`jnp.sum(x, axis=axis, dtype=jnp.float32)`); with no other f32 consumer, XLA "
               "fuses each convert into its reduction.")
    elif "more reduce" in description or "materialis" in description:
        fix = ("Compute the reductions that share the f32 copy in one pass, with a variadic "
               "reduce, so XLA fuses the convert into the reduction and reads bf16 directly "
               "(the copy is written to memory only because several reductions share it): "
               "`xf = x.astype(jnp.float32); s, ss = "
               "jax.lax.reduce((xf, xf * xf), (jnp.float32(0), jnp.float32(0)), "
               "lambda a, b: (a[0] + b[0], a[1] + b[1]), (axis,))`, then derive mean and "
               "variance from `s` and `ss`. With a single reduction, "
               "`jnp.sum(x, axis=axis, dtype=jnp.float32)` fuses the convert on its own.")
    else:
        fix = ("Accumulate in f32 while reading the low-precision input: use "
               "`jnp.sum(x, axis=axis, dtype=jnp.float32)` (or `preferred_element_type="
               "jnp.float32` on `jax.lax.dot_general` when the reduce is a contraction) and do "
               "not keep the `x.astype(jnp.float32)` result alive for other consumers.")
    return _finding(h, what, fix, extra)


def _memory_pressure(h: Hypothesis, ctx: _Context) -> dict[str, Any]:
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
    return _finding(h, what, fix)


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


def _async_overlap(ctx: _Context) -> tuple[str, list[dict[str, Any]]]:
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


def _data_transfer(h: Hypothesis, ctx: _Context) -> dict[str, Any]:
    op = str(h.details.get("top_op"))
    module = _module_of(ctx.snapshot, op) or ""
    data = ctx.data(f"hlo:{module}:{op}")
    extra = []
    host_offload = False
    near = ""
    if isinstance(data, Mapping) and data.get("text"):
        text = _clean_hlo(str(data["text"]))
        extra.append({"tool": "get_hlo_neighborhood", "field": "text (backend_config omitted)",
              "value": text[:800]})
        host_offload = "S(5)" in text
        starts = [ln.split("] ", 2)[-1] for ln in text.splitlines() if "copy-start(" in ln]
        if starts:
            near = f" It is produced by `{starts[0][:200]}`."
        consumers = [ln.split("] ", 2)[-1].split(" = ", 1)[0] for ln in text.splitlines()
                     if "[dist=1]" in ln and f"({op}" in ln and "copy-start(" not in ln]
        for consumer in consumers[:1]:
            src = _op_source(ctx.snapshot, consumer)
            if src:
                extra += src
                near += (f" Its consumer `{consumer}` comes from "
                         f"`{src[0]['value']}:{src[1]['value']}`: that is the line to change.")
    cats = ", ".join(str(c) for c in h.details.get("categories", []))
    what = (f"Device time is dominated by {cats}: `{op}` and its siblings wait for "
            f"asynchronous copies to finish." + near)
    copies = ev.get(ctx.snapshot, "detect_layout_mismatch_copies", "async_copies", []) or []
    copies_said = _copy_directions(copies)
    if copies_said:
        what += " " + copies_said
    overlap_said, overlap_proof = _async_overlap(ctx)
    if overlap_said:
        what += " " + overlap_said
        extra += overlap_proof
        host_offload = host_offload or any("host" in c.get("direction", "") for c in copies)
        extra.append(ev.cite(ctx.snapshot, "detect_layout_mismatch_copies", "async_copies"))
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
    return _finding(h, what, fix, extra)


def _memory_bound(h: Hypothesis, ctx: _Context) -> dict[str, Any]:
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
    return _finding(h, what, fix)


def _compute_bound(h: Hypothesis, ctx: _Context) -> dict[str, Any]:
    what = "The program is compute-bound but well below peak FLOP rate."
    fix = ("Check matmul shapes are multiples of 128 (TPU MXU) or 8/16 (GPU tensor cores), use "
           "bf16 inputs with `preferred_element_type=jnp.float32`, and increase batch size per "
           "device.")
    return _finding(h, what, fix)


def _idle(h: Hypothesis, ctx: _Context) -> dict[str, Any]:
    kernels = ctx.data("kernels")
    extra = []
    if isinstance(kernels, Mapping) and kernels.get("kernels"):
        for f in ("kernel_count", "total_kernel_time_us", "kernels[0].kernel_name",
                  "kernels[0].total_duration_us", "kernels[0].occurrences"):
            extra.append(ev.cite_value("get_kernel_stats", f, kernels))
    scope = ("each step" if h.impact.get("unit") == "% of step" else
             "the capture window" if h.details.get("window") == "capture window" else
             "the profiled device time")
    what = (f"No device op runs for {h.impact.get('value')}% of {scope}: the device waits on "
            "the host (input pipeline, Python dispatch, synchronisation) or on other workers.")
    span = ev.number(ev.get(ctx.snapshot, "get_step_trace",
                            "host_bound_analysis.per_host[0].active_span_ms"))
    culprits = _host_events(ctx, span, 1) if span and h.details.get("cpu") else []
    busy_in = []
    for i, row in culprits:
        for f in ("event", "count", "avg_duration_ps"):
            extra.append(ev.cite_value("aggregate_xplane_events", f"aggregates[{i}].{f}",
                                       ctx.data("host_events")))
        busy_in.append(f"`{row['event'].lstrip('$')}` ({row.get('count')} calls, "
                     f"{row['avg_duration_ps'] / 1e9:.1f} ms each)")
    if busy_in:
        what += (f" Over the {span:.0f} ms window the host is busy in " + ", ".join(busy_in)
                 + " while no device op runs.")
    rows = [k for k in (kernels.get("kernels", []) if isinstance(kernels, Mapping) else [])
            if isinstance(k, Mapping)]
    names = " ".join(str(k.get("kernel_name", "")) for k in rows)
    total_us = ev.number(kernels.get("total_kernel_time_us")) if isinstance(
        kernels, Mapping) else None
    if rows and total_us:
        # Name what the device does run: the top kernels, by their short names.
        named = [f"`{_kernel_short_name(str(k.get('kernel_name', '')))}` "
                 f"({100.0 * (ev.number(k.get('total_duration_us')) or 0.0) / total_us:.1f}% "
                 f"of kernel time, {int(ev.number(k.get('occurrences')) or 0)} launches)"
                 for k in rows[:2]]
        what += " When it runs, its top kernels are " + " and ".join(named) + "."
    if "tensorflow::" in names:
        # Kernel names give the framework away; JAX advice would not apply to this trace.
        what += " The kernels are TensorFlow's (tensorflow:: kernels), so this is a TF program."
        fix = ("Overlap input with compute with `tf.data` (`.prefetch(tf.data.AUTOTUNE)`, "
               "`.cache()`, parallel `map`), run the step as one `tf.function(jit_compile=True)` "
               "so ops are not dispatched one by one, and remove per-step host syncs "
               "(`.numpy()`, printing losses).")
    elif busy_in:
        fix = (f"Take {busy_in[0]} off the path between device calls: run it in a background "
               "thread or process (or drop it), prefetch the next batch to the device while "
               "the current one computes, and issue several jitted calls before blocking on a "
               "result, so JAX's async dispatch keeps the device busy.")
    else:
        fix = ("Look at the trace viewer gaps between steps: overlap input with compute "
               "(prefetch to device), remove per-step host syncs (`.block_until_ready()`, "
               "`.item()`, printing losses), and make sure the step is one compiled program "
               "(`jax.jit` the whole step, not its pieces) so dispatch gaps disappear.")
    return _finding(h, what, fix, extra)


def _kernel_short_name(name: str) -> str:
    """`void ns::Kernel<T...>(args)` → `ns::Kernel`: a GPU kernel's name without its
    return type, template arguments and parameters."""
    name = name.removeprefix("void ").strip()
    for stop in ("<", "("):
        name = name.split(stop, 1)[0]
    return name or "unnamed kernel"


def _communication(h: Hypothesis, ctx: _Context) -> dict[str, Any]:
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
    return _finding(h, what, fix)


_CUSTOM_CALL_FIXES = {
    "eigh": "if only the eigenvalues are used, call `jnp.linalg.eigvalsh` (no eigenvectors); "
            "if the matrix does not change between steps, decompose it once outside the step",
    "svd": "pass `compute_uv=False` when only singular values are used and "
           "`full_matrices=False` otherwise; for the largest singular value alone, a few power "
           "iterations (`jnp.linalg.norm(a, 2)` is itself an SVD) are far cheaper",
    "solve": "for a symmetric positive definite matrix, factor with "
             "`jax.scipy.linalg.cho_factor` and solve with `cho_solve` (half the work of LU); "
             "when the matrix is reused, factor it once with `jax.scipy.linalg.lu_factor` and "
             "call `lu_solve` per right-hand side; batch right-hand sides into one call",
    "inv": "do not invert: solve with `jnp.linalg.solve` (or `cho_solve`) instead",
    "cholesky": "reuse the factor across steps when the matrix does not change",
    "qr": "use `mode='r'` when Q is not needed",
}


def _read_outputs_fix(call: Mapping[str, Any]) -> str:
    """Advice from which of a LAPACK call's outputs the program reads (HLO users): eigh's
    output 0 is the eigenvectors; gesdd's outputs 2 and 3 are U and Vᵀ."""
    read = call.get("outputs_read")
    if not isinstance(read, list):
        return ""
    linalg = str(call.get("linalg") or "")
    if linalg == "eigh":
        if 0 not in read:
            return ("the eigenvectors (output 0) are never read: call `jnp.linalg.eigvalsh`, "
                    "which does not compute them")
        return ("the eigenvectors are read, so `eigvalsh` would not do; if the matrix does not "
                "change between steps, decompose it once outside the step, and when only a few "
                "extreme eigenpairs are used, `jax.experimental.sparse.linalg.lobpcg_standard` "
                "computes just those")
    if linalg == "svd":
        if 2 not in read and 3 not in read:
            return ("only the singular values are read (U and Vᵀ, outputs 2 and 3, are not); "
                    "when only the largest is needed, a few power iterations on `a.T @ a` are "
                    "far cheaper than a full SVD")
        return ("U or Vᵀ is read: use `full_matrices=False` (the thin SVD) unless the full "
                "bases are needed")
    return ""


def _custom_calls(h: Hypothesis, ctx: _Context) -> dict[str, Any]:
    calls = ev.get(ctx.snapshot, "detect_layout_mismatch_copies", "custom_calls", []) or []
    unit = str(h.impact.get("unit"))
    rows = []
    for i in h.details.get("indices", [])[:4]:
        c = calls[i]
        src = str(c.get("source") or "")
        where = src.partition(" (")[0] if ".py:" in src else ""
        rows.append((c, custom_call_api(src, str(c.get("linalg") or "")), where))
    listed = "; ".join(
        f"`{c['instruction']}` (custom call `{c.get('target')}`, from `{api}`"
        + (f" at `{where}`" if where else "") + f"): {c.get('time_ms')} ms, "
        f"{float(c['percent_of_step']):.1f}{unit}" for c, api, where in rows)
    what = (f"{h.impact.get('value')}{unit} runs in custom calls: {listed}. XLA treats each "
            "as an opaque library call: it cannot fuse it with its neighbours, and its cost "
            "model counts it as 0 FLOPs, so no roofline or FLOP rate covers this time.")
    fixes: list[str] = []
    for c, api, where in rows:
        advice = _read_outputs_fix(c) or _CUSTOM_CALL_FIXES.get(api) or _CUSTOM_CALL_FIXES.get(
            str(c.get("linalg") or ""))
        if advice and not any(f.startswith(f"`{api}`") for f in fixes):
            fixes.append(f"`{api}`" + (f" at `{where}`" if where else "") + f": {advice}")
    fix = ("Make the library calls cheaper or rarer, biggest first: " + "; ".join(fixes) + "."
           if fixes else
           "Check that each custom call must run every step (hoist work on inputs that do not "
           "change out of the jitted step) and call it on batches rather than one item at a "
           "time.")
    return _finding(h, what, fix)


def _generic(h: Hypothesis, ctx: _Context) -> dict[str, Any]:
    if h.details.get("kind") == "custom_calls":
        return _custom_calls(h, ctx)
    text = str(h.details.get("suggestion") or h.title)
    return _finding(h, text, "Follow XProf's suggestion above; see the evidence for the metric.")


_FINDING_BUILDERS = {
    "host_bound": _host_bound,
    "layout_copy": _layout_copy,
    "unfused_reshape": _unfused_reshape,
    "convert_reduce": _convert_reduce,
    "memory_pressure": _memory_pressure,
    "data_transfer": _data_transfer,
    "memory_bound": _memory_bound,
    "compute_bound": _compute_bound,
    "idle": _idle,
    "communication": _communication,
}


def _first_sentence(text: str, limit: int = 320) -> str:
    """The fix's first sentence (the change to make), whole: when it is too long, without
    its parenthesised examples, and cut at a clause when still too long."""
    text = " ".join(text.split())
    sentence = _sentence(text)
    if len(sentence) <= limit:
        return sentence
    bare = " ".join(_without_asides(sentence).split()).replace(" ,", ",").replace(
        " .", ".").replace(" :", ":")
    if len(bare) <= limit:
        return bare
    cut = max(bare.rfind(", ", 0, limit), bare.rfind("; ", 0, limit))
    return (bare[:cut] if cut > 0 else bare[: limit - 1]).rstrip(",; ") + "."


def _sentence(text: str) -> str:
    depth = ticks = 0
    for i, ch in enumerate(text):
        if ch == "`":
            ticks += 1
        elif ticks % 2 == 0 and ch in "([":
            depth += 1
        elif ticks % 2 == 0 and ch in ")]":
            depth = max(0, depth - 1)
        elif (ch in ".;" and depth == 0 and ticks % 2 == 0 and text[i + 1:i + 2] == " "
              and not text[max(0, i - 3):i + 1].endswith(("e.g.", "i.e."))):
            return text[:i] + "."
    return text


def _without_asides(text: str) -> str:
    out, depth, ticks = [], 0, 0
    for ch in text:
        if ch == "`":
            ticks += 1
        if ticks % 2 == 0 and ch == "(":
            depth += 1
            continue
        if ticks % 2 == 0 and ch == ")" and depth:
            depth -= 1
            continue
        if depth == 0:
            out.append(ch)
    return "".join(out)


def _check_value(value: Any) -> str:
    return f"measured {value:.1f}%" if isinstance(value, float) else f"measured {value}"


def summarize(snapshot: Mapping[str, Any], triage: Triage, findings: list[dict[str, Any]]) -> str:
    """Three to five sentences: verdict, the top finding, key metrics, what was not judged."""
    m = triage.metrics
    device = snapshot.get("session", {}).get("device_type") or "unknown device"
    hosts = len(snapshot.get("session", {}).get("hosts") or [])
    sentences = []
    top = [f for f in findings if f["priority"] == "P0"] or findings
    if triage.status == "OPTIMAL":
        sentences.append(f"This {device} profile ({hosts} host(s)) looks healthy: every "
                         "OPTIMAL check passed with measured evidence.")
    elif top:
        n0 = sum(1 for f in findings if f["priority"] == "P0")
        n1 = sum(1 for f in findings if f["priority"] == "P1")
        sentences.append(f"This {device} profile ({hosts} host(s)) needs attention: "
                         f"{n0} P0 and {n1} P1 finding(s).")
        title, impact = top[0]["title"].rstrip("."), top[0]["impact"]
        value = impact.get("value")
        # The impact line adds to the title only when it states a number the title lacks.
        extra = "" if value is not None and f"{value:.1f}" in title else \
            f"; {impact.get('text')}"
        sentences.append(f"Top issue ({top[0]['priority']}): {title}{extra}.")
        fix = _first_sentence(str(top[0].get("fix") or ""))
        if fix:
            sentences.append(f"Fix first: {fix}")
    else:
        failed = [c for c in triage.checks if c.get("passed") is False]
        if failed:
            # A failed check is the reason for the verdict even when no finding names a cause.
            sentences.append(
                f"This {device} profile ({hosts} host(s)) needs attention although no finding "
                "names a cause: " + "; ".join(
                    f"the check \"{c['check']}\" failed ({_check_value(c['value'])}, "
                    f"target {c['target']}, "
                    f"from {c['source']})" for c in failed) + ".")
        else:
            sentences.append(f"No bottleneck was found in this {device} profile ({hosts} "
                             "host(s)), but health could not be confirmed from the data "
                             "available.")
    parts = []
    if m.get("step_time_ms") is not None:
        spread = m.get("step_time_spread") or {}
        extra = ""
        if spread.get("stddev_ms") is not None:
            extra = f" ± {spread['stddev_ms']:.2f} ms"
            if spread.get("outlier_count"):
                extra += (f" ({spread['outlier_count']} outlier step(s), up to "
                          f"{spread['max_ms']:.2f} ms)")
        parts.append(f"step time {m['step_time_ms']:.2f} ms{extra}")
    if m.get("device_idle_percent") is not None:
        window = " of the capture window" if m.get("device_idle_window") == "capture window" \
            else ""
        parts.append(f"device idle {m['device_idle_percent']:.1f}%{window}")
    if m.get("roofline_efficiency_percent") is not None:
        parts.append(f"roofline efficiency {m['roofline_efficiency_percent']:.2f}%")
    if m.get("peak_memory_gib") is not None:
        cap = m.get("memory_capacity_gib")
        peak = float(m["peak_memory_gib"])
        amount = f"{peak:.2f}" + (f" of {cap:.2f} GiB" if cap else " GiB")
        if not cap and peak < 0.1:
            amount = f"{peak * 1024:.1f} MiB"
        if m.get("peak_memory_source") == "get_peak_allocations":
            rule = " by the CPU rule" if m.get("oom_risk_rule") else ""
            program = f" ({m['peak_memory_program']})" if m.get("peak_memory_program") else ""
            which = "step program" if m.get("step_time_ms") is not None else "program"
            parts.append(f"live buffers of the largest {which}{program} {amount} (no "
                         f"device memory profile, OOM risk {m.get('oom_risk') or 'UNKNOWN'}"
                         f"{rule})")
        else:
            parts.append(f"peak memory {amount} (OOM risk {m['oom_risk']})")
    if parts:
        sentences.append("Measured: " + ", ".join(parts) + ".")
    if triage.not_judged:
        sentences.append("Could not be judged for lack of data: "
                         + "; ".join(f"whether {s.split(':')[0]}" if "is" in s.split(":")[0]
                                     else s.split(":")[0] for s in triage.not_judged) + ".")
    return " ".join(sentences[:5])
