import copy
import json
import re
from html import unescape
from pathlib import Path
from typing import Any

import pytest

from mldiag.analysis.report.summary import render_summary_html
from tests.helpers.html import (
    IMG,
    IMG_ESCAPED,
    SCRIPT,
    SCRIPT_ESCAPED,
    assert_safe_document,
    cpu_inputs,
)

DATA = Path(__file__).parent / "data"
SVG_LEAVES = {"rect", "line", "polyline", "circle", "path"}


@pytest.fixture
def analysis() -> dict[str, Any]:
    return json.loads((DATA / "analysis_tpu.json").read_text())


@pytest.fixture
def snapshot() -> dict[str, Any]:
    return json.loads((DATA / "health_snapshot_tpu.json").read_text())


def _metric_value(page: str, label: str) -> str:
    match = re.search(
        rf'<div class="label">{re.escape(label)}</div><div class="value">(.*?)</div>', page
    )
    assert match, f"no metric card {label!r}"
    return match.group(1)


def test_example_renders_a_safe_self_contained_document(analysis, snapshot):
    page = render_summary_html(analysis, snapshot)

    assert_safe_document(page)
    assert "<style>" in page
    assert "NEEDS_ATTENTION" in page
    assert "copy-done dominates device time (83.6%)" in page
    # The tool error from the contract example carries markup of its own.
    assert "example error text &lt;script&gt;" in page


def test_every_section_heading_is_present(analysis, snapshot):
    page = render_summary_html(analysis, snapshot)

    for heading in (
        "Analysis summary",
        "Prioritized bottlenecks",
        "Detailed tool analysis",
        "Roofline",
        "Memory",
        "HLO op profile",
        "Kernel statistics",
        "Our detectors",
        "Custom kernels and LLO",
        "Provenance",
    ):
        assert re.search(rf"<h[23]>{re.escape(heading)}</h[23]>", page), heading
    for label in ("What's happening", "Evidence", "Expected impact &amp; fix"):
        assert label in page


def test_hostile_profile_strings_appear_only_escaped(analysis, snapshot):
    analysis["summary"] = f"Summary {SCRIPT}"
    analysis["session"]["path"] = f"/tmp/{IMG}"
    analysis["session"]["run"] = SCRIPT
    analysis["not_judged"] = [IMG]
    finding = analysis["findings"][0]
    finding["title"] = SCRIPT
    finding["what"] = IMG
    finding["fix"] = f"use `{SCRIPT}` instead"
    finding["category"] = IMG
    finding["evidence"].append({"tool": IMG, "field": SCRIPT, "value": IMG})
    analysis["tools"][0]["error"] = IMG
    analysis["follow_ups"][0]["args"] = {"instruction_name": SCRIPT}
    analysis["follow_ups"][0]["result_summary"] = IMG
    tools = snapshot["tools"]
    tools["get_roofline_model"]["data"]["top_operations"][4]["name"] = SCRIPT
    tools["get_roofline_model"]["data"]["top_operations"][5]["category"] = IMG
    tools["get_hlo_op_profile"]["data"]["category_summary"][0]["category"] = SCRIPT
    tools["get_hlo_op_profile"]["data"]["grouped_operations"]["copy-done"][0]["name"] = (
        f"by_program/{IMG}/copy-done/{SCRIPT}"
    )
    tools["get_peak_allocations"]["data"]["modules"][0]["module_name"] = IMG
    tools["get_peak_allocations"]["data"]["modules"][0]["top_buffers"][0]["instruction"] = SCRIPT
    tools["detect_unfused_reshapes"] = {
        "name": "detect_unfused_reshapes",
        "status": "DATA",
        "elapsed_ms": 3.0,
        "data": {
            "detections": [
                {
                    "module": IMG,
                    "instruction": SCRIPT,
                    "opcode": "reshape",
                    "shapes": [IMG],
                    "layouts": [SCRIPT],
                    "description": IMG,
                }
            ]
        },
    }
    tools["get_utilization_viewer"] = {
        "name": "get_utilization_viewer",
        "status": "ERROR",
        "elapsed_ms": 1.0,
        "error": SCRIPT,
    }

    page = render_summary_html(analysis, snapshot)

    assert_safe_document(page)
    assert SCRIPT not in page
    assert IMG not in page
    assert page.count(SCRIPT_ESCAPED) >= 8
    assert page.count(IMG_ESCAPED) >= 6
    # The backticked hostile snippet becomes code, with its content still escaped.
    assert f"<code>{SCRIPT_ESCAPED}</code>" in page


