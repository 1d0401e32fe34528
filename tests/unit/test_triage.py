"""Triage on the shapes real captures have: no step markers, idle-dominated windows, op
profiles that saw no op, CPU profiles without a memory capacity, checks without data."""

from __future__ import annotations

import copy
import html
from typing import Any

import pytest

from mldiag.analysis.judgement.readings import idle_sources
from mldiag.analysis.judgement.triage import NEEDS_ATTENTION, OPTIMAL, triage
from mldiag.analysis.report.summary import render_summary_html
from tests.helpers.snapshots import healthy_snapshot, tool_result


def _no_steps_idle_window(idle_fraction: float) -> dict[str, Any]:
    """A TPU capture without step markers: the overview has no idle figure, the op profile
    an IDLE row over the whole window."""
    s = healthy_snapshot()
    tools = s["tools"]
    tools["get_xprof_overview"]["data"]["performance_summary"] = {
        "device_duty_cycle_percent": f"{100 * (1 - idle_fraction):.1f}%"}
    tools["get_hlo_op_profile"] = tool_result({
        "total_profile_time_ms": 1000.0, "category_summary": [
            {"category": "IDLE", "fraction_of_total_time": idle_fraction,
             "total_self_time_ms": 1000.0 * idle_fraction, "top_op": "IDLE", "op_count": 1},
            {"category": "convolution fusion", "fraction_of_total_time": 1 - idle_fraction,
             "total_self_time_ms": 1000.0 * (1 - idle_fraction), "top_op": "fusion.1",
             "op_count": 3}]})
    return s


def test_idle_without_step_markers_comes_from_the_op_profile_idle_row() -> None:
    t = triage(_no_steps_idle_window(0.62))
    assert t.metrics["device_idle_percent"] == pytest.approx(62.0)
    assert t.metrics["device_idle_source"] == "op profile IDLE row"
    assert t.metrics["device_idle_window"] == t.metrics["judged_over"] == "capture window"
    idle = next(h for h in t.hypotheses if h.category == "idle")
    assert idle.priority == "P0" and "capture window" in idle.title
    assert idle.evidence[0]["field"] == "category_summary[category=IDLE].fraction_of_total_time"
    assert idle.evidence[0]["value"] == 0.62
    overhead = next(c for c in t.checks if c["check"].startswith("idle"))
    assert overhead["passed"] is False and overhead["value"] == pytest.approx(62.0)
    assert t.status == NEEDS_ATTENTION
    assert any("judged over the capture window" in n for n in t.not_judged)


def test_an_op_profile_that_saw_no_op_is_not_an_idle_source() -> None:
    s = _no_steps_idle_window(0.5)
    s["tools"]["get_hlo_op_profile"]["data"]["category_summary"] = [
        {"category": "IDLE", "fraction_of_total_time": 1.0, "total_self_time_ms": 600.0,
         "top_op": "IDLE", "op_count": 1}]
    s["tools"]["get_step_trace"] = tool_result({"summary": {"total_steps": 1, "idle_percent": 30.2},
                                          "host_bound_analysis": {"per_host": [
                                              {"busy_in_active_span_percent": 3.15,
                                               "active_span_ms": 953.3}]}})
    s["tools"]["get_xprof_overview"]["data"]["performance_summary"] = {}
    sources = [x.label for x in idle_sources(s, cpu=False)]
    assert sources == ["timeline (busy share of the active span)", "step trace (1 step)"]
    t = triage(s)
    assert t.metrics["device_idle_percent"] == pytest.approx(96.85)
    util = t.checks[0]
    assert util["value"] == pytest.approx(3.15) and "timeline" in util["source"]


