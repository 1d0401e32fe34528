"""What a rule's finding is written from: the snapshot, the triage and the follow-up results,
and the readings of follow-up data that several rules' findings share.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.followups import HOST_PYTHON_EVENTS
from mldiag.analysis.judgement.model import Hypothesis, Triage

# A follow-up worth asking: (tool, purpose, arguments, key of its result in the Context).
Plan = tuple[str, str, dict[str, Any], str]

_PS_PER_MS = 1e9

_RUNTIME_HOST_EVENT = re.compile(
    r"stop_trace|start_trace|PjitFunction|PjRt|Execute|ThreadPool|Thunk|"
    r"block_until_ready|try_to_block|<module>|threading\.py|__exit__|__enter__",
)
# Frames of the measurement itself, never the workload's bottleneck: the profiler's (JAX's
# `profiler.py`, xprof), mldiag's SDK (`metrics.record`, its monitor and xspace writer) and
# JAX's traceback filter, which wraps every jitted call (`traceback_util.py
# reraise_with_filtered_traceback`), so its time is its callee's, compile included.
INSTRUMENTATION_HOST_EVENT = re.compile(
    r"traceback_util\.py|profiler\.py|xprof|_profiler|TraceAnnotation|trace_annotation|"
    r"\$(xspace|monitor|continuous|current|pull)\.py:|\$metrics\.py:\d+ (record|_\w+)|"
    r"\$run\.py:\d+ (start|stop|finish|_\w+)\b|mldiag",
)


def instrumentation_ps(snapshot: Mapping[str, Any], row: Mapping[str, Any]) -> float:
    """How much of a host-work row (an `aggregate_xplane_events` event) is instrumentation:
    all of it by its name (INSTRUMENTATION_HOST_EVENT), else the part collection found
    inside the profiler's or the SDK's frames or threads (mldiag.timeline
    `host_instrumentation.by_event`, `collection.xspace.instrumentation`): the `rmtree` of the
    SDK's upload, the `__float__` of a metric the SDK converts."""
    total = float(row.get("total_duration_ps") or 0.0)
    name = str(row.get("event", ""))
    if INSTRUMENTATION_HOST_EVENT.search(name):
        return total
    by_event = ev.get(snapshot, ev.TIMELINE, "host_instrumentation.by_event")
    if not isinstance(by_event, list):
        return 0.0
    found = next((r for r in by_event if isinstance(r, Mapping) and r.get("event") == name),
                 None)
    return min(total, float(found.get("instrumentation_ps") or 0.0)) if found else 0.0


def is_instrumentation(snapshot: Mapping[str, Any], row: Mapping[str, Any]) -> bool:
    """Whether at least half of a host-work row is instrumentation (`instrumentation_ps`)."""
    total = float(row.get("total_duration_ps") or 0.0)
    return total > 0 and instrumentation_ps(snapshot, row) >= 0.5 * total


class Context:
    """What a finding is written from: the snapshot, the triage, and the follow-up results by
    their plan's key."""

    def __init__(self, snapshot: Mapping[str, Any], triage: Triage) -> None:
        self.snapshot = snapshot
        self.triage = triage
        self.results: dict[str, dict[str, Any]] = {}

    def data(self, key: str) -> Any:
        rec = self.results.get(key)
        if rec is None or rec.get("status") != "DATA":
            return None
        return rec.get("data")


def neighborhood_plan(h: Hypothesis) -> Plan:
    """The follow-up of a detector finding: its op's producers and consumers, to place the fix."""
    d = h.details["detection"]
    return ("get_hlo_neighborhood",
            f"Show producers and consumers of {d['instruction']} to place the fix",
            {"instruction_name": d["instruction"], "module_name": d["module"], "radius": 1},
            f"hlo:{d['module']}:{d['instruction']}")


def host_events_plan() -> Plan:
    """The follow-up that names the host-side Python frames filling the device's waits."""
    return ("aggregate_xplane_events",
            "Find the host-side Python work that keeps the device waiting between steps",
            dict(HOST_PYTHON_EVENTS), "host_events")


def module_of(snapshot: Mapping[str, Any], op: str) -> str | None:
    """The HLO module that runs `op`, from the op profile's grouped operations."""
    groups = ev.get(snapshot, "get_hlo_op_profile", "grouped_operations", {}) or {}
    for ops in groups.values():
        for row in ops:
            parts = str(row.get("name", "")).split("/")
            if len(parts) >= 4 and parts[-1] == op:
                return parts[1]
    return None