def test_findings_are_ordered_p0_then_p1_then_p2_and_by_impact(analysis, snapshot):
    base = analysis["findings"][0]

    def finding(title: str, priority: str, impact: float) -> dict[str, Any]:
        item = copy.deepcopy(base)
        item.update(title=title, priority=priority)
        item["impact"] = {"value": impact, "unit": "ms", "text": f"{impact} ms"}
        return item

    analysis["findings"] = [
        finding("minor layout copy", "P2", 50.0),
        finding("small idle gap", "P1", 3.0),
        finding("host bound input", "P0", 10.0),
        finding("large idle gap", "P1", 30.0),
    ]

    page = render_summary_html(analysis, snapshot)

    positions = [
        page.index(title)
        for title in ("host bound input", "large idle gap", "small idle gap", "minor layout copy")
    ]
    assert positions == sorted(positions)


def test_fix_backticks_render_as_code(analysis, snapshot):
    analysis["findings"][0]["fix"] = "Call `jax.device_put(x, device)` once."

    page = render_summary_html(analysis, snapshot)

    assert "<code>jax.device_put(x, device)</code>" in page


def test_null_metric_renders_na_not_zero(analysis, snapshot):
    analysis["metrics"]["device_idle_percent"] = None

    page = render_summary_html(analysis, snapshot)

    step = _metric_value(page, "Step time")
    idle = _metric_value(page, "Device idle")
    assert "n/a" in step and "n/a" in idle
    assert "0" not in re.sub(r"<[^>]+>", "", step + idle)
    assert "not measured" in page
    assert _metric_value(page, "Roofline efficiency") == "4.35%"
    assert "20.02 GiB" in _metric_value(page, "Peak memory")


def test_xprof_minus_one_values_render_as_unavailable(analysis, snapshot):
    snapshot["tools"]["get_memory_profile"]["data"] = {
        "memory_capacity_gib": -1.0,
        "peak_memory_usage_gib": -1.0,
        "peak_usage_details": {
            "stack_reservation_gib": -1.0,
            "heap_allocation_gib": -1.0,
            "free_memory_gib": -1.0,
            "fragmentation_percent": -1.0,
            "utilization_percent": -1.0,
        },
    }

    page = render_summary_html(analysis, snapshot)

    memory = page[page.index('id="memory"') : page.index('id="hlo-ops"')]
    assert "-1" not in memory
    assert "Peak usage or capacity is unknown" in memory
    assert re.search(r"<dt>Fragmentation</dt><dd><span class=\"na\"[^>]*>n/a</span>", memory)


def test_cpu_profile_with_no_data_explains_every_absent_section(analysis, snapshot):
    cpu_analysis, cpu_snapshot = cpu_inputs(analysis, snapshot)

    page = render_summary_html(cpu_analysis, cpu_snapshot)

    assert_safe_document(page)
    assert "CPU profile: XProf has no roofline for CPU." in page
    assert "CPU profile: XProf records no device memory profile for CPU." in page
    assert "CPU profile: XProf builds no HLO op profile for CPU devices." in page
    assert "a CPU profile has no GPU kernels" in page
    assert "LLO_DATA_ABSENT: not a TPU trace (CPU)" in page
    assert "compute utilization: no roofline on CPU" in page
    assert "program-point" not in page
    for label in (
        "Step time",
        "Host wait (device idle)",
        "Roofline efficiency",
        "Peak memory",
        "OOM risk",
    ):
        assert "n/a" in _metric_value(page, label)