def test_a_check_without_data_does_not_on_its_own_block_optimal() -> None:
    s = healthy_snapshot()
    for name in ("detect_layout_mismatch_copies", "detect_unfused_reshapes",
                 "detect_unnecessary_convert_reduce", "get_memory_profile"):
        del s["tools"][name]
    t = triage(s)
    assert t.status == OPTIMAL
    assert {c["check"] for c in t.checks if c["passed"] is None} == {
        "OOM risk is LOW", "no detector finding has a material impact"}
    assert len(t.not_judged) == 3  # the two checks, and the step time (no step markers)
    # ... but without evidence that the device computes, there is no OPTIMAL.
    del s["tools"]["get_hlo_op_profile"]
    s["tools"]["get_xprof_overview"]["data"]["performance_summary"].pop(
        "device_duty_cycle_percent")
    assert triage(s).status == NEEDS_ATTENTION


def _cpu(peak_mib: float, wait: float = 2.5) -> dict[str, Any]:
    return {"schema_version": "1.0", "session": {"hosts": ["h0"]}, "tools": {
        "get_xprof_overview": tool_result({"run_environment": {"device_type": "CPU"},
                                     "performance_summary": {}}),
        "get_step_trace": tool_result({"summary": {"total_steps": 40}, "host_bound_analysis": {
            "steps_analyzed": 40, "step_time_ms_average": 12.0, "host_wait_percent": wait,
            "host_wait_ms_average": 0.3, "compute_busy_ms_average": 11.7,
            "steps_mostly_waiting": 0}}),
        "get_peak_allocations": tool_result({"summary": {"top_modules": [
            {"module_name": "jit_step", "total_hbm_mib": peak_mib}]}}),
        "detect_layout_mismatch_copies": tool_result({"detections": []}),
    }}


def test_a_healthy_cpu_profile_is_optimal_by_the_stated_memory_rule() -> None:
    t = triage(_cpu(8.0))
    assert t.status == OPTIMAL, (t.checks, t.not_judged)
    oom = next(c for c in t.checks if c["check"] == "OOM risk is LOW")
    assert oom["passed"] is True and "0.5 GiB" in oom["target"]
    assert t.metrics["oom_risk"] == "LOW" and "CPU" in t.metrics["oom_risk_rule"]
    big = triage(_cpu(2048.0))
    assert big.metrics["oom_risk"] == "UNKNOWN"
    assert any(h.category == "memory_pressure" for h in big.hypotheses)
    assert triage(_cpu(8.0, wait=40.0)).status == NEEDS_ATTENTION


def test_the_report_shows_every_check_with_value_threshold_and_result() -> None:
    from mldiag.analysis.engine import build_analysis

    s = _no_steps_idle_window(0.62)
    t = triage(s)
    analysis = build_analysis(s, t, {"investigator": "rule-based", "findings": [],
                                     "hypotheses": [], "follow_ups": [], "summary": "x"})
    page = render_summary_html(analysis, s)
    assert "<h3>Health checks</h3>" in page
    for c in t.checks:
        assert c["check"] in page and html.escape(str(c["target"])) in page
    assert page.count("failed</span>") >= 1 and "Judged over the capture window" in page
    assert "of the capture window (op profile IDLE row)" in page
    healthy = copy.deepcopy(healthy_snapshot())
    ok = build_analysis(healthy, triage(healthy), {"investigator": "rule-based",
                                                    "findings": [], "hypotheses": [],
                                                    "follow_ups": [], "summary": "ok"})
    assert render_summary_html(ok, healthy).count("passed</span>") == 4


def _roofline(snapshot: dict[str, Any], **program: Any) -> dict[str, Any]:
    base = {"bound_by": "HBM", "roofline_efficiency_percent": "1.2%",
            "measured_flop_rate_gflops": 3.0, "measured_memory_bw_gibs": 20.0,
            "operational_intensity_flop_per_byte": 0.05,
            "bottleneck_operational_intensity_flop_per_byte": 0.07,
            "bound_by_ridge_point_flop_per_byte": 560.0, "flops_provenance": "xla_cost_model"}
    snapshot["tools"]["get_roofline_model"] = tool_result({"program": {**base, **program}})
    return snapshot


