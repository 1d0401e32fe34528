"""Small health snapshots, built in code: XLA:CPU profiles for the diff's unit and pipeline
tests, and a healthy TPU profile for triage.

A CPU snapshot holds what `mldiag diff` reads: the timeline's per-step figures and op times
(on the step trace, as the collection puts them), xprof's module list, and the HLO digests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mldiag.analysis.collection.hlo.digest import digest


def tool_result(data: Any) -> dict[str, Any]:
    """A tool's entry in a snapshot, with `data`."""
    return {"status": "DATA", "elapsed_ms": 1.0, "data": data}


def hlo(params: Sequence[str], ops: Mapping[str, str], name: str = "jit_step") -> str:
    """HLO text of a module whose entry takes `params` (shapes) and runs `ops`
    (instruction name -> `opcode`, or `fusion:<fused opcode>` for a one-op loop fusion)."""
    fused, entry = [], []
    for i, shape in enumerate(params):
        entry.append(f"  p{i} = {shape} parameter({i})")
    for op, what in ops.items():
        if what.startswith("fusion:"):
            inner = what.split(":", 1)[1]
            fused.append(f"{op}_computation {{\n  param_0 = f32[8]{{0}} parameter(0)\n"
                         f"  ROOT r = f32[8]{{0}} {inner}(param_0)\n}}\n")
            entry.append(f"  {op} = f32[8]{{0}} fusion(p0), kind=kLoop, calls={op}_computation")
        else:
            entry.append(f"  {op} = f32[8]{{0}} {what}(p0)")
    entry[-1] = "  ROOT " + entry[-1].lstrip()
    layout = ", ".join(params)
    return (f"HloModule {name}, entry_computation_layout={{({layout})->f32[8]{{0}}}}\n\n"
            + "\n".join(fused) + "\nENTRY main {\n" + "\n".join(entry) + "\n}\n")


def cpu_snapshot(*, step_ms: float, wait_ms: float, ops: Mapping[str, float],
                 module: str = "jit_step(7)", hlo_text: str | None = None,
                 stddev_ms: float = 0.2, steps: int = 8, run: str = "r",
                 session: str = "s", device_type: str = "CPU",
                 digests: bool = True) -> dict[str, Any]:
    """A CPU snapshot whose steps take `step_ms`, `wait_ms` of it waiting for the host, and
    whose program `module` runs `ops` (name -> ms per step)."""
    program = module[module.rindex("(") + 1:-1]
    busy = step_ms - wait_ms
    per_step = [{"op": op, "program_id": program, "ms_per_step": ms, "count": steps,
                 "percent_of_step": round(100 * ms / step_ms, 2)} for op, ms in ops.items()]
    snapshot: dict[str, Any] = {
        "schema_version": "1.0",
        "session": {"run": run, "session": session, "path": f"/tmp/{run}/{session}",
                    "hosts": ["h0"], "device_type": device_type},
        "xprof_version": "2.24.2", "mldiag_version": "0.1.0",
        "tools": {
            "get_xprof_overview": tool_result({"run_environment": {
                "device_type": device_type, "host_count": "1", "device_core_count": "0"}}),
            "get_step_trace": tool_result({
                "summary": {"total_steps": steps, "step_time_ms_average": step_ms},
                "step_breakdown": [{"step_num": f"train {i}", "step_time_ms": step_ms}
                                   for i in range(steps)],
                "host_bound_analysis": {
                    "compute_source": "xla_cpu", "steps_analyzed": steps,
                    "step_time_ms_average": step_ms, "compute_busy_ms_average": busy,
                    "host_wait_ms_average": wait_ms,
                    "host_wait_percent": round(100 * wait_ms / step_ms, 2),
                    "steps_mostly_waiting": steps if wait_ms > busy else 0,
                    "step_time_spread": {"steps": steps, "stddev_ms": stddev_ms},
                    "per_host": [{"host": "h0", "compute_source": "xla_cpu", "steps": steps,
                                  "active_span_ms": step_ms * steps,
                                  "busy_in_active_span_percent": 100 * busy / step_ms}],
                    "op_time_per_step": per_step,
                    "op_time_ms_by_program": {program: dict(ops)},
                }}),
            "list_hlo_modules": tool_result({"status": "SUCCESS", "count": 1, "modules": [module]}),
        },
    }
    if digests:
        text = hlo_text or hlo(["f32[8]{0}"], {op: "add" for op in ops})
        snapshot["hlo_digests"] = [digest(module, text)]
    return snapshot


def analysis(snapshot: Mapping[str, Any], status: str = "OPTIMAL",
             findings: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The analysis.json fields the diff reads."""
    return {"schema_version": "1.0", "session": dict(snapshot["session"]), "status": status,
            "summary": "Measured.", "metrics": {}, "findings": list(findings),
            "follow_ups": []}


def healthy_snapshot(run: str = "healthy", session: str = "s1") -> dict[str, Any]:
    """Tool outputs of a TPU program that keeps its cores busy computing, with memory to spare."""
    detections = {"detections": [], "modules_scanned": 1}
    return {
        "schema_version": "1.0",
        "session": {"run": run, "session": session, "path": "", "hosts": ["h0"],
                    "device_type": "TPU v5 lite"},
        "xprof_version": "2.24.2",
        "tools": {
            "get_xprof_overview": tool_result({
                "performance_summary": {"device_duty_cycle_percent": "97.0%",
                                        "device_idle_time_percent": "3.0%"},
                "run_environment": {"device_type": "TPU v5 lite"}}),
            "get_hlo_op_profile": tool_result({
                "total_profile_time_ms": 1000.0,
                "category_summary": [
                    {"category": "convolution fusion", "fraction_of_total_time": 0.95,
                     "total_self_time_ms": 950.0, "top_op": "fusion.1", "op_count": 3},
                    {"category": "IDLE", "fraction_of_total_time": 0.03,
                     "total_self_time_ms": 30.0, "top_op": "IDLE", "op_count": 1}]}),
            "get_roofline_model": tool_result({"program": {
                "bound_by": "Compute", "roofline_efficiency_percent": "82.0%",
                "measured_flop_rate_gflops": 150000.0, "measured_memory_bw_gibs": 200.0}}),
            "get_memory_profile": tool_result({"memory_capacity_gib": 16.0,
                                        "peak_memory_usage_gib": 9.5}),
            "detect_layout_mismatch_copies": tool_result(detections),
            "detect_unfused_reshapes": tool_result(detections),
            "detect_unnecessary_convert_reduce": tool_result(detections),
        },
    }