def test_missing_tools_and_minimal_failed_analysis_still_render():
    page = render_summary_html(
        {"status": "FAILED", "summary": "The xplane file was truncated."}, {}
    )

    assert_safe_document(page)
    assert 'class="badge b-FAILED"' in page
    assert "The xplane file was truncated." in page
    assert "get_roofline_model was not collected for this session." in page
    assert "No findings were produced for this session." in page


def test_tool_error_is_shown_where_its_data_would_be(analysis, snapshot):
    snapshot["tools"]["get_roofline_model"] = {
        "name": "get_roofline_model",
        "status": "ERROR",
        "elapsed_ms": 4.0,
        "error": "database is locked",
    }

    page = render_summary_html(analysis, snapshot)

    roofline = page[page.index('id="roofline"') : page.index('id="memory"')]
    assert "get_roofline_model failed" in roofline
    assert "database is locked" in roofline


def test_roofline_chart_plots_the_program_point_and_top_ops(analysis, snapshot):
    page = render_summary_html(analysis, snapshot)

    svg = re.search(r'<svg[^>]*aria-label="Roofline chart">.*?</svg>', page, re.S)
    assert svg
    assert 'class="program-point"' in svg.group(0)
    assert "program: 0.0628 FLOP/B, 4.47 GFLOP/s" in svg.group(0)
    assert "broadcast_add_fusion.1" in svg.group(0)
    assert "ridge 560.4 FLOP/B" in svg.group(0)
    # Ops with zero FLOPs have no place on a log axis and stay in the table only.
    assert "copy-done.4" not in svg.group(0)


def test_memory_hlo_detector_kernel_and_llo_sections_show_tool_data(analysis, snapshot):
    snapshot["tools"]["detect_layout_mismatch_copies"] = {
        "name": "detect_layout_mismatch_copies",
        "status": "DATA",
        "elapsed_ms": 3.0,
        "data": {
            "detections": [
                {
                    "module": "jit_f",
                    "instruction": "copy.7",
                    "opcode": "copy",
                    "input_shape": "f32[1024,512]{1,0}",
                    "output_shape": "f32[1024,512]{0,1}",
                    "input_layout": "{1,0}",
                    "output_layout": "{0,1}",
                    "time_ms": 12.5,
                    "percent_of_step": 3.25,
                    "executed_in_profile": True,
                    "description": "transpose-only copy between layouts",
                }
            ]
        },
    }
    snapshot["tools"]["get_kernel_stats"] = {
        "name": "get_kernel_stats",
        "status": "DATA",
        "elapsed_ms": 9.0,
        "data": [
            {
                "kernel_name": "fusion.668: loop",
                "canonical_name": "fusion.668",
                "total_duration_us": 1234.5,
                "execution_count": 10,
                "avg_duration_us": 123.45,
            }
        ],
    }
    analysis["follow_ups"].append(
        {
            "tool": "llo_query",
            "args": {"sql": "select 1"},
            "purpose": "Check DMA stalls",
            "status": "NO_DATA",
            "elapsed_ms": 2.0,
            "result_summary": "LLO_DATA_ABSENT: no LLO ops in this trace",
        }
    )

    page = render_summary_html(analysis, snapshot)

    assert "5,120.0 MiB (5.00 GiB)" in page
    assert "11.0%" in page  # fragmentation
    assert 'aria-label="Time by HLO category"' in page
    assert "83.6%" in page
    assert "copy.7" in page and "{1,0} → {0,1}" in page
    assert "12.50 ms" in page and "3.25%" in page
    assert "fusion.668" in page and "1,234.5" in page
    llo = page[page.index('id="llo"') :]
    assert "LLO_DATA_ABSENT: no LLO ops in this trace" in llo


# ---------------------------------------------------------------- reviewer findings


def _section_html(page: str, anchor: str, next_anchor: str) -> str:
    return page[page.index(f'id="{anchor}"') : page.index(f'id="{next_anchor}"')]


