"""Real XLA:CPU captures of what must not be judged as the workload, and of a host loop."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from mldiag.analysis.engine import analyze

pytestmark = pytest.mark.slow


def test_a_compile_step_inside_the_window_is_left_out_and_said(
    workload_run_dir: Callable[[str], Path], tmp_path: Path
):
    a = analyze(workload_run_dir("compile_in_window"), tmp_path).analysis
    m = a["metrics"]
    (gone,) = m["steps_excluded"]
    assert gone["step_index"] == 0 and gone["reason"] == "compilation"
    # The step time is the compiled program's, not the compile step's.
    assert m["step_time_ms"] < gone["step_time_ms"] / 2
    assert m["step_time_spread"]["steps"] == 7
    assert not [f for f in a["findings"] if f["category"] == "host_bound"
                and f["priority"] in ("P0", "P1")], a["findings"]
    assert "left out as not the workload's steady state: step 0 (compilation" in a["summary"]
    for f in a["findings"]:
        assert "traceback_util" not in f["fix"] and "compile_or_get_cached" not in f["fix"]
    assert "left out: step 0 (compilation" in (tmp_path / "summary.html").read_text()


def test_a_host_loop_gets_the_jit_fix_at_its_line(
    workload_run_dir: Callable[[str], Path], tmp_path: Path
):
    a = analyze(workload_run_dir("host_loop"), tmp_path).analysis
    top = a["findings"][0]
    # P0 or P1 by how much of each step the host's dispatch takes, which a loaded machine
    # moves across the P0 bar; what the test holds is where the fix points.
    assert top["category"] == "host_bound" and top["priority"] in ("P0", "P1"), top
    assert top["fix"].startswith("At `host_loop.py:")
    assert "jax.jit" in top["fix"]
    assert "profiler.py" not in top["fix"]
