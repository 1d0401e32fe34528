"""Write the report's golden inputs and pages: `python -m tests.unit.report.make_goldens`.

Each case is a folder under `goldens/`: the saved inputs (analysis.json and
health_snapshot.json, or diff.json) and the page the renderer made of them (summary.html or
diff.html). The inputs come from real analyses: the team's fixtures (copied first, as xprof
writes caches next to a trace), the planted JAX workloads of tests/e2e, and the unit tests'
hostile and CPU variants. `--pages` re-renders only the pages from the saved inputs (after a
deliberate change to the report, never to make a failing golden test pass unexamined).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mldiag.analysis.report.diff import render_diff_html
from mldiag.analysis.report.summary import render_summary_html

HERE = Path(__file__).resolve().parent
GOLDENS = HERE / "goldens"
REPO = HERE.parents[2]
FIXTURES = REPO.parent / "shared" / "fixtures"
WORKLOADS = REPO / "scripts" / "workloads"
PLANTED = ("baseline", "collective_bound", "convert_reduce", "host_bound", "layout_copy",
           "memory_pressure", "unfused_reshape")
CHANGES = ("batch", "collective", "layout", "stall")


def _write(case: Path, name: str, doc: Any) -> None:
    case.mkdir(parents=True, exist_ok=True)
    (case / name).write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


def render_case(case: Path) -> tuple[str, str]:
    """(page file name, the page) of one golden case, from its saved inputs."""
    if (case / "diff.json").is_file():
        return "diff.html", render_diff_html(_load(case / "diff.json"))
    return "summary.html", render_summary_html(_load(case / "analysis.json"),
                                               _load(case / "health_snapshot.json"))


def _analysed(out: Path, name: str) -> None:
    _write(GOLDENS / name, "analysis.json", _load(out / "analysis.json"))
    _write(GOLDENS / name, "health_snapshot.json", _load(out / "health_snapshot.json"))


def _side(out: Path, label: str) -> Any:
    from mldiag.analysis.diff.sides import Side

    return Side(label, _load(out / "health_snapshot.json"), _load(out / "analysis.json"),
                _load(out / "investigation.json"), source="analysed now")


def fixtures(work: Path) -> None:
    from mldiag.analysis.collection.profile_input import resolve_session
    from mldiag.analysis.diff.compare import build_diff
    from mldiag.analysis.diff.xprof import xprof_diff
    from mldiag.analysis.engine import analyze

    outs = {}
    for name in ("tpu_inference_2", "gpu_multi_worker"):
        logdir = work / name
        shutil.copytree(FIXTURES / name, logdir)
        outs[name] = work / f"{name}-out"
        analyze(logdir, outs[name])
        _analysed(outs[name], f"fixture_{name}")
    tpu, gpu = _side(outs["tpu_inference_2"], "tpu"), _side(outs["gpu_multi_worker"], "gpu")
    _write(GOLDENS / "diff_fixture_tpu_tpu", "diff.json", build_diff(tpu, tpu))
    _write(GOLDENS / "diff_fixture_tpu_gpu", "diff.json", build_diff(tpu, gpu))
    session = resolve_session(work / "gpu_multi_worker")
    result, why = xprof_diff(session, session)
    assert result is not None, why
    _write(GOLDENS / "diff_fixture_gpu_gpu", "diff.json",
           build_diff(gpu, gpu, xprof_diff=result))


def planted(work: Path) -> None:
    from mldiag.analysis.engine import analyze

    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    for workload in PLANTED:
        logdir = work / workload
        subprocess.run([sys.executable, str(WORKLOADS / f"{workload}.py"), "--logdir",
                        str(logdir)], check=True, env=env, timeout=600, capture_output=True)
        (run_dir,) = (logdir / "plugins" / "profile").iterdir()
        analyze(run_dir, work / f"{workload}-out")
        _analysed(work / f"{workload}-out", f"planted_{workload}")


def planted_diffs(work: Path) -> None:
    from mldiag.analysis.diff.compare import build_diff
    from mldiag.cli.main import main

    logdir = work / "pairs"
    subprocess.run([sys.executable, str(WORKLOADS / "regression.py"), "--logdir", str(logdir),
                    "--change", ",".join(CHANGES)], check=True, timeout=600,
                   capture_output=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    for change in CHANGES:
        dirs = [next((logdir / change / side / "plugins" / "profile").iterdir())
                for side in ("before", "after")]
        out = work / f"diff-{change}"
        assert main(["diff", str(dirs[0]), str(dirs[1]), "--out", str(out), "-q"]) == 0
        doc = _load(out / "diff.json")
        _write(GOLDENS / f"diff_planted_{change}", "diff.json", doc)
        if change == "stall":
            # An alert-triggered report: "What changed" against its baseline, as
            # regression.regression() writes the block into analysis.json.
            analysis = _load(out / "b" / "analysis.json")
            analysis["regression"] = {
                "baseline": {"run": "r", "session": "before", "version": 1,
                             "status": "OPTIMAL", "why": "the run's pinned baseline"},
                "headline": doc["headline"], "explanation": doc["explanation"][:5],
                "comparability": doc["comparability"],
                "step_time": next((k for k in doc["kpis"] if k["name"] == "step time"), None),
                "diff": "diff.json", "diff_html": "diff.html"}
            _write(GOLDENS / "planted_stall_what_changed", "analysis.json", analysis)
            _write(GOLDENS / "planted_stall_what_changed", "health_snapshot.json",
                   _load(out / "b" / "health_snapshot.json"))
            analysis = copy.deepcopy(analysis)
            analysis["regression"] = {"baseline": None,
                                      "reason": "No baseline: the run has no OPTIMAL session "
                                                "before this one <yet>."}
            _write(GOLDENS / "planted_stall_no_baseline", "analysis.json", analysis)
            _write(GOLDENS / "planted_stall_no_baseline", "health_snapshot.json",
                   _load(out / "b" / "health_snapshot.json"))
    del build_diff


def unit_variants() -> None:
    """The unit tests' example, its hostile and CPU variants, and the hostile diff."""
    from tests.helpers.html import IMG, cpu_inputs, hostile_diff

    data = REPO / "tests" / "unit" / "data"
    analysis = _load(data / "analysis_tpu.json")
    snapshot = _load(data / "health_snapshot_tpu.json")
    _write(GOLDENS / "unit_tpu", "analysis.json", analysis)
    _write(GOLDENS / "unit_tpu", "health_snapshot.json", snapshot)
    cpu_a, cpu_s = cpu_inputs(copy.deepcopy(analysis), copy.deepcopy(snapshot))
    _write(GOLDENS / "unit_cpu", "analysis.json", cpu_a)
    _write(GOLDENS / "unit_cpu", "health_snapshot.json", cpu_s)
    hostile_a, hostile_s = copy.deepcopy(analysis), copy.deepcopy(snapshot)
    _make_hostile(hostile_a, hostile_s)
    _write(GOLDENS / "unit_hostile", "analysis.json", hostile_a)
    _write(GOLDENS / "unit_hostile", "health_snapshot.json", hostile_s)
    _write(GOLDENS / "unit_empty", "analysis.json", {})
    _write(GOLDENS / "unit_empty", "health_snapshot.json", {})
    _write(GOLDENS / "diff_unit_hostile", "diff.json", hostile_diff(label=IMG))