def _gpu_inputs(analysis: dict[str, Any], snapshot: dict[str, Any]) -> tuple[dict, dict]:
    gpu_analysis = copy.deepcopy(analysis)
    gpu_snapshot = copy.deepcopy(snapshot)
    gpu_analysis["session"]["device_type"] = "GPU"
    overview = gpu_snapshot["tools"]["get_xprof_overview"]["data"]
    overview["run_environment"]["device_type"] = "GPU"
    overview["run_environment"]["device_core_count"] = "8"
    overview["performance_summary"]["mxu_utilization_percent"] = "0.0%"
    gpu_snapshot["tools"]["get_memory_profile"]["data"] = {
        "memory_capacity_gib": 64.0,
        "peak_memory_usage_gib": 5.78,
        "peak_usage_details": {
            "stack_reservation_gib": 0.0,
            "heap_allocation_gib": 5.78,
            "free_memory_gib": 8.63,
            "fragmentation_percent": 0.1,
            "utilization_percent": 9.03,
        },
    }
    return gpu_analysis, gpu_snapshot


KERNEL_NAME = (
    "void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<Eigen::TensorAssignOp<"
    "Eigen::TensorMap<Eigen::Tensor<Eigen::half, 1, 1, long>, 16, Eigen::MakePointer>, "
    "Eigen::TensorConversionOp<Eigen::half, Eigen::TensorMap<Eigen::Tensor<float const, 1, 1, "
    "long>, 16, Eigen::MakePointer> const> const> const, Eigen::GpuDevice>, long>(Eigen::"
    "TensorEvaluator<Eigen::TensorAssignOp<Eigen::half>, Eigen::GpuDevice>, long, long)"
)


def _kernel_follow_up() -> dict[str, Any]:
    kernel = {
        "rank": 1.0,
        "kernel_name": KERNEL_NAME,
        "registers_per_thread": 38.0,
        "shmem_bytes": 0.0,
        "block_dim": "1024,1,1",
        "grid_dim": "160,1,1",
        "occupancy_pct": 62.5,
        "is_op_tensor_core_eligible": True,
        "is_kernel_using_tensor_core": False,
        "op_name": "Cast",
        "occurrences": 194.0,
        "total_duration_us": 7908.309,
        "avg_duration_us": 40.764,
        "min_duration_us": 17.407,
        "max_duration_us": 76.8,
    }
    return {
        "tool": "get_kernel_stats",
        "args": {"limit": 10},
        "purpose": "Rank GPU kernels by time and occupancy",
        "status": "DATA",
        "elapsed_ms": 116.0,
        "data": {"kernel_count": 15, "total_kernel_time_us": 29690.748, "kernels": [kernel]},
        "result_summary": "kernel_count=15, total_kernel_time_us=29690.748, kernels=[{'rank': 1.0, "
        "'kernel_name': 'void Eigen::internal::EigenMe",
    }


@pytest.mark.parametrize(
    ("status", "entry", "expected"),
    [
        ("NO_DATA", {"data": {"reason": "no HLO modules in the profile"}}, "no HLO modules"),
        ("ERROR", {"error": "HLO proto <unreadable>"}, "HLO proto &lt;unreadable&gt;"),
    ],
)
def test_detector_without_data_shows_the_tools_reason(analysis, snapshot, status, entry, expected):
    for name in (
        "detect_layout_mismatch_copies",
        "detect_unfused_reshapes",
        "detect_unnecessary_convert_reduce",
    ):
        snapshot["tools"][name] = {"name": name, "status": status, "elapsed_ms": 2.0, **entry}

    page = render_summary_html(analysis, snapshot)

    detectors = _section_html(page, "detectors", "llo")
    assert "No detections" not in detectors
    assert "no instance of this pattern" not in detectors
    assert detectors.count(expected) == 3


def test_detector_with_empty_detections_says_the_pattern_is_absent(analysis, snapshot):
    snapshot["tools"]["detect_unfused_reshapes"] = {
        "name": "detect_unfused_reshapes",
        "status": "DATA",
        "elapsed_ms": 2.0,
        "data": {"detections": [], "modules_scanned": 9},
    }

    page = render_summary_html(analysis, snapshot)

    assert "No detections: the HLO has no instance of this pattern (9 HLO modules scanned)." in page