def test_no_roofline_bound_is_claimed_for_a_mostly_idle_device() -> None:
    t = triage(_roofline(_no_steps_idle_window(0.8)))
    assert not [h for h in t.hypotheses if h.category in ("memory_bound", "compute_bound")]
    assert any(n.startswith("roofline bound: the device is idle 80.0%") for n in t.not_judged)


def test_custom_calls_that_count_as_zero_flops_are_a_caveat_not_a_bound() -> None:
    t = triage(_roofline(healthy_snapshot(), flops_provenance="opaque_custom_call"))
    assert not [h for h in t.hypotheses if h.category == "memory_bound"]
    assert any("opaque_custom_call" in n for n in t.not_judged)
    some = triage(_roofline(healthy_snapshot(), has_opaque_custom_calls=True))
    (bound,) = [h for h in some.hypotheses if h.category == "memory_bound"]
    assert "0 FLOPs" in bound.impact["text"] and bound.details["caveats"]
    # The OI compared with the ridge is the bottleneck OI, as xprof's metric semantics say.
    assert any(e["field"] == "program.bottleneck_operational_intensity_flop_per_byte"
               for e in bound.evidence)


def test_the_tpu_fixture_impacts_are_shares_of_one_whole(tpu_snapshot: dict[str, Any]) -> None:
    t = triage(tpu_snapshot)
    shares = [h.impact["value"] for h in t.hypotheses
              if h.impact.get("unit") in ("% of step", "% of device time")
              and h.impact.get("value") is not None]
    assert sum(shares) <= 100.0 + 1e-6
    (bound,) = [h for h in t.hypotheses if h.category == "memory_bound"]
    # 4.35% for the program, but the copies are zero-FLOP: the fusions run near roofline.
    split = bound.details["ops_split"]
    assert split["moving_share_percent"] > 80 and split["computing_efficiency_percent"] > 80
    assert bound.priority == "P2" and "zero-FLOP" in bound.title
    assert bound.impact["overlap_trimmed_from"] == pytest.approx(95.65)


@pytest.fixture
def tpu_snapshot() -> dict[str, Any]:
    import json
    from pathlib import Path

    path = Path(__file__).parent / "data" / "health_snapshot_tpu.json"
    return dict(json.loads(path.read_text()))


def _detections(**by_tool: list[dict[str, Any]]) -> dict[str, Any]:
    s = healthy_snapshot()
    for tool, found in by_tool.items():
        s["tools"][tool] = tool_result({"detections": found, "modules_scanned": 1})
    return s


def test_one_op_gets_one_finding_with_every_cause() -> None:
    op = {"module": "jit_step", "instruction": "wrapped_transpose", "time_ms": 2.0,
          "percent_of_step": 20.0, "executed_in_profile": True, "description": "d"}
    s = _detections(detect_layout_mismatch_copies=[{**op, "description": "relayout"}],
                    detect_unfused_reshapes=[{**op, "description": "chain"}])
    found = [h for h in triage(s).hypotheses
             if h.category in ("layout_copy", "unfused_reshape")]
    assert len(found) == 1
    (h,) = found
    assert {c["category"] for c in h.details["causes"]} == {"layout_copy", "unfused_reshape"}
    assert "Layout-changing copy and Unfused reshape" in h.title


def test_a_chain_costs_the_sum_of_its_links() -> None:
    # As collect times it: the chain's links each found on the timeline, summed.
    chain = {"module": "jit_step", "instruction": "wrapped_transpose", "time_ms": 7.3,
             "percent_of_step": 73.0, "executed_in_profile": True, "description": "d",
             "chain": ["wrapped_transpose", "copy_bitcast_fusion", "copy_bitcast_fusion.1"],
             "links": [{"instruction": "wrapped_transpose", "time_ms": 1.9},
                       {"instruction": "copy_bitcast_fusion", "time_ms": 1.6},
                       {"instruction": "copy_bitcast_fusion.1", "time_ms": 3.8}]}
    (h,) = [h for h in triage(_detections(detect_unfused_reshapes=[chain])).hypotheses
            if h.category == "unfused_reshape"]
    assert h.impact["value"] == 73.0 and "3-link chain" in h.title
    assert sum(e["value"] for e in h.evidence if ".links[" in e["field"]) == pytest.approx(7.3)