def op_source(snapshot: Mapping[str, Any], op: str) -> list[dict[str, Any]]:
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


def finding_of(h: Hypothesis, what: str, fix: str, extra: list[dict[str, Any]] | None = None
               ) -> dict[str, Any]:
    """The finding of `h`: what it says, its evidence (the hypothesis's plus `extra`) and its
    fix, placed at the user's source line when the detection names one."""
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


def host_events(ctx: Context, step_ms: float, steps: int | None = None
                ) -> list[tuple[int, dict[str, Any]]]:
    """The host frames that fill the waits: at least 5% of each step (or of the window, with
    `step_ms` the window and `steps` 1), and shorter than one."""
    data = ctx.data("host_events")
    if not isinstance(data, Mapping):
        return []
    if steps is None:
        steps = ev.get(ctx.snapshot, ev.TIMELINE, "steps_analyzed") or 1
    picked = []
    for i, row in enumerate(data.get("aggregates", [])):
        name = str(row.get("event", ""))
        if _RUNTIME_HOST_EVENT.search(name):
            continue
        # The workload's part of the row: instrumentation is never the host work to remove.
        per_step = (float(row.get("total_duration_ps", 0)) - instrumentation_ps(
            ctx.snapshot, row)) / _PS_PER_MS / steps
        avg = float(row.get("avg_duration_ps", 0)) / _PS_PER_MS
        # Frames longer than a step enclose the loop itself, not the stall.
        if avg >= step_ms or per_step < 0.05 * step_ms:
            continue
        picked.append((i, row))
        if len(picked) == 3:
            break
    return picked


def instrumentation_events(ctx: Context, step_ms: float, steps: int | None = None) -> list[str]:
    """The instrumentation frames (profiler, mldiag's SDK, JAX's traceback filter) that
    would pass `host_events`' bar: named as such, never blamed."""
    data = ctx.data("host_events")
    if not isinstance(data, Mapping):
        return []
    if steps is None:
        steps = ev.get(ctx.snapshot, ev.TIMELINE, "steps_analyzed") or 1
    out = []
    for row in data.get("aggregates", []):
        name = str(row.get("event", ""))
        per_step = instrumentation_ps(ctx.snapshot, row) / _PS_PER_MS / steps
        avg = float(row.get("avg_duration_ps", 0)) / _PS_PER_MS
        if 0.05 * step_ms <= per_step and avg < step_ms:
            out.append(name.lstrip("$"))
    return out[:3]


def detector_source(d: Mapping[str, Any]) -> str:
    src = str(d.get("source") or "")
    return f" (source: {src})" if src else ""