def test_detector_table_shows_shapes_layouts_time_and_unexecuted_copies(analysis, snapshot):
    base = {
        "detector": "detect_layout_mismatch_copies",
        "module": "jit_step(16)",
        "instruction": "wrapped_copy",
        "inner_instruction": "copy.1",
        "opcode": "copy",
        "input_shape": "f32[2048,2048]{0,1}",
        "output_shape": "f32[2048,2048]{1,0}",
        "input_layout": "{0,1}",
        "output_layout": "{1,0}",
        "bytes": 16777216,
        "source": "",
        "description": "copies f32[2048,2048] from layout {0,1} to {1,0}",
        "time_ms": 5.8607,
        "percent_of_step": 48.76,
        "time_source": "timeline events on XLA execution lines, ms per step",
        "executed_in_profile": True,
    }
    idle = dict(
        base,
        module="jit__device_put_reshard(10)",
        time_ms=None,
        percent_of_step=None,
        time_source="not found on the timeline",
        executed_in_profile=False,
    )
    snapshot["tools"]["detect_layout_mismatch_copies"] = {
        "name": "detect_layout_mismatch_copies",
        "status": "DATA",
        "elapsed_ms": 3.0,
        "data": {"detections": [base, idle], "modules_scanned": 9},
    }

    page = render_summary_html(analysis, snapshot)

    detectors = _section_html(page, "detectors", "llo")
    assert "f32[2048,<wbr>2048]{0,<wbr>1}<br>→ f32[2048,<wbr>2048]{1,<wbr>0}" in detectors
    assert "{0,1} → {1,0}" in detectors
    assert "5.86 ms" in detectors and "48.8%" in detectors
    assert "16.0 MiB" in detectors
    assert "via <code>copy.1</code>" in detectors
    assert "timeline events on XLA execution lines, ms per step" in detectors
    rows = re.findall(r"<tr[^>]*>.*?</tr>", detectors, re.S)
    ran = next(r for r in rows if "jit_step(16)" in r)
    not_ran = next(r for r in rows if "jit__device_put_reshard(10)" in r)
    assert 'class="noexec"' in not_ran and "did not run while profiling" in not_ran
    assert "noexec" not in ran and "did not run" not in ran
    # The greyed style exists in the stylesheet.
    assert "tr.noexec td{color:" in page


def test_finding_grid_cannot_squeeze_the_evidence_column(analysis, snapshot):
    long_value = "x" * 200
    analysis["findings"][0]["evidence"].append(
        {"tool": "get_hlo_neighborhood", "field": "text", "value": long_value}
    )

    page = render_summary_html(analysis, snapshot)

    css = page[page.index("<style>") : page.index("</style>")]
    assert (
        ".fgrid{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1.6fr) minmax(0,1fr)"
        in css
    )
    assert re.search(r"\ncode\{[^}]*overflow-wrap:anywhere", css)
    # Long values stay folded.
    assert f'<details class="evlong"><summary>{"x" * 80}…</summary>' in page


def test_page_has_no_inline_style_attributes_and_declares_a_matching_hash_csp(
    analysis, snapshot
):
    import base64
    import hashlib

    gpu_analysis, gpu_snapshot = _gpu_inputs(analysis, snapshot)
    gpu_analysis["follow_ups"].append(_kernel_follow_up())
    cpu_analysis, cpu_snapshot = cpu_inputs(analysis, snapshot)
    pages = [
        render_summary_html(analysis, snapshot),
        render_summary_html(gpu_analysis, gpu_snapshot),
        render_summary_html(cpu_analysis, cpu_snapshot),
        render_summary_html({}, {}),
    ]
    for page in pages:
        assert " style=" not in page.lower()
        styles = re.findall(r"<style>(.*?)</style>", page, re.S)
        assert len(styles) == 1
        digest = base64.b64encode(hashlib.sha256(styles[0].encode()).digest()).decode()
        csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', page)
        assert csp
        assert csp.group(1).startswith(f"default-src 'none'; style-src 'sha256-{digest}'")
        # The policy must come before the style block it governs.
        assert page.index("Content-Security-Policy") < page.index("<style>")

    # The memory share (20.02 / 31.25 = 64.1%) is SVG geometry, not CSS.
    card = pages[0][pages[0].index('<div class="label">Peak memory</div>') :]
    assert re.search(r'<svg class="minibar"[^>]*>.*?<rect class="fill" width="64\.1"', card)


