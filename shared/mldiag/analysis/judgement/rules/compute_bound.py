"""compute_bound: the program runs far below its roofline, bound by compute.

Raised by the roofline rule (`roofline.bound_hypotheses`) when xprof names a compute bound
and the efficiency is low; an upper bound on what could be gained.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement.context import Context, Plan, finding_of
from mldiag.analysis.judgement.model import Hypothesis
from mldiag.analysis.judgement.reading import SessionReading
from mldiag.analysis.judgement.roofline import bound_hypotheses

CATEGORY = "compute_bound"
RAISE_ORDER = 51


def hypotheses(reading: SessionReading) -> list[Hypothesis]:
    snapshot, metrics = reading.snapshot, reading.values
    return [h for h in bound_hypotheses(snapshot, metrics) if h.category == CATEGORY]


def follow_ups(snapshot: Mapping[str, Any], h: Hypothesis) -> list[Plan]:
    return []


def finding(h: Hypothesis, ctx: Context) -> dict[str, Any]:
    what = "The program is compute-bound but well below peak FLOP rate."
    fix = ("Check matmul shapes are multiples of 128 (TPU MXU) or 8/16 (GPU tensor cores), use "
           "bf16 inputs with `preferred_element_type=jnp.float32`, and increase batch size per "
           "device.")
    return finding_of(h, what, fix)