def test_a_link_of_a_chain_is_not_a_finding_of_its_own() -> None:
    base = {"module": "jit_step", "executed_in_profile": True, "description": "d"}
    chain = {**base, "instruction": "wrapped_transpose", "time_ms": 4.0, "percent_of_step": 40.0,
             "chain": ["wrapped_transpose", "wrapped_copy"]}
    copy_ = {**base, "instruction": "wrapped_copy", "time_ms": 2.0, "percent_of_step": 20.0}
    s = _detections(detect_unfused_reshapes=[chain], detect_layout_mismatch_copies=[copy_])
    found = [h for h in triage(s).hypotheses if h.category in ("layout_copy", "unfused_reshape")]
    assert len(found) == 1 and found[0].impact["value"] == 40.0
    assert {c["category"] for c in found[0].details["causes"]} == {"layout_copy",
                                                                   "unfused_reshape"}


def test_step_time_spread_names_the_outlier_steps() -> None:
    from mldiag.analysis.collection.xspace.timeline import step_spread

    spread = step_spread([10.0, 10.2, 9.9, 10.1, 30.0, 10.0, 9.8, 14.0])
    assert spread is not None and spread["steps"] == 8
    assert spread["min_ms"] == 9.8 and spread["max_ms"] == 30.0 and spread["median_ms"] == 10.05
    assert [o["step_index"] for o in spread["outliers"]] == [4, 7]
    assert step_spread([5.0]) == {**step_spread([5.0]), "stddev_ms": 0.0, "outlier_count": 0}
    assert step_spread([]) is None
    # A pod's steps: the outlier is named by its host and its index there, not by its place
    # in the hosts' steps laid end to end (a step #23 that no host has).
    where = [(h, i) for h in ("host0", "host1") for i in range(4)]
    pod = step_spread([10.0, 10.2, 9.9, 10.1, 10.0, 9.8, 30.0, 10.1], where)
    assert pod is not None and pod["hosts"] == 2
    assert pod["outliers"] == [{"host": "host1", "step_index": 2, "step_time_ms": 30.0}]
    assert "hosts" not in spread
    s = _cpu(8.0)
    s["tools"]["get_step_trace"]["data"]["host_bound_analysis"]["step_time_spread"] = spread
    assert triage(s).metrics["step_time_spread"]["outlier_count"] == 2


def test_kernel_occupancy_shows_only_when_the_trace_recorded_it() -> None:
    def page(records: list[dict[str, Any]]) -> str:
        snap = {"tools": {"get_kernel_stats": {"status": "DATA", "data": records}}}
        text = render_summary_html({}, snap)
        return text[text.index('id="kernels"'):text.index('id="detectors"')]

    zero = [{"kernel_name": "k1", "occupancy_pct": 0.0, "total_duration_us": 5.0},
            {"kernel_name": "k2", "occupancy_pct": 0.0, "total_duration_us": 3.0}]
    assert "0.0%" not in page(zero) and "not recorded" in page(zero)
    real = [{"kernel_name": "k1", "occupancy_pct": 62.5, "total_duration_us": 5.0}]
    assert "62.5%" in page(real)


