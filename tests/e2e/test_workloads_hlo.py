"""Real JAX workloads: each planted bottleneck shows up in its own HLO detector.

Every workload runs in a subprocess on XLA:CPU and writes a standard XProf logdir;
the HLO text of every module is read back through xprof, as the collection does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mldiag.analysis.collection.hlo.detectors import (
    Detection,
    detect_layout_mismatch_copies,
    detect_unfused_reshapes,
    detect_unnecessary_convert_reduce,
)

pytestmark = pytest.mark.slow

DETECTORS: dict[str, Callable[[dict[str, str]], list[Detection]]] = {
    "detect_layout_mismatch_copies": detect_layout_mismatch_copies,
    "detect_unfused_reshapes": detect_unfused_reshapes,
    "detect_unnecessary_convert_reduce": detect_unnecessary_convert_reduce,
}
# workload -> (its detector, the executing instruction it plants in jit_step)
PLANTED = {
    "layout_copy": ("detect_layout_mismatch_copies", "wrapped_copy"),
    "unfused_reshape": ("detect_unfused_reshapes", "copy_bitcast_fusion"),
    "convert_reduce": ("detect_unnecessary_convert_reduce", "wrapped_convert"),
}


class _Profile:
    def __init__(self, run_dir: Path) -> None:
        from xprof.cli.xprof_cli import _wrap_with_logdir, cli_main

        self.run_dir = str(run_dir)
        self._tools = cli_main()
        self._wrap = _wrap_with_logdir

    def call(self, tool: str, **kwargs: Any) -> dict[str, Any]:
        result = self._wrap(self._tools[tool])(self.run_dir, **kwargs)
        return json.loads(result) if isinstance(result, str) else result

    def hlo_texts(self) -> dict[str, str]:
        modules = self.call("list_hlo_modules")["modules"]
        return {
            m: self.call("get_hlo_text", module_name=m, max_lines=10_000_000)["content"]
            for m in modules
        }

    def step_ms(self) -> float:
        (train,) = self.call("aggregate_xplane_events", event_regex="^train$")["aggregates"]
        return train["total_duration_ps"] / 1e9

    def op_ms(self, name: str) -> float:
        found = self.call(
            "aggregate_xplane_events", event_regex=f"^{re.escape(name)}$", group_by="event,line"
        )["aggregates"]
        return sum(a["total_duration_ps"] for a in found if a["line"].startswith("tf_XLA")) / 1e9


@pytest.fixture(scope="module")
def profile(workload_run_dir: Callable[[str], Path]) -> Callable[[str], _Profile]:
    return lambda workload: _Profile(workload_run_dir(workload))


def _detections(texts: dict[str, str]) -> dict[str, list[Detection]]:
    return {name: detector(texts) for name, detector in DETECTORS.items()}


@pytest.mark.parametrize("workload", sorted(PLANTED))
def test_planted_workload_triggers_only_its_detector(profile, workload):
    detector, instruction = PLANTED[workload]
    p = profile(workload)
    found = _detections(p.hlo_texts())
    in_step = [d for d in found[detector] if d.module.startswith("jit_step(")]
    assert [d.instruction for d in in_step] == [instruction], found[detector]
    for other, detections in found.items():
        if other != detector:
            assert detections == [], (other, detections)
    # The reported name is the one on the timeline, and the op is a material share.
    share = p.op_ms(instruction) / p.step_ms()
    assert share >= 0.10, f"{instruction} is only {share:.1%} of the step"


def test_baseline_triggers_no_detector(profile):
    found = _detections(profile("baseline").hlo_texts())
    assert found == {name: [] for name in DETECTORS}


def test_host_bound_workload_leaves_the_device_mostly_idle(profile):
    p = profile("host_bound")
    texts = p.hlo_texts()
    assert _detections(texts) == {name: [] for name in DETECTORS}
    (step,) = [t for m, t in texts.items() if m.startswith("jit_step(")]
    ops = re.findall(r"^\s+(?:ROOT )?(\S+) = ", step.split("\nENTRY ", 1)[1], re.MULTILINE)
    device_ms = sum(p.op_ms(op) for op in ops)
    assert device_ms / p.step_ms() < 0.3


def test_memory_pressure_workload_has_large_buffers(profile):
    p = profile("memory_pressure")
    assert _detections(p.hlo_texts()) == {name: [] for name in DETECTORS}
    modules = p.call("get_peak_allocations")["modules"]
    (step,) = [m for m in modules if m["module_name"].startswith("jit_step(")]
    assert step["total_hbm_mib"] >= 256