def test_cpu_cards_describe_host_wait_and_compiled_program_allocations(analysis, snapshot):
    cpu_analysis, cpu_snapshot = cpu_inputs(analysis, snapshot)
    cpu_analysis["metrics"].update(
        step_time_ms=25.569,
        device_idle_percent=88.65,
        peak_memory_gib=0.0039,
        memory_capacity_gib=None,
        oom_risk="UNKNOWN",
        peak_memory_source="get_peak_allocations",
    )

    page = render_summary_html(cpu_analysis, cpu_snapshot)

    assert _metric_value(page, "Host wait (device idle)") == "88.7%"
    assert "of each step, XLA:CPU idle" in page
    assert '<div class="label">Device idle</div>' not in page
    assert '<div class="label">Peak memory</div>' not in page
    assert _metric_value(page, "Largest allocation") == "4.0 MiB"
    card = page[page.index('<div class="label">Largest allocation</div>') :]
    card = card[: card.index('<div class="card')] if '<div class="card' in card else card
    assert "largest compiled-program allocation" in card
    assert "peak memory" not in card.lower()
    assert "0.00 GiB" not in page


def test_device_overview_is_detected_from_xprof_run_environment(analysis, snapshot):
    analysis["session"]["device_type"] = ""
    snapshot["tools"]["get_xprof_overview"]["data"]["run_environment"]["device_type"] = "CPU"
    analysis["metrics"]["device_idle_percent"] = 3.11

    page = render_summary_html(analysis, snapshot)

    assert _metric_value(page, "Host wait (device idle)") == "3.11%"


def test_peak_memory_from_memory_profile_keeps_its_label_and_small_values_use_mib(
    analysis, snapshot
):
    analysis["metrics"]["peak_memory_source"] = "get_memory_profile"
    analysis["metrics"]["peak_memory_gib"] = 0.0625

    page = render_summary_html(analysis, snapshot)

    assert _metric_value(page, "Peak memory") == "64.0 MiB"
    assert "largest compiled-program allocation" not in page


def test_cpu_overview_shows_only_meaningful_fields(analysis, snapshot):
    cpu_analysis, cpu_snapshot = cpu_inputs(analysis, snapshot)
    cpu_snapshot["tools"]["get_xprof_overview"] = {
        "name": "get_xprof_overview",
        "status": "DATA",
        "elapsed_ms": 5.0,
        "data": {
            "performance_summary": {
                "device_duty_cycle_percent": "0.0%",
                "device_idle_time_percent": "0.0%",
                "host_idle_time_percent": "0.0%",
                "mxu_utilization_percent": "0.0%",
                "flop_rate_utilization_relative_to_roofline": "0.0%",
                "steptime_ms_average": "25.4",
            },
            "run_environment": {
                "device_core_count": "0",
                "device_type": "CPU",
                "host_count": "1",
                "is_training": "true",
            },
        },
    }

    page = render_summary_html(cpu_analysis, cpu_snapshot)

    overview = _section_html(page, "overview", "roofline")
    labels = re.findall(r"<div><span>(.*?)</span><b>(.*?)</b></div>", overview)
    assert labels == [
        ("XProf step time (its steps)", "25.4 ms"),
        ("Device type", "CPU"),
        ("Hosts", "1"),
        ("Training", "true"),
    ]
    assert "XProf's device metrics do not apply to CPU profiles." in unescape(overview)
    assert "0.0%" not in overview