def test_memory_is_judged_on_the_program_that_ran_in_the_steps() -> None:
    s = _cpu(8.0)
    s["tools"]["get_peak_allocations"] = tool_result({"summary": {"top_modules": [
        {"module_name": "jit__init_weights(3)", "total_hbm_mib": 4096.0},
        {"module_name": "jit_step(20)", "total_hbm_mib": 8.0}]}, "modules": [
        {"module_name": "jit__init_weights(3)"}, {"module_name": "jit_step(20)"}]})
    s["tools"]["get_step_trace"]["data"]["host_bound_analysis"]["op_time_ms_by_program"] = {
        "20": {"dot.1": 9.0}}
    t = triage(s)
    # The 4 GiB setup program ran before the steps: the step's 8 MiB is what is judged.
    assert t.metrics["peak_memory_gib"] == pytest.approx(8.0 / 1024, abs=1e-4)
    assert t.status == OPTIMAL and not any(h.category == "memory_pressure"
                                           for h in t.hypotheses)


def _cpu_without_steps(busy_percent: float) -> dict[str, Any]:
    """An XLA:CPU capture with no step markers: only our timeline's active span."""
    s = healthy_snapshot()
    tools = s["tools"]
    tools["get_xprof_overview"]["data"]["run_environment"] = {"device_type": "CPU"}
    tools["get_xprof_overview"]["data"]["performance_summary"] = {}
    for name in ("get_hlo_op_profile", "get_roofline_model", "get_memory_profile"):
        tools[name] = {"status": "NO_DATA", "elapsed_ms": 1.0, "data": {"reason": "CPU"}}
    tools["get_step_trace"] = tool_result({"status": "NO_DATA", "host_bound_analysis": {
        "steps_analyzed": 0, "step_time_ms_average": None, "host_wait_percent": None,
        "per_host": [{"host": "h0", "steps": 0, "active_span_ms": 200.0,
                      "busy_in_active_span_percent": busy_percent}],
        "op_time_ms_by_program": {"7": {"fusion": 10.0}}, "programs_in_steps": []}})
    return s


def test_cpu_without_steps_is_judged_on_the_busy_share_of_the_window() -> None:
    t = triage(_cpu_without_steps(6.0))
    m = t.metrics
    assert m["device_idle_percent"] == pytest.approx(94.0)
    assert m["device_idle_window"] == "capture window" and m["step_time_ms"] is None
    util = next(c for c in t.checks if c["check"].startswith("compute utilization"))
    assert util["passed"] is False and util["value"] == pytest.approx(6.0)
    assert "capture window" in util["source"]
    idle = next(h for h in t.hypotheses if h.category == "idle")
    assert idle.priority == "P0" and idle.title == "Device idle 94.0% of the capture window"
    assert idle.impact["unit"] == "% of device time"
    # Our timeline's number, cited under its pass name with what it was computed from.
    assert idle.evidence[0]["tool"] == "mldiag.timeline" and idle.evidence[0]["from"]
    assert idle.evidence[0]["field"] == "per_host[0].busy_in_active_span_percent"
    busy = triage(_cpu_without_steps(97.0))
    assert not [h for h in busy.hypotheses if h.category == "idle"]
    assert next(c for c in busy.checks if c["check"].startswith("compute"))["passed"] is True


def test_memory_is_judged_on_a_program_that_ran_in_the_steps() -> None:
    s = _cpu_without_steps(97.0)
    hb = s["tools"]["get_step_trace"]["data"]["host_bound_analysis"]
    hb["op_time_ms_by_program"] = {"3": {"init": 900.0}, "7": {"fusion": 10.0}}
    s["tools"]["get_peak_allocations"] = tool_result({
        "summary": {"top_modules": [{"module_name": "jit_init(3)", "total_hbm_mib": 768.0},
                                    {"module_name": "jit_step(7)", "total_hbm_mib": 2.0}]},
        "modules": [{"module_name": "jit_init(3)"}, {"module_name": "jit_step(7)"}]})
    # Both ran in the capture; without steps the largest of them is judged...
    assert triage(s).metrics["peak_memory_program"] == "jit_init(3)"
    # ...but with steps, only the programs the steps ran.
    hb["programs_in_steps"] = ["7"]
    t = triage(s)
    assert t.metrics["peak_memory_program"] == "jit_step(7)"
    assert t.metrics["oom_risk"] == "LOW"
    assert not [h for h in t.hypotheses if h.category == "memory_pressure"]


