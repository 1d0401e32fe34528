"""The judgement's priority rules in words, for an investigator that is a model: the same
thresholds the rules raise their hypotheses at, read from the rule modules."""

from __future__ import annotations

from mldiag.analysis.judgement import detections, readings
from mldiag.analysis.judgement.rules import host_bound, idle, straggler

PRIORITY_RULES = f"""\
- P0 (critical): host wait >= {host_bound.HOST_WAIT_P0_PERCENT:g}% of step; device idle >=
  {idle.IDLE_P0_PERCENT:g}%; data transfer or collectives >= \
{readings.OP_CATEGORY_P0_PERCENT:g}% of
  device time; a detector finding >= {detections.DETECTOR_P0_PERCENT:g}% of step; OOM risk HIGH.
- P1: host wait >= {host_bound.HOST_WAIT_P1_PERCENT:g}%; idle >= {idle.IDLE_P1_PERCENT:g}%; \
transfer or
  collectives >= {readings.OP_CATEGORY_P1_PERCENT:g}%; detector >= \
{detections.DETECTOR_P1_PERCENT:g}%; OOM risk
  MEDIUM; roofline efficiency below 10%.
- Pods (several hosts): a straggler (`mldiag.timeline pod.stragglers`) is P0 when the other
  hosts lose >= {straggler.LOST_P0_PERCENT:g}% of their step waiting for it, P1 at
  >= {straggler.LOST_P1_PERCENT:g}%.
  Collective time that is mostly waiting (`pod.collective_split.wait_percent` >= 50) is not
  a bandwidth problem: judge communication by its transfer share and point at the straggler.
- P2: anything smaller that is still worth fixing."""
