"""A healthy profile short-circuits: no investigation stage, a report with verdict OPTIMAL."""

from __future__ import annotations

import json
from typing import Any

from mldiag.analysis.judgement.triage import OPTIMAL, triage
from mldiag.bootstrap import LocalRuntime
from mldiag.messages import RenderReport
from mldiag.model import ANALYZING, REPORTED, HostRecord
from mldiag.stages import handle
from tests.pipeline.helpers import MakeRuntime

RUN, SESSION = "healthy", "s1"


def _tool(data: dict[str, Any]) -> dict[str, Any]:
    return {"status": "DATA", "elapsed_ms": 1.0, "data": data}


def healthy_snapshot() -> dict[str, Any]:
    """Tool outputs of a TPU program that keeps its cores busy computing, with memory to spare."""
    detections = {"detections": [], "modules_scanned": 1}
    return {
        "schema_version": "1.0",
        "session": {"run": RUN, "session": SESSION, "path": "", "hosts": ["h0"],
                    "device_type": "TPU v5 lite"},
        "xprof_version": "2.24.2",
        "tools": {
            "get_xprof_overview": _tool({
                "performance_summary": {"device_duty_cycle_percent": "97.0%",
                                        "device_idle_time_percent": "3.0%"},
                "run_environment": {"device_type": "TPU v5 lite"}}),
            "get_hlo_op_profile": _tool({
                "total_profile_time_ms": 1000.0,
                "category_summary": [
                    {"category": "convolution fusion", "fraction_of_total_time": 0.95,
                     "total_self_time_ms": 950.0, "top_op": "fusion.1", "op_count": 3},
                    {"category": "IDLE", "fraction_of_total_time": 0.03,
                     "total_self_time_ms": 30.0, "top_op": "IDLE", "op_count": 1}]}),
            "get_roofline_model": _tool({"program": {
                "bound_by": "Compute", "roofline_efficiency_percent": "82.0%",
                "measured_flop_rate_gflops": 150000.0, "measured_memory_bw_gibs": 200.0}}),
            "get_memory_profile": _tool({"memory_capacity_gib": 16.0,
                                         "peak_memory_usage_gib": 9.5}),
            "detect_layout_mismatch_copies": _tool(detections),
            "detect_unfused_reshapes": _tool(detections),
            "detect_unnecessary_convert_reduce": _tool(detections),
        },
    }


def test_a_healthy_snapshot_is_reported_optimal_without_investigation(
        make_runtime: MakeRuntime) -> None:
    snapshot = healthy_snapshot()
    assert triage(snapshot).status == OPTIMAL
    rt: LocalRuntime = make_runtime()
    base = f"{RUN}/plugins/profile/{SESSION}"
    info = rt.storage.write_bytes(f"{base}/analysis/v1/health_snapshot.json",
                                  json.dumps(snapshot).encode())
    rt.state.ensure_run(RUN, discovered=True)
    rt.state.register_host(RUN, SESSION, "h0", HostRecord(
        object_name=f"{base}/h0.xplane.pb", generation="1", size=1, arrived_at=1.0), 1.0)
    assert rt.state.transition(RUN, SESSION, ANALYZING, now=2.0) is not None

    handle(RenderReport(run=RUN, session=SESSION, version=1), rt.services)

    s = rt.state.get_session(RUN, SESSION)
    assert s is not None and s.state == REPORTED and s.verdict == OPTIMAL
    analysis = json.loads(rt.storage.read_bytes(f"{base}/analysis/analysis.json"))
    assert analysis["status"] == OPTIMAL and analysis["follow_ups"] == []
    assert not [f for f in analysis["findings"] if f["priority"] in ("P0", "P1")]
    investigation = json.loads(rt.storage.read_bytes(f"{base}/analysis/investigation.json"))
    assert "short_circuit" in investigation
    assert "OPTIMAL" in rt.storage.read_bytes(f"{base}/analysis/summary.html").decode()
    assert info.size > 0