def test_the_overviews_own_step_set_is_named_when_it_disagrees(analysis, snapshot):
    """One step set per page: the overview's op_stats steps are said to differ from the
    annotated steps every other figure uses."""
    cpu_analysis, cpu_snapshot = cpu_inputs(analysis, snapshot)
    cpu_snapshot["tools"]["get_xprof_overview"] = {
        "name": "get_xprof_overview", "status": "DATA", "elapsed_ms": 5.0,
        "data": {"performance_summary": {"steptime_ms_average": "36.8"},
                 "run_environment": {"device_type": "CPU"}}}
    old = cpu_snapshot["tools"].get("get_step_trace") or {}
    trace = dict(old.get("data") or {})
    trace["summary"] = {**(trace.get("summary") or {}), "total_steps": 8,
                        "step_time_ms_average": 44.6565}
    cpu_snapshot["tools"]["get_step_trace"] = {**old, "name": "get_step_trace",
                                               "status": "DATA", "data": trace}
    overview = _section_html(render_summary_html(cpu_analysis, cpu_snapshot), "overview",
                             "roofline")
    assert ("XProf's overview step time (36.8 ms) averages the steps of its op_stats step "
            "database, a different set from the annotated steps; every other step figure on "
            "this page, get_step_trace's included, is over the 8 annotated steps (44.66 ms "
            "on average).") in unescape(overview)
    trace["summary"]["step_time_ms_average"] = 36.9  # within 2%: nothing to say
    overview = _section_html(render_summary_html(cpu_analysis, cpu_snapshot), "overview",
                             "roofline")
    assert "op_stats step database" not in overview


def test_gpu_overview_hides_mxu_and_tpu_overview_keeps_it(analysis, snapshot):
    gpu_analysis, gpu_snapshot = _gpu_inputs(analysis, snapshot)

    gpu_page = render_summary_html(gpu_analysis, gpu_snapshot)
    tpu_page = render_summary_html(analysis, snapshot)

    assert "MXU" not in _section_html(gpu_page, "overview", "roofline")
    assert "Device cores" in _section_html(gpu_page, "overview", "roofline")
    assert "MXU utilization" in _section_html(tpu_page, "overview", "roofline")


def test_gpu_kernel_follow_up_renders_as_a_table(analysis, snapshot):
    gpu_analysis, gpu_snapshot = _gpu_inputs(analysis, snapshot)
    gpu_analysis["follow_ups"].append(_kernel_follow_up())

    page = render_summary_html(gpu_analysis, gpu_snapshot)

    kernels = _section_html(page, "kernels", "detectors")
    assert "kernel_count=15" not in kernels
    assert "{&#x27;rank&#x27;" not in kernels
    assert "<table>" in kernels
    # Short name in the summary, full name one click away.
    assert (
        '<details class="kname"><summary>Eigen::internal::EigenMetaKernel&lt;…&gt;(…)</summary>'
        in kernels
    )
    assert f'<pre class="mono">{KERNEL_NAME.replace("<", "&lt;").replace(">", "&gt;")}</pre>' in (
        kernels
    )
    for text in ("7,908.3", "40.76", "194", "62.5%", "yes / no", "Cast", "160,1,1 / 1024,1,1"):
        assert text in kernels, text
    assert "<b>15</b> distinct kernels" in kernels
    assert "29,690.7 µs" in kernels
    assert "Rank GPU kernels by time and occupancy" in kernels


def test_allocator_free_memory_is_labelled_as_the_allocator_pool(analysis, snapshot):
    gpu_analysis, gpu_snapshot = _gpu_inputs(analysis, snapshot)

    page = render_summary_html(gpu_analysis, gpu_snapshot)

    memory = _section_html(page, "memory", "hlo-ops")
    assert "<dt>Allocator free at peak</dt><dd>8.63 GiB" in memory
    assert "not capacity minus peak" in memory
    assert "<dt>Free at peak</dt>" not in memory
    assert "<dt>Headroom (capacity − peak)</dt><dd>58.22 GiB" in memory


