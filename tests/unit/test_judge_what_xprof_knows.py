"""The judgement judges what xprof knows: FLOPs by xprof's per-op provenance, fixes by op
kind, priorities as recoverable time, and compile, warm-up and instrumentation named as such.

The TPU/GPU cases are the findings golden's edited fixture snapshots (a Pallas kernel with
shape-derived FLOPs run 3 times, opaque TE fused attention, a library GEMM); the CPU ones are
built here (synthetic timelines and HLO neighbourhoods) or captured in tests/e2e.
"""

from __future__ import annotations

import copy
import gzip
import json
from typing import Any

import numpy as np

from mldiag.analysis.collection.xspace.timeline import warmup_split
from mldiag.analysis.judgement.context import Context, contraction_fix, host_events
from mldiag.analysis.judgement.triage import triage
from tests.helpers.findings import DATA, judge


def _by_category(case: str, category: str) -> list[dict[str, Any]]:
    return [f for f in judge(case)["findings"] if f["category"] == category]


def test_a_shape_derived_pallas_kernel_is_judged_per_call() -> None:
    got = judge("variant_tpu_pallas_derived")
    (kernel,) = [f for f in got["findings"] if "matmul_kernel" in f["title"]]
    # xprof's 3.99% is one call's FLOPs over three calls' time: over its calls, 11.97%.
    assert "11.97%" in kernel["title"] and "3 calls" in kernel["title"]
    assert "3.99%" in kernel["impact"]["text"]
    assert "BlockSpec" in kernel["fix"] and "pallas_matmul.py:41" in kernel["fix"]
    assert not any(n.startswith("custom-call efficiency") for n in got["not_judged"])


def test_an_opaque_fused_attention_call_is_a_note_not_a_priority() -> None:
    got = judge("variant_tpu_opaque_attention")
    assert not any("te_fused_attn" in f["title"] or "te_fused_attn" in f["what"]
                   for f in got["findings"])
    (note,) = [n for n in got["not_judged"] if n.startswith("custom-call efficiency")]
    assert "te_fused_attn_forward_ffi" in note and "fused attention" in note
    assert "56.5%" in note


def test_each_op_kind_gets_its_own_fix() -> None:
    gemm = next(f for f in _by_category("variant_gpu_library_gemm", "other")
                if "custom-call.7" in f["title"])
    pallas = next(f for f in _by_category("variant_tpu_pallas_derived", "other")
                  if "matmul_kernel" in f["title"])
    assert "library GEMM" in gemm["fix"] and "train.py:120" in gemm["fix"]
    assert "BlockSpec" not in gemm["fix"] and "multiples of 16" in gemm["fix"]
    assert gemm["fix"].split(":", 1)[1] != pallas["fix"].split(":", 1)[1]
    # The memory-bound fix names the HBM-bound ops found: copies on the TPU fixture, not a
    # Python loop of `x + b` / `jnp.maximum`.
    (mem,) = _by_category("fixture_tpu_inference_2", "memory_bound")
    assert "copy-done" in mem["fix"] and "jnp.maximum" not in mem["fix"]


def test_no_fix_speaks_of_steps_in_a_trace_without_steps() -> None:
    for case in ("fixture_tpu_inference_2", "planted_no_step_markers"):
        got = judge(case)
        assert got["metrics"]["step_time_ms"] is None
        for f in got["findings"]:
            assert "between steps" not in f["fix"], (case, f["fix"])
            assert "per-step" not in f["fix"], (case, f["fix"])


def test_the_chain_fix_is_derived_from_its_own_hlo_not_a_canned_einsum() -> None:
    (chain,) = _by_category("planted_unfused_reshape", "unfused_reshape")
    assert "bhqd" not in chain["fix"]
    assert "f32[2048,2048]" in chain["fix"] and "ynn_fusion" in chain["fix"]


