"""layout_copy: a copy that only changes an array's layout (a transpose made real).

Raised by the HLO detector `detect_layout_mismatch_copies`, with the other detectors'
categories (`detections.py`: one op, one finding); the follow-up shows the copy's neighbours,
and the fix depends on where the layout comes from (a jitted argument's layout, or `x.T`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement.context import (
    Context,
    Plan,
    contraction_fix,
    detector_source,
    finding_of,
    neighborhood,
    neighborhood_plan,
)
from mldiag.analysis.judgement.model import Hypothesis

CATEGORY = "layout_copy"
RAISE_ORDER = 70
DETECTOR = "detect_layout_mismatch_copies"
LABEL = "Layout-changing copy"


def follow_ups(snapshot: Mapping[str, Any], h: Hypothesis) -> list[Plan]:
    return [neighborhood_plan(h)]


def _fed_by_parameter(ctx: Context, d: Mapping[str, Any]) -> str | None:
    """The entry parameter that feeds the flagged instruction, if the neighbourhood shows one."""
    data = ctx.data(f"hlo:{d.get('module')}:{d.get('instruction')}")
    if not isinstance(data, Mapping):
        return None
    for line in str(data.get("text", "")).splitlines():
        body = line.split("] ", 2)[-1].strip()
        if "[dist=1]" in line and " parameter(" in body:
            return body.split(" = ", 1)[0]
    return None


def _consumes_by_dot(ctx: Context, d: Mapping[str, Any]) -> bool:
    """Whether the neighbourhood shows a dot or convolution consuming the flagged op."""
    data = ctx.data(f"hlo:{d.get('module')}:{d.get('instruction')}")
    text = str(data.get("text", "")) if isinstance(data, Mapping) else ""
    return any("[dist=1]" in ln and f"({d.get('instruction')}" in ln
               and (" dot(" in ln or " convolution(" in ln) for ln in text.splitlines())


def _transpose_fix(ctx: Context, d: Mapping[str, Any]) -> str:
    """The fix for a relayout that comes from a transpose in the user's code (`x.T`)."""
    param = _fed_by_parameter(ctx, d)
    # JAX names a jitted function's argument `x` in op metadata and `x.1` in the HLO.
    operand = (f"the step's argument `{re.sub(r'[.]\d+$', '', param)}` (HLO `{param}`)"
               if param else "the transposed operand")
    derived = contraction_fix(ctx, d)
    if derived:
        return derived
    if _consumes_by_dot(ctx, d):
        return (f"Do not transpose {operand} before the matmul: contract over its original "
                "axes with `jnp.einsum` subscripts or `jax.lax.dot_general` dimension numbers "
                "that name the axes it has, so the dot reads it in the layout it already "
                "has.")
    return (f"Keep {operand} in the order its consumer reads it instead of transposing it "
            "every step: store it transposed once where it is produced (outside the jitted "
            "step, pass `xt = x.T` computed once), or transpose the other, smaller or "
            "step-invariant operand instead; when the result feeds a matmul, contract over "
            "the original axes with `jnp.einsum`/`jax.lax.dot_general` rather than `x.T`.")


def finding(h: Hypothesis, ctx: Context) -> dict[str, Any]:
    d = h.details["detection"]
    near, extra = neighborhood(ctx, d)
    op_path = str(d.get("source") or "").partition(" (")[2].rstrip(")")
    if d.get("fused_with") or op_path.endswith("/transpose"):
        # The relayout is the user's `x.T` (op metadata says transpose), not an input format.
        what = f"{str(d.get('description', '')).rstrip('.')}{detector_source(d)}." + near
        return finding_of(h, what, _transpose_fix(ctx, d), extra)
    what = (f"`{d['instruction']}` in module `{d['module']}` rewrites "
            f"{d['input_shape']} into {d['output_shape']}: same elements, only the layout "
            f"changes ({d['input_layout']} → {d['output_layout']}){detector_source(d)}."
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
        fix = contraction_fix(ctx, d) or (
            f"This copy rewrites {d['input_shape']} into {d['output_shape']}: make the array "
            f"arrive in layout {d['output_layout']} where it is produced (the producer's "
            "output, or the `jax.device_put`/`in_shardings` layout of the argument), or "
            "store it once in that layout outside the jitted step, so the copy does not run "
            "every call.")
    return finding_of(h, what, fix, extra)
