"""unfused_reshape: a reshape/transpose chain runs as its own kernel between two ops.

Raised by the HLO detector `detect_unfused_reshapes`, with the other detectors' categories
(`detections.py`: one op, one finding).
"""

from __future__ import annotations

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

CATEGORY = "unfused_reshape"
RAISE_ORDER = 71
DETECTOR = "detect_unfused_reshapes"
LABEL = "Unfused reshape/transpose chain"


def follow_ups(snapshot: Mapping[str, Any], h: Hypothesis) -> list[Plan]:
    return [neighborhood_plan(h)]


def finding(h: Hypothesis, ctx: Context) -> dict[str, Any]:
    d = h.details["detection"]
    near, extra = neighborhood(ctx, d)
    what = f"{d.get('description', '').rstrip('.')}{detector_source(d)}." + near
    fix = contraction_fix(ctx, d) or (
        "Collapse the `reshape`/`transpose` chain into the op that consumes it: keep the "
        f"tensor in the layout its consumer reads ({d.get('output_shape')}) where it is "
        "produced, or fold the rearrangement into the consumer's own indexing "
        "(`jnp.einsum` subscripts, `jax.lax.dot_general` dimension numbers, a reduction's "
        "`axis`), instead of materialising it between the two ops.")
    return finding_of(h, what, fix, extra)