def _ctx_with_neighbourhood(text: str) -> Context:
    ctx = Context({"tools": {}}, triage({"tools": {}, "session": {}}))
    ctx.results["hlo:jit_step(3):transpose_fusion"] = {"status": "DATA", "data": {"text": text}}
    return ctx


def test_a_transpose_feeding_a_matmul_gets_the_einsum_of_that_expression() -> None:
    # `x.T @ w` with x f32[2048,1536] and w f32[2048,256], as XLA:CPU's HLO shows it.
    ctx = _ctx_with_neighbourhood(
        "Neighborhood of 'transpose_fusion' (radius=1):\n"
        "  [dist=0] [main.1] transpose_fusion = f32[1536,2048]{1,0} fusion(x.1), kind=kLoop\n"
        "  [dist=1] [main.1] x.1 = f32[2048,1536]{1,0} parameter(0)\n"
        "  [dist=1] [main.1] ROOT ynn_fusion = f32[1536,256]{1,0} fusion(transpose_fusion, "
        "w.1), kind=kCustom, calls=fused_computation\n")
    d = {"module": "jit_step(3)", "instruction": "transpose_fusion",
         "input_shape": "f32[2048,1536]{1,0}", "output_shape": "f32[1536,2048]{1,0}"}
    fix = contraction_fix(ctx, d)
    assert "jnp.einsum('km,kn->mn', x, w)" in fix
    assert "x [2048, 1536]" in fix and "w [2048, 256]" in fix
    assert "(((0,), (0,)), ((), ()))" in fix


def test_instrumentation_frames_are_never_the_culprit() -> None:
    ctx = Context({"tools": {}}, triage({"tools": {}, "session": {}}))
    rows = [("$traceback_util.py:190 reraise_with_filtered_traceback", 40e9),
            ("$metrics.py:88 record", 30e9), ("$train.py:12 load_batch", 20e9)]
    ctx.results["host_events"] = {"status": "DATA", "data": {"aggregates": [
        {"event": e, "total_duration_ps": t * 8, "avg_duration_ps": t, "count": 8}
        for e, t in rows]}}
    picked = [row["event"] for _, row in host_events(ctx, step_ms=100.0, steps=8)]
    assert picked == ["$train.py:12 load_batch"]


def test_compile_and_warmup_steps_are_left_out() -> None:
    ms = 1e6
    steps = np.array([[0, 3900 * ms], [3900 * ms, 3908 * ms], [3908 * ms, 3916 * ms],
                      [3916 * ms, 3924 * ms]], dtype=float)
    compiles = np.array([[10 * ms, 3800 * ms]])
    kept, gone = warmup_split(steps, compiles)
    assert len(kept) == 3 and gone[0]["step_index"] == 0
    assert gone[0]["reason"] == "compilation" and gone[0]["compile_ms"] == 3790.0
    # A leading outlier without a compile event is warm-up; a late slow step is not.
    steps[3, 1] = 3940 * ms
    kept, gone = warmup_split(steps, np.zeros((0, 2)))
    assert [g["step_index"] for g in gone] == [0] and "warm-up" in gone[0]["reason"]
    # Never every step.
    kept, gone = warmup_split(steps[:2], np.array([[0.0, 3908 * ms]]))
    assert len(kept) == 1


def test_a_short_window_is_named_and_its_idle_is_not_a_finding() -> None:
    with gzip.open(DATA / "fixture_tpu_inference_2.json.gz", "rt") as f:
        snapshot = copy.deepcopy(json.load(f)["snapshot"])
    op = snapshot["tools"]["get_hlo_op_profile"]["data"]
    op["total_profile_time_ms"] = 0.6
    for rows in op["grouped_operations"].values():
        for row in rows:
            row["occurrences"] = 0
    op["grouped_operations"]["loop fusion"][0]["occurrences"] = 3
    t = triage(snapshot)
    assert any(n.startswith("short window") and "0.6 ms" in n and "3 op" in n
               for n in t.not_judged)
    assert not any(h.category == "idle" for h in t.hypotheses)