def _make_hostile(analysis: dict[str, Any], snapshot: dict[str, Any]) -> None:
    """The hostile strings of tests/helpers/html.py, in every kind of place."""
    from tests.helpers.html import IMG, SCRIPT

    analysis["summary"] = f"Summary {SCRIPT}"
    analysis["session"]["path"] = f"/tmp/{IMG}"
    analysis["session"]["run"] = SCRIPT
    analysis["session"]["device_type"] = f"TPU {IMG}"
    analysis["not_judged"] = [IMG, f"quote ' and `{IMG}`"]
    finding = analysis["findings"][0]
    finding["title"] = SCRIPT
    finding["what"] = IMG
    finding["fix"] = f"use `{SCRIPT}` instead"
    finding["category"] = IMG
    finding["impact"]["unit"] = IMG
    finding["evidence"].append({"tool": IMG, "field": SCRIPT, "value": IMG})
    finding["evidence"].append({"tool": "t", "field": "f", "value": {"long": SCRIPT * 9}})
    analysis["tools"][0]["error"] = IMG
    analysis["follow_ups"][0]["args"] = {"instruction_name": SCRIPT}
    analysis["follow_ups"][0]["result_summary"] = IMG
    tools = snapshot["tools"]
    tools["get_roofline_model"]["data"]["top_operations"][4]["name"] = SCRIPT
    tools["get_roofline_model"]["data"]["top_operations"][5]["category"] = IMG
    tools["get_hlo_op_profile"]["data"]["category_summary"][0]["category"] = SCRIPT
    tools["get_hlo_op_profile"]["data"]["grouped_operations"]["copy-done"][0]["name"] = (
        f"by_program/{IMG}/copy-done/{SCRIPT}")
    tools["get_peak_allocations"]["data"]["modules"][0]["module_name"] = IMG
    tools["get_peak_allocations"]["data"]["modules"][0]["top_buffers"][0]["instruction"] = SCRIPT
    tools["detect_unfused_reshapes"] = {
        "name": "detect_unfused_reshapes", "status": "DATA", "elapsed_ms": 3.0,
        "data": {"detections": [{"module": IMG, "instruction": SCRIPT, "opcode": "reshape",
                                 "shapes": [IMG], "layouts": [SCRIPT], "description": IMG,
                                 "source": IMG, "inner_instruction": SCRIPT}],
                 "time_source": IMG}}
    tools["get_kernel_stats"] = {
        "name": "get_kernel_stats", "status": "DATA", "elapsed_ms": 2.0,
        "data": [{"kernel_name": f"void {SCRIPT}<{IMG}>(int)", "op_name": IMG,
                  "occupancy_pct": 50.0, "total_duration_us": 3.0, "grid_dim": IMG}]}
    tools["get_utilization_viewer"] = {
        "name": "get_utilization_viewer", "status": "ERROR", "elapsed_ms": 1.0,
        "error": SCRIPT}
    tools["llo_bundle_lookup"] = {"name": IMG, "status": "ERROR", "error": SCRIPT}
    snapshot["collection"] = {"jobs": {IMG: {"status": SCRIPT, "elapsed_ms": 4.0,
                                             "peak_rss_bytes": 2**30}},
                              "skipped": [{"job": IMG, "reason": f"`{SCRIPT}`"}]}
    analysis["session"]["capture"] = {"kind": "on_demand", "trigger": IMG, "note": SCRIPT,
                                      "failed_hosts": {IMG: SCRIPT}}


def pages() -> None:
    for case in sorted(p for p in GOLDENS.iterdir() if p.is_dir()):
        name, page = render_case(case)
        (case / name).write_text(page)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pages", action="store_true", help="only re-render the pages")
    parser.add_argument("--only", choices=("fixtures", "planted", "diffs", "unit"))
    args = parser.parse_args()
    if not args.pages:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            steps = {"unit": unit_variants, "fixtures": lambda: fixtures(work),
                     "planted": lambda: planted(work), "diffs": lambda: planted_diffs(work)}
            for key, step in steps.items():
                if args.only in (None, key):
                    step()
    pages()


if __name__ == "__main__":
    main()
