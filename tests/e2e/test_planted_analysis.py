"""The whole engine on real planted-bottleneck JAX profiles: each gets its own cause."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from mldiag.analysis.engine import analyze

pytestmark = pytest.mark.slow

PLANTED = {
    "host_bound": "host_bound",
    "layout_copy": "layout_copy",
    "unfused_reshape": "unfused_reshape",
    "convert_reduce": "convert_reduce",
    "memory_pressure": "memory_pressure",
    # 8 XLA:CPU devices all-gathering every step: no op profile, only the timeline sees it.
    "collective_bound": "communication",
}
PLANTED_CATEGORIES = set(PLANTED.values())


@pytest.mark.parametrize("workload", sorted(PLANTED))
def test_planted_bottleneck_is_found_at_p0_or_p1(
    workload: str, workload_run_dir: Callable[[str], Path], tmp_path: Path
):
    a = analyze(workload_run_dir(workload), tmp_path).analysis
    assert a["status"] == "NEEDS_ATTENTION"
    top = [f for f in a["findings"] if f["priority"] in ("P0", "P1")]
    assert PLANTED[workload] in {f["category"] for f in top}, a["findings"]
    finding = next(f for f in top if f["category"] == PLANTED[workload])
    assert finding["evidence"] and finding["fix"] and finding["what"]
    # The planted cause is the top finding, not buried under side effects.
    assert a["findings"][0]["category"] == PLANTED[workload]
    assert (tmp_path / "summary.html").stat().st_size > 5000


def test_host_bound_names_the_host_side_culprit(workload_run_dir, tmp_path):
    a = analyze(workload_run_dir("host_bound"), tmp_path).analysis
    f = a["findings"][0]
    assert f["priority"] == "P0"
    assert "time sleep" in f["what"]
    assert any(e["tool"] == "aggregate_xplane_events" for e in f["evidence"])


def test_baseline_has_no_p0_in_planted_categories(workload_run_dir, tmp_path):
    a = analyze(workload_run_dir("baseline"), tmp_path).analysis
    assert not [f for f in a["findings"]
                if f["priority"] == "P0" and f["category"] in PLANTED_CATEGORIES]
    # A healthy CPU profile can be OPTIMAL: memory is judged by the stated CPU rule (the
    # profile records no capacity), and every check is shown with its value and threshold.
    assert a["status"] == "OPTIMAL", (a["checks"], a["not_judged"], a["findings"])
    oom = next(c for c in a["checks"] if c["check"] == "OOM risk is LOW")
    assert oom["passed"] is True and "CPU" in oom["source"] and a["metrics"]["oom_risk_rule"]
    assert all(c["passed"] is True for c in a["checks"])
