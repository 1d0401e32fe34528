"""Pairing a recompiled program's ops by what they compute (`diff.pairing`): renamed fusions
pair up, a fusion whose boundary moved is one change with the time of every op it became, and
a change ranks first with its milliseconds rather than as a "new fusion" cancelled out by "the
other ops"."""

from __future__ import annotations

from typing import Any

import pytest

from mldiag.analysis.collection.hlo.digest import digest
from mldiag.analysis.diff.compare import build_diff
from mldiag.analysis.diff.pairing import SAME_CODE, SAME_COMPUTATION, facts, pair
from mldiag.analysis.diff.sides import Side
from tests.helpers.snapshots import analysis, cpu_snapshot

HEAD = "HloModule jit_step, entry_computation_layout={(f32[64,64]{1,0})->f32[64]{0}}\n\n"
# One fusion computing exp (line 5) and the reduce (line 6), and a small add (line 7).
BEFORE = HEAD + """fused_a {
  p = f32[64,64]{1,0} parameter(0)
  e = f32[64,64]{1,0} exponential(p)
  c = f32[] constant(0)
  ROOT r = f32[64]{0} reduce(e, c), dimensions={1}, to_apply=add_comp
}

add_comp {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

fused_b {
  q = f32[64]{0} parameter(0)
  ROOT t = f32[64]{0} add(q, q)
}

ENTRY main {
  p0 = f32[64,64]{1,0} parameter(0)
  fusion.1 = f32[64]{0} fusion(p0), kind=kLoop, calls=fused_a
  ROOT add_fusion = f32[64]{0} fusion(fusion.1), kind=kLoop, calls=fused_b
}
"""
# The recompile: exp is split out (`fusion.3`), the reduce keeps the name `fusion.1`, and the
# add fusion, unchanged, is renamed `add_fusion.2`.
AFTER = HEAD + """fused_x {
  p = f32[64,64]{1,0} parameter(0)
  ROOT e = f32[64,64]{1,0} exponential(p)
}

add_comp {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

fused_y {
  p = f32[64,64]{1,0} parameter(0)
  c = f32[] constant(0)
  ROOT r = f32[64]{0} reduce(p, c), dimensions={1}, to_apply=add_comp
}

fused_z {
  q = f32[64]{0} parameter(0)
  ROOT t = f32[64]{0} add(q, q)
}

ENTRY main {
  p0 = f32[64,64]{1,0} parameter(0)
  fusion.3 = f32[64,64]{1,0} fusion(p0), kind=kLoop, calls=fused_x
  fusion.1 = f32[64]{0} fusion(fusion.3), kind=kLoop, calls=fused_y
  ROOT add_fusion.2 = f32[64]{0} fusion(fusion.1), kind=kLoop, calls=fused_z
}
"""
SOURCES = {"e": "t.py:5 (jit(step)/exp)", "r": "t.py:6 (jit(step)/reduce_sum)",
           "s": "t.py:6 (jit(step)/reduce_sum)", "t": "t.py:7 (jit(step)/add)"}


def snapshot(text: str, step_ms: float, ops: dict[str, float], times: list[float]
             ) -> dict[str, Any]:
    snap = cpu_snapshot(step_ms=step_ms, wait_ms=0.5, ops=ops, hlo_text=text)
    snap["hlo_digests"] = [digest("jit_step(7)", text, SOURCES)]
    snap["tools"]["get_step_trace"]["data"]["step_breakdown"] = [
        {"step_num": f"train {i}", "step_time_ms": t} for i, t in enumerate(times)]
    return snap


def test_ops_pair_by_what_they_compute_not_by_their_names() -> None:
    a = facts(digest("m", BEFORE, SOURCES))
    b = facts(digest("m", AFTER, SOURCES))
    assert a is not None and b is not None
    found = pair(a, b)
    assert found.pairs == [("add_fusion", "add_fusion.2", SAME_COMPUTATION)]
    (group,) = found.groups
    # `fusion.1` of A is not `fusion.1` of B: the two computed different things.
    assert group.a == ["fusion.1"] and group.b == ["fusion.3", "fusion.1"]
    assert group.added == [] and group.removed == [] and group.retyped == []
    assert found.new == [] and found.removed == []


def test_the_same_code_on_other_shapes_pairs_as_such() -> None:
    bigger = BEFORE.replace("64,64", "128,64")
    a, b = facts(digest("m", BEFORE, SOURCES)), facts(digest("m", bigger, SOURCES))
    assert a is not None and b is not None
    found = pair(a, b)
    assert ("fusion.1", "fusion.1", SAME_CODE) in found.pairs and not found.groups


def test_a_moved_fusion_boundary_ranks_first_with_the_time_of_what_it_became() -> None:
    a = snapshot(BEFORE, 10.0, {"fusion.1": 8.0, "add_fusion": 1.5},
                 [10.1, 9.8, 10.3, 9.9, 10.0, 10.2])
    b = snapshot(AFTER, 14.0, {"fusion.3": 6.0, "fusion.1": 6.0, "add_fusion.2": 1.5},
                 [14.2, 13.9, 14.1, 13.8, 14.0, 14.3])
    doc = build_diff(Side("r/a", a, analysis(a)), Side("r/b", b, analysis(b)))
    top = doc["explanation"][0]
    assert top["kind"] == "fusion_change", doc["explanation"]
    # Scaled to the busy time (13.5 ms of 13.5 in B, 9.5 of 9.5 in A): 12 - 8 = +4 ms.
    assert top["delta_ms"] == pytest.approx(4.0, abs=1e-3)
    assert "t.py:5" in top["change"] and "`fusion.3`" in top["change"]
    # The renamed add fusion took the same time: no change, so not listed.
    assert [i["kind"] for i in doc["explanation"]] == ["fusion_change"]
    assert doc["kpis"][0]["significant"] is True
    row = doc["hlo"]["modules"][0]
    assert row["pairing"]["renamed"] == 1 and row["pairing"]["groups"][0]["b"] == [
        "fusion.3", "fusion.1"]