def neighborhood(ctx: Context, d: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    key = f"hlo:{d.get('module')}:{d.get('instruction')}"
    data = ctx.data(key)
    if not isinstance(data, Mapping) or not data.get("text"):
        return "", []
    text = clean_hlo(str(data["text"]))
    lines = [ln.strip() for ln in text.splitlines() if "[dist=1]" in ln]
    if not lines:
        return "", []
    return (" Neighbours: " + "; ".join(ln.split("] ", 2)[-1][:160] for ln in lines[:3]) + ".",
            [hlo_excerpt(text)])


HLO_EXCERPT_CHARS = 800
HLO_EXCERPT_FROM = ("get_hlo_neighborhood text, without backend_config, metadata and "
                    f"frontend_attributes, its first {HLO_EXCERPT_CHARS} characters",)


def hlo_excerpt(cleaned: str) -> dict[str, Any]:
    """The evidence row of an HLO neighbourhood, cleaned (`clean_hlo`) and cut: mldiag's
    excerpt of xprof's text, so it is cited under its own name."""
    return {"tool": ev.HLO_EXCERPT, "field": "text", "value": cleaned[:HLO_EXCERPT_CHARS],
            "from": list(HLO_EXCERPT_FROM)}


def hlo_excerpt_of(neighborhood: Any) -> dict[str, Any] | None:
    """The excerpt that `hlo_excerpt` cites, from a get_hlo_neighborhood output."""
    if not isinstance(neighborhood, Mapping) or not neighborhood.get("text"):
        return None
    return {"text": clean_hlo(str(neighborhood["text"]))[:HLO_EXCERPT_CHARS]}

_SHAPE = re.compile(r"^[a-z]+\d*\[([\d,]*)\]")
_LINE = re.compile(r"^(?:ROOT )?(\S+) = (\S+) (\w[\w-]*)\(([^)]*)\)(.*)$")
_MATMUL = re.compile(r"kind=kOutput|kind=kCustom|__ynn_fusion|__cublas|gemm|dot|convolution")


def dims_of(shape: str) -> list[int] | None:
    """`f32[2048,64]{1,0}` → [2048, 64]."""
    m = _SHAPE.match(shape.strip())
    if not m:
        return None
    return [int(x) for x in m.group(1).split(",") if x]


def matmul_consumer(ctx: Context, d: Mapping[str, Any]
                    ) -> tuple[str, str, list[str]] | None:
    """The matmul (a dot, or a fusion around one) that consumes the flagged op, from its HLO
    neighbourhood: (its name, its output shape, its other operands)."""
    data = ctx.data(f"hlo:{d.get('module')}:{d.get('instruction')}")
    text = clean_hlo(str(data.get("text", ""))) if isinstance(data, Mapping) else ""
    op = str(d.get("instruction"))
    for ln in text.splitlines():
        if "[dist=1]" not in ln:
            continue
        m = _LINE.match(ln.split("] ", 2)[-1].strip())
        if not m:
            continue
        name, shape, opcode, operands, rest = m.groups()
        args = [a.strip() for a in operands.split(",") if a.strip()]
        if op in args and (opcode in ("dot", "convolution") or _MATMUL.search(rest)):
            return name, shape, [a for a in args if a != op]
    return None


def contraction_fix(ctx: Context, d: Mapping[str, Any]) -> str:
    """The contraction to write instead of transposing an operand before a matmul, derived
    from THIS op's HLO shapes: `x.T @ w` (x [k, m], w [k, n]) is
    `jnp.einsum('km,kn->mn', x, w)`; a reshape of the transposed operand is named with the
    shapes to contract over. Empty when no matmul consumes the op."""
    found = matmul_consumer(ctx, d)
    if found is None:
        return ""
    consumer, out_shape, others = found
    src = dims_of(str(d.get("input_shape") or ""))
    dst = dims_of(str(d.get("output_shape") or ""))
    out = dims_of(out_shape)
    if not src or not dst:
        return ""  # the detection names no shapes to derive the contraction from
    other = f"`{re.sub(r'[.]\d+$', '', others[0])}`" if others else "the other operand"
    if src and dst and out and len(src) == len(dst) == len(out) == 2 and src == dst[::-1] and (
            out[0] == dst[0]):
        k, m, n = src[0], src[1], out[1]
        return (f"`{d.get('instruction')}` materialises the transpose of a "
                f"{src[0]}x{src[1]} operand for the matmul `{consumer}` "
                f"(output {out[0]}x{out[1]}), i.e. `x.T @ w` with x [{k}, {m}] and w "
                f"[{k}, {n}]. Contract over the axis x already has: "
                f"`jnp.einsum('km,kn->mn', x, w)` or `jax.lax.dot_general(x, w, "
                "(((0,), (0,)), ((), ())))`, so the matmul reads x in place.")
    return (f"`{d.get('instruction')}` rearranges a {str(d.get('input_shape') or '').split('{')[0]}"
            f" array into {str(d.get('output_shape') or '').split('{')[0]} for the matmul "
            f"`{consumer}` (with {other}, output {out_shape.split('{')[0]}). Write that matmul "
            "as one `jnp.einsum` (or `jax.lax.dot_general` with explicit contracting and batch "
            f"dimensions) over the axes of the {str(d.get('input_shape') or '').split('{')[0]} "
            "array as it is produced, splitting axes only where the split keeps the minor "
            "axis in place (a free bitcast), so no transposing copy is needed.")


_BACKEND_CONFIG = re.compile(r",\s*(backend_config|metadata|frontend_attributes)=\{.*$")


def clean_hlo(text: str) -> str:
    """HLO lines without backend_config/metadata blobs, which bury the shapes."""
    return "\n".join(_BACKEND_CONFIG.sub("", ln) for ln in text.splitlines())
