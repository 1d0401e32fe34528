"""The findings golden's cases: health snapshots recorded from real analyses with the
follow-up calls the investigator made on them (tests/unit/data/findings_golden/), some with
one deliberate edit, and the rule-based judgement of each."""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mldiag.analysis.judgement.followups import FollowUps
from mldiag.analysis.judgement.investigator import RuleBasedInvestigator
from mldiag.analysis.judgement.triage import triage
from mldiag.analysis.judgement.verdict import conclude

DATA = Path(__file__).resolve().parents[1] / "unit" / "data" / "findings_golden"
RECORDED = sorted(p.name.removesuffix(".json.gz") for p in DATA.glob("*.json.gz"))


def _compute_bound(s: dict[str, Any]) -> None:
    s["tools"]["get_roofline_model"]["data"]["program"]["bound_by"] = "Compute"


def _oom_high(s: dict[str, Any]) -> None:
    s["tools"]["get_memory_profile"]["data"]["peak_memory_usage_gib"] = 30.5


def _suggestions(s: dict[str, Any]) -> None:
    s["tools"]["get_smart_suggestions"]["data"]["suggestions"] = [
        {"suggestion": "Consider increasing the batch size."}, {"text": "Use bf16."}]


def _mixed_detectors(s: dict[str, Any]) -> None:
    tools = s["tools"]
    (copy,) = [d for d in tools["detect_layout_mismatch_copies"]["data"]["detections"]
               if d["executed_in_profile"]]
    # The same op read by a second detector (one finding, both causes), an untimed one
    # (P2, impact not measured) and small timed ones (P2, or dropped under 1%).
    same_op = dict(copy, detector="detect_unnecessary_convert_reduce", percent_of_step=12.5,
                   description="A convert feeds a reduce (reducers: add).")
    untimed = dict(copy, instruction="copy.9", percent_of_step=None, time_ms=None)
    small = dict(copy, instruction="copy.7", percent_of_step=2.0, time_ms=0.5)
    tiny = dict(copy, instruction="copy.8", percent_of_step=0.4, time_ms=0.1)
    tools["detect_layout_mismatch_copies"]["data"]["detections"] += [untimed, small, tiny]
    tools["detect_unnecessary_convert_reduce"]["data"]["detections"] = [same_op]
    tools["detect_unfused_reshapes"]["data"]["detections"] = [
        dict(copy, detector="detect_unfused_reshapes", instruction="fusion.3", chain=[
            "fusion.3", "copy.7"], percent_of_step=39.23, description="A reshape chain.")]


def _custom_call_row(s: dict[str, Any], name: str, category: str, provenance: str,
                     share: str, self_ms: float, eff: str, compute: str, calls: int,
                     target: str, source: str) -> None:
    """A custom call put at the top of the TPU fixture's roofline and op profile, as xprof
    writes it (its efficiency one call's FLOPs over all calls' time when shape-derived)."""
    roof = s["tools"]["get_roofline_model"]["data"]
    roof["top_operations"].insert(0, {
        "name": name, "category": category, "flops_provenance": provenance, "rank": 0,
        "bound_by": "Compute" if provenance != "opaque_custom_call" else "CustomCall (opaque)",
        "total_self_time_ms": self_ms, "total_self_time_percent": share,
        "roofline_efficiency_percent": eff, "compute_efficiency_percent": compute,
        "max_mem_bw_utilization_percent": "0.50%", "source_info": source,
        "optimal_flop_rate_gflops": 918000.0, "hlo_module_id": "1",
        "bottleneck_operational_intensity_flop_per_byte": 700.0})
    ops = s["tools"]["get_hlo_op_profile"]["data"]["grouped_operations"]
    ops.setdefault("custom-call", []).append({
        "name": f"by_program/jit_step(1)/custom-call/{name}", "category": "custom-call",
        "occurrences": calls, "total_self_time_ms": self_ms, "flops": 0.0,
        "bytes_accessed": 0.0, "flops_provenance": provenance})
    calls_found = s["tools"]["detect_layout_mismatch_copies"]["data"].setdefault(
        "custom_calls", [])
    calls_found.append({"instruction": name, "target": target, "module": "jit_step(1)",
                        "source": source, "time_ms": self_ms, "percent_of_step": None})


def _pallas_derived(s: dict[str, Any]) -> None:
    # A Pallas matmul run 3 times: xprof's 3.99% is one call's FLOPs over 3 calls' time.
    _custom_call_row(s, "matmul_kernel", "custom-call", "derived_from_shapes", "45.00%",
                     0.6, "3.99%", "3.99%", 3, "tpu_custom_call", "pallas_matmul.py:41")
    s["tools"]["get_roofline_model"]["data"]["program"]["flops_provenance"] = "mixed"