def test_library_calls_with_a_fix_are_a_finding_and_no_caveat() -> None:
    s = _cpu_without_steps(97.0)
    s["tools"]["detect_layout_mismatch_copies"]["data"]["custom_calls"] = [
        {"module": "jit_step(7)", "instruction": "eigh.0", "target": "lapack_ssyevd_ffi",
         "linalg": "eigh", "source": "train.py:9 (jit(step)/jit(eigh)/eigh)",
         "time_ms": 120.0, "percent_of_step": 60.0, "share_of": "capture window"},
        {"module": "jit_step(7)", "instruction": "lu.0", "target": "lapack_sgetrf_ffi",
         "linalg": "lu", "source": "train.py:8 (jit(step)/jit(solve)/lu)",
         "time_ms": 10.0, "percent_of_step": 5.0, "share_of": "capture window"}]
    t = triage(s)
    h = next(h for h in t.hypotheses if h.details.get("kind") == "custom_calls")
    assert h.priority == "P1" and h.impact["value"] == pytest.approx(65.0)
    assert h.title.startswith("Library calls (eigh, solve) take 65.0% of device time")
    assert {e["field"] for e in h.evidence} >= {"custom_calls[0].percent_of_step",
                                                "custom_calls[0].target"}
    # The finding covers the calls, each with its own fix: no caveat beside it.
    assert not any(n.startswith("custom-call efficiency") for n in t.not_judged)
    # A call with no fix of its own is a note, not a P0-P2.
    for call in s["tools"]["detect_layout_mismatch_copies"]["data"]["custom_calls"]:
        call.update(linalg="", target="my_ffi_kernel",
                    source="train.py:9 (jit(step)/my_ffi_kernel)")
    t = triage(s)
    assert not [h for h in t.hypotheses if h.details.get("kind") == "custom_calls"]
    assert any(n.startswith("custom-call efficiency") for n in t.not_judged)
    s["tools"]["detect_layout_mismatch_copies"]["data"]["custom_calls"][0].update(
        linalg="eigh", target="lapack_ssyevd_ffi",
        source="train.py:9 (jit(step)/jit(eigh)/eigh)")
    s["tools"]["detect_layout_mismatch_copies"]["data"]["custom_calls"][0][
        "percent_of_step"] = 4.0
    assert not [h for h in triage(s).hypotheses if h.details.get("kind") == "custom_calls"]


def test_custom_call_fix_names_the_op_line_and_follows_the_outputs_read() -> None:
    from mldiag.analysis.judgement.context import Context
    from mldiag.analysis.judgement.rules import other

    s = _cpu_without_steps(97.0)
    s["tools"]["detect_layout_mismatch_copies"]["data"]["custom_calls"] = [
        {"module": "jit_step(7)", "instruction": "eigh.0", "target": "lapack_ssyevd_ffi",
         "linalg": "eigh", "source": "train.py:9 (jit(step)/jit(eigh)/eigh)",
         "outputs_read": [1], "time_ms": 120.0, "percent_of_step": 60.0,
         "share_of": "capture window"}]
    t = triage(s)
    h = next(h for h in t.hypotheses if h.details.get("kind") == "custom_calls")
    f = other.finding(h, Context(s, t))
    assert "`lapack_ssyevd_ffi`" in f["what"] and "opaque library call" in f["what"]
    assert f["fix"].startswith("Make the library calls cheaper or rarer, biggest first: "
                               "`eigh` at `train.py:9`: the eigenvectors (output 0) are never "
                               "read: call `jnp.linalg.eigvalsh`")
    s["tools"]["detect_layout_mismatch_copies"]["data"]["custom_calls"][0][
        "outputs_read"] = [0, 1]
    f = other.finding(h, Context(s, triage(s)))
    assert "eigenvectors are read" in f["fix"]