def test_not_judged_items_render_as_given(analysis, snapshot):
    items = [
        "no detector finding has a material impact: no data (HLO detectors with a share of "
        "step time unavailable in this profile)",
        "OOM risk is LOW: no data (peak memory / capacity (get_memory_profile) unavailable)",
    ]
    analysis["not_judged"] = items
    analysis["summary"] = "Not judged for lack of data: whether OOM risk is LOW."

    page = render_summary_html(analysis, snapshot)

    for item in items:
        assert f"<li>{item}</li>" in page
    assert "Not judged for lack of data: whether OOM risk is LOW." in page


def test_overview_hides_roofline_relative_fields_without_a_roofline(analysis, snapshot):
    no_roofline = copy.deepcopy(snapshot)
    perf = no_roofline["tools"]["get_xprof_overview"]["data"]["performance_summary"]
    perf["bound_by"] = "Unknown"
    page = render_summary_html(analysis, no_roofline)
    overview = _section_html(page, "overview", "roofline")
    assert "FLOP rate vs roofline" not in overview and "Bound by" not in overview
    # The roofline tool has the device's peak: the overview says why it differs from the
    # Roofline section instead of saying no roofline exists above a drawn one.
    assert "did not place this program on a roofline" in overview
    assert "get_roofline_model does" in overview
    no_peak = copy.deepcopy(no_roofline)
    no_peak["tools"]["get_roofline_model"]["data"]["device_info"]["peak_flop_rate"] = 0.0
    overview = _section_html(render_summary_html(analysis, no_peak), "overview", "roofline")
    assert "could not place this program on a roofline" in overview
    assert "FLOP rate vs roofline" in _section_html(
        render_summary_html(analysis, snapshot), "overview", "roofline")


def test_the_summary_says_how_collection_went_and_what_it_cut(analysis, snapshot):
    collection = {
        "elapsed_ms": 37429.2, "session_bytes": 111206386, "memory_budget_bytes": 6 * 1024**3,
        "worker_peak_rss_bytes": 2490806272,
        "jobs": {"op_stats": {"status": "DATA", "elapsed_ms": 14879.1,
                              "peak_rss_bytes": 2490806272},
                 "memory_profile": {"status": "ERROR", "elapsed_ms": 300000.0}},
        "skipped": [{"job": "smart_suggestions", "reason": "skipped: needs about 9.00 GiB"}],
        "killed": [{"job": "memory_profile", "reason": f"timed out after 300 s {SCRIPT}"}],
        "degraded": [{"tools": "xprof converters",
                      "reason": "read a copy of the xplanes without 2,304,010 Python-tracer "
                                "events"}],
    }
    # As engine.build_analysis writes them: analysis.json's collection has no per-job table.
    summary_only = {k: v for k, v in collection.items() if k != "jobs"}
    html = render_summary_html({**analysis, "collection": summary_only},
                               {**snapshot, "collection": collection})
    summary = html[html.index('id="summary"'):html.index('id="bottlenecks"')]
    assert "Collection took 37.4 s for 106.1 MB of xplanes" in summary
    assert "peaked at 2.32 GiB (memory budget 6.00 GiB)" in summary
    assert "Stopped: <span class=\"mono\">memory_profile</span>" in summary
    assert "Skipped: <span class=\"mono\">smart_suggestions</span>" in summary
    assert "without 2,304,010 Python-tracer events" in summary
    assert SCRIPT not in html and SCRIPT_ESCAPED in summary
    provenance = html[html.index('id="provenance"'):]
    assert "Collection jobs (worker processes)" in provenance and "op_stats" in provenance


def test_a_clean_collection_says_nothing_was_cut(analysis, snapshot):
    collection = {"elapsed_ms": 310.0, "session_bytes": 862707, "skipped": [], "killed": [],
                  "degraded": []}
    html = render_summary_html({**analysis, "collection": collection}, snapshot)
    assert "no tool was skipped, stopped or degraded" in html