def _pallas_microbenchmark(s: dict[str, Any]) -> None:
    # A kernel micro-benchmark: 3 calls of one Pallas kernel in a 0.6 ms window, no steps,
    # nothing else on the device. The kernel's efficiency is the finding; the gaps around
    # its calls are not judged, and the program's bound is the kernel's.
    _custom_call_row(s, "matmul_optimized.1", "custom-call", "derived_from_shapes", "70.00%",
                     0.42, "3.99%", "3.99%", 3, "tpu_custom_call", "bench.py:12")
    tools = s["tools"]
    roof = tools["get_roofline_model"]["data"]
    roof["top_operations"] = roof["top_operations"][:1]
    roof["program"]["flops_provenance"] = "derived_from_shapes"
    ops = tools["get_hlo_op_profile"]["data"]
    ops["grouped_operations"] = {"custom-call": ops["grouped_operations"]["custom-call"][-1:]}
    ops["category_summary"] = [
        {"category": "custom-call", "fraction_of_total_time": 0.7, "total_self_time_ms": 0.42,
         "top_op": "matmul_optimized.1", "op_count": 1},
        {"category": "IDLE", "fraction_of_total_time": 0.3, "total_self_time_ms": 0.18,
         "top_op": "IDLE", "op_count": 1}]
    ops["total_profile_time_ms"] = 0.6
    tools["get_xprof_overview"]["data"]["performance_summary"][
        "device_idle_time_percent"] = "30.0%"
    tools["detect_layout_mismatch_copies"]["data"]["detections"] = []


def _opaque_attention(s: dict[str, Any]) -> None:
    # TE fused attention, opaque to xprof: a note, not a P0-P2.
    _custom_call_row(s, "te_fused_attn_forward_ffi", "custom-call", "opaque_custom_call",
                     "56.54%", 120.0, "0.50%", "0.00%", 8, "te_fused_attn_forward_ffi",
                     "model.py:88")
    s["tools"]["get_roofline_model"]["data"]["program"]["has_opaque_custom_calls"] = True


def _library_gemm(s: dict[str, Any]) -> None:
    # A hipBLASLt GEMM with shape-derived FLOPs, called once.
    _custom_call_row(s, "custom-call.7", "custom-call", "derived_from_shapes", "40.00%",
                     9.5, "12.00%", "12.00%", 1, "__cublas$lt$matmul", "train.py:120")


# Recorded cases with one deliberate edit, for the rules the recordings do not reach.
VARIANTS = {
    "variant_tpu_compute_bound": ("fixture_tpu_inference_2", _compute_bound),
    "variant_tpu_oom_high": ("fixture_tpu_inference_2", _oom_high),
    "variant_tpu_suggestions": ("fixture_tpu_inference_2", _suggestions),
    "variant_cpu_mixed_detectors": ("planted_layout_copy", _mixed_detectors),
    "variant_tpu_pallas_derived": ("fixture_tpu_inference_2", _pallas_derived),
    "variant_tpu_pallas_microbenchmark": ("fixture_tpu_inference_2", _pallas_microbenchmark),
    "variant_tpu_opaque_attention": ("fixture_tpu_inference_2", _opaque_attention),
    "variant_gpu_library_gemm": ("fixture_tpu_inference_2", _library_gemm),
}
CASES = sorted([*RECORDED, *VARIANTS])


class ReplayedFollowUps(FollowUps):
    """The recorded follow-ups, answered by tool and arguments. On a recorded case a call the
    recording does not hold fails the test (the investigator asks for something it did not
    ask before); on an edited one it answers NO_DATA."""

    def __init__(self, recorded: list[dict[str, Any]], strict: bool) -> None:
        super().__init__(session=None, max_calls=4)  # type: ignore[arg-type]
        self.recorded = {self._key(r["tool"], r["args"]): r for r in recorded}
        self.strict = strict

    @staticmethod
    def _key(tool: str, args: Mapping[str, Any]) -> str:
        return json.dumps([tool, args], sort_keys=True)

    def call(self, tool: str, purpose: str, **args: Any) -> dict[str, Any]:
        key = self._key(tool, args)
        assert key in self.recorded or not self.strict, f"follow-up not recorded: {key}"
        record = dict(self.recorded.get(key) or {"tool": tool, "args": args, "purpose": purpose,
                                                 "status": "NO_DATA", "data": None})
        self.records.append(record)
        return record


def case_inputs(case: str) -> tuple[dict[str, Any], ReplayedFollowUps]:
    """A case's snapshot (a variant's edited) and its recorded follow-ups, replayed (strictly
    for a recorded case: a call the recording lacks fails)."""
    base, edit = VARIANTS.get(case, (case, None))
    with gzip.open(DATA / f"{base}.json.gz", "rt") as f:
        recorded = json.load(f)
    snapshot = recorded["snapshot"]
    if edit is not None:
        edit(snapshot)
    return snapshot, ReplayedFollowUps(recorded["follow_ups"], strict=edit is None)


def judge(case: str) -> dict[str, Any]:
    snapshot, follow_ups = case_inputs(case)
    t = triage(snapshot)
    report = RuleBasedInvestigator().investigate(snapshot, t, follow_ups)
    keys = ("id", "category", "priority", "title", "what", "evidence", "impact", "fix")
    # What the page says: the verdict, checks and summary of the final list.
    story = conclude(t, report["findings"])
    return {
        "status": story.status, "triage_status": t.status, "metrics": t.metrics,
        "checks": story.checks, "not_judged": t.not_judged,
        "follow_ups": [[r["tool"], r["args"]] for r in report["follow_ups"]],
        "findings": [{k: f[k] for k in keys} for f in story.findings],
        "summary": story.summary,
    }