def test_large_step_memory_names_the_step_program_not_the_bigger_setup() -> None:
    from mldiag.analysis.judgement.context import Context
    from mldiag.analysis.judgement.rules import memory_pressure

    s = _cpu_without_steps(97.0)
    hb = s["tools"]["get_step_trace"]["data"]["host_bound_analysis"]
    hb["op_time_ms_by_program"] = {"3": {"init": 900.0}, "7": {"fusion": 10.0}}
    hb["programs_in_steps"] = ["7"]
    s["tools"]["get_peak_allocations"] = tool_result({
        "summary": {"top_modules": [{"module_name": "jit_init(3)", "total_hbm_mib": 2048.0},
                                    {"module_name": "jit_step(7)", "total_hbm_mib": 640.0}]},
        "modules": [
            {"module_name": "jit_init(3)", "total_hbm_mib": 2048.0,
             "top_buffers": [{"instruction": "table", "size_mib": 2048.0}]},
            {"module_name": "jit_step(7)", "total_hbm_mib": 640.0,
             "top_buffers": [{"instruction": "activations", "size_mib": 512.0}]}]})
    t = triage(s)
    h = next(h for h in t.hypotheses if h.category == "memory_pressure")
    assert "0.62 GiB" in h.title
    assert [e["value"] for e in h.evidence][:2] == ["jit_step(7)", 640.0]
    f = memory_pressure.finding(h, Context(s, t))
    assert "`jit_step(7)`" in f["what"] and "activations" in f["what"]
    assert "jit_init" not in f["what"]


def test_a_transpose_feeding_a_matmul_gets_an_einsum_fix() -> None:
    from mldiag.analysis.judgement.context import Context
    from mldiag.analysis.judgement.model import Hypothesis
    from mldiag.analysis.judgement.rules import layout_copy

    d = {"module": "jit_step(7)", "instruction": "add_tanh_fusion", "fused_with": ["add"],
         "source": "train.py:41 (jit(step)/transpose)",
         "description": "In jit_step(7), add_tanh_fusion transposes f32[2048,2048]."}
    h = Hypothesis("layout_copy", "P1", "t", [], {"value": 50.0, "unit": "% of step",
                                                  "text": ""},
                   {"detection": d, "tool": "detect_layout_mismatch_copies"})
    s = _cpu_without_steps(97.0)
    ctx = Context(s, triage(s))
    key = "hlo:jit_step(7):add_tanh_fusion"
    near = ("[dist=0] add_tanh_fusion = f32[2048,2048]{1,0} fusion(x.1, y.1)\n"
            "[dist=1] x.1 = f32[2048,2048]{1,0} parameter(0)\n")
    ctx.results[key] = {"status": "DATA", "data": {"text": near}}
    f = layout_copy.finding(h, ctx)
    assert f["fix"].startswith("At `train.py:41` (op `jit(step)/transpose`): Keep the step's "
                               "argument `x` (HLO `x.1`)")
    assert "Format(" not in f["fix"]
    ctx.results[key]["data"]["text"] = near + (
        "[dist=1] dot.2 = f32[2048,128]{1,0} dot(add_tanh_fusion, w.1)\n")
    f = layout_copy.finding(h, ctx)
    assert "Do not transpose the step's argument `x`" in f["fix"]
    assert "einsum('" not in f["fix"]  # no canned expression without the op's shapes
    # With the op's shapes, the contraction of THAT expression: x [2048, 2048], w [2048, 128].
    d.update(input_shape="f32[2048,2048]{0,1}", output_shape="f32[2048,2048]{1,0}")
    f = layout_copy.finding(h, ctx)
    assert "jnp.einsum('km,kn->mn', x, w)" in f["fix"] and "w [2048, 128]" in f["fix"]
