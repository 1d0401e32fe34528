"""convert_reduce: a low-precision tensor is converted to f32 and kept before a reduce.

Raised by the HLO detector `detect_unnecessary_convert_reduce`, with the other detectors'
categories (`detections.py`: one op, one finding); the fix depends on the reducers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement.context import (
    Context,
    Plan,
    detector_source,
    finding_of,
    neighborhood,
    neighborhood_plan,
)
from mldiag.analysis.judgement.model import Hypothesis

CATEGORY = "convert_reduce"
RAISE_ORDER = 72
DETECTOR = "detect_unnecessary_convert_reduce"
LABEL = "Low-precision tensor converted to f32 before a reduce"


def follow_ups(snapshot: Mapping[str, Any], h: Hypothesis) -> list[Plan]:
    return [neighborhood_plan(h)]


def finding(h: Hypothesis, ctx: Context) -> dict[str, Any]:
    d = h.details["detection"]
    near, extra = neighborhood(ctx, d)
    description = str(d.get("description", "")).rstrip(".")
    what = f"{description}{detector_source(d)}." + near
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
    return finding_of(h, what, fix, extra)
