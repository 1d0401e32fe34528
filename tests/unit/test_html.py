import copy
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from mldiag.analysis.html import render_summary_html

DATA = Path(__file__).parent / "data"
SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
SCRIPT_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
IMG_ESCAPED = "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"
VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "col", "area", "base", "source"}
SVG_LEAVES = {"rect", "line", "polyline", "circle", "path"}


@pytest.fixture
def analysis() -> dict[str, Any]:
    return json.loads((DATA / "analysis_tpu.json").read_text())


@pytest.fixture
def snapshot() -> dict[str, Any]:
    return json.loads((DATA / "health_snapshot_tpu.json").read_text())


def _cpu_inputs(analysis: dict[str, Any], snapshot: dict[str, Any]) -> tuple[dict, dict]:
    cpu_snapshot = copy.deepcopy(snapshot)
    for name in list(cpu_snapshot["tools"]):
        cpu_snapshot["tools"][name] = {
            "name": name,
            "status": "NO_DATA",
            "elapsed_ms": 5.0,
            "data": {"status": "NO_DATA", "message": f"{name}: nothing for CPU"},
        }
    cpu_analysis = copy.deepcopy(analysis)
    cpu_analysis["session"]["device_type"] = "CPU"
    cpu_analysis["metrics"] = {key: None for key in cpu_analysis["metrics"]}
    cpu_analysis["findings"] = []
    cpu_analysis["follow_ups"] = []
    cpu_analysis["not_judged"] = ["compute utilization: no roofline on CPU"]
    return cpu_analysis, cpu_snapshot


def _metric_value(page: str, label: str) -> str:
    match = re.search(
        rf'<div class="label">{re.escape(label)}</div><div class="value">(.*?)</div>', page
    )
    assert match, f"no metric card {label!r}"
    return match.group(1)


class _TagBalance(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: set[str] = set()
        self.attributes: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._record(tag, attrs)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._record(tag, attrs)

    def _record(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attributes.update(name for name, _ in attrs)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}> with open {self.stack[-3:]}")
            return
        self.stack.pop()


def _assert_safe_document(page: str) -> None:
    lowered = page.lower()
    assert "http" not in lowered
    assert "<script" not in lowered
    assert "<img" not in lowered
    assert "<link" not in lowered
    assert "url(" not in lowered
    assert "@import" not in lowered
    assert lowered.count("<html") == 1 and lowered.count("</html>") == 1
    checker = _TagBalance()
    checker.feed(page)
    assert checker.errors == []
    assert checker.stack == []
    assert not checker.tags & {"script", "img", "iframe", "object", "embed", "link", "image"}
    assert not {a for a in checker.attributes if a.startswith("on") or a == "src"}
    # The only links are in-page anchors.
    assert set(re.findall(r'href="([^"#]*)', page)) <= {""}


def test_example_renders_a_safe_self_contained_document(analysis, snapshot):
    page = render_summary_html(analysis, snapshot)

    _assert_safe_document(page)
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

    _assert_safe_document(page)
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
    cpu_analysis, cpu_snapshot = _cpu_inputs(analysis, snapshot)

    page = render_summary_html(cpu_analysis, cpu_snapshot)

    _assert_safe_document(page)
    assert "CPU profile: XProf has no roofline for CPU." in page
    assert "CPU profile: XProf records no device memory profile for CPU." in page
    assert "CPU profile: XProf builds no HLO op profile for CPU devices." in page
    assert "a CPU profile has no GPU kernels" in page
    assert "LLO_DATA_ABSENT: not a TPU trace (CPU)" in page
    assert "compute utilization: no roofline on CPU" in page
    assert "program-point" not in page
    for label in ("Step time", "Device idle", "Roofline efficiency", "Peak memory", "OOM risk"):
        assert "n/a" in _metric_value(page, label)


def test_missing_tools_and_minimal_failed_analysis_still_render():
    page = render_summary_html(
        {"status": "FAILED", "summary": "The xplane file was truncated."}, {}
    )

    _assert_safe_document(page)
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
                    "shapes": ["f32[1024,512]"],
                    "layouts": ["{1,0}", "{0,1}"],
                    "time_ms": 12.5,
                    "percent_of_step": 3.25,
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
    assert "copy.7" in page and "f32[1024,512]" in page and "{1,0}, {0,1}" in page
    assert "12.50 ms" in page and "3.25%" in page
    assert "fusion.668" in page and "1,234.5" in page
    llo = page[page.index('id="llo"') :]
    assert "LLO_DATA_ABSENT: no LLO ops in this trace" in llo
