"""The engine on real JAX CPU profiles of the shapes real captures have (issue 11): no step
markers, an idle window, custom calls, a fused transpose, a fused convert (a control), a big
setup program, and a healthy baseline. Each is profiled and analysed once per session."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mldiag.analysis.engine import analyze

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def analysed(workload_run_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
             ) -> Callable[[str], tuple[dict[str, Any], str]]:
    """Factory: workload -> (analysis.json, summary.html as plain text), analysed once."""
    cache: dict[str, tuple[dict[str, Any], str]] = {}

    def run(workload: str) -> tuple[dict[str, Any], str]:
        if workload not in cache:
            out = tmp_path_factory.mktemp(f"{workload}-analysis")
            a = analyze(workload_run_dir(workload), out).analysis
            page = (out / "summary.html").read_text(encoding="utf-8")
            text = html.unescape(re.sub(r"<[^>]+>", " ", page))
            cache[workload] = a, " ".join(text.split())
        return cache[workload]

    return run


def _check(a: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in a["checks"] if c["check"].startswith(name))


def test_no_step_markers_is_judged_over_the_capture_window(analysed):
    a, text = analysed("no_step_markers")
    m = a["metrics"]
    assert m["step_time_ms"] is None and m["step_time_spread"] is None  # none invented
    assert m["judged_over"] == m["device_idle_window"] == "capture window"
    assert m["device_idle_percent"] is not None
    util = _check(a, "compute utilization")
    assert util["passed"] is not None and "capture window" in util["source"]
    assert any("no step markers" in n for n in a["not_judged"])
    f = a["findings"][0]
    assert f["category"] == "convert_reduce" and f["priority"] in ("P0", "P1")
    assert f["impact"]["unit"] == "% of device time" and f["impact"]["value"] > 10
    for finding in a["findings"]:
        assert "% of step" not in finding["title"] + finding["impact"]["text"]
    # The fix names the line from op metadata (stack frames), not only the op path.
    assert "no_step_markers.py:" in f["fix"] and "no_step_markers.py:" in a["summary"]
    assert "% of step" not in a["summary"] + text and "% of device time" in text


def test_idle_window_is_an_idle_finding_with_its_source_and_culprit(analysed):
    a, text = analysed("idle_window")
    assert a["status"] == "NEEDS_ATTENTION"
    m = a["metrics"]
    assert m["device_idle_percent"] > 80 and m["device_idle_window"] == "capture window"
    assert m["device_idle_source"].startswith("timeline")
    f = a["findings"][0]
    assert f["category"] == "idle" and f["priority"] in ("P0", "P1")
    assert "capture window" in f["title"] and m["device_idle_source"] in f["impact"]["text"]
    # The busy share is mldiag's own timeline pass: cited under its name, with its inputs.
    assert any(e["tool"] == "mldiag.timeline" and e.get("from") for e in f["evidence"])
    # The host frame that fills the gaps is named, with the line, from the host events.
    assert "_host_sleep" in f["what"] and "idle_window.py:" in f["fix"]
    assert any(e["tool"] == "aggregate_xplane_events" for e in f["evidence"])
    assert not [x for x in a["findings"] if x["category"] in ("memory_bound", "compute_bound")]
    assert _check(a, "compute utilization")["passed"] is False
    assert _check(a, "idle")["passed"] is False
    assert "Device idle" in text and "of the capture window, XLA:CPU idle" in text
    assert "of each step" not in text
    # xprof's device metrics do not apply to CPU: its 0% duty cycle is no evidence here.
    assert not [e for e in f["evidence"] if e["tool"] == "get_xprof_overview"]


def test_custom_calls_share_is_surfaced_with_the_linalg_ops(analysed):
    a, text = analysed("custom_calls")
    f = next(x for x in a["findings"] if x["title"].startswith("Library calls"))
    assert f["priority"] == "P1" and f["impact"]["value"] >= 50
    # Recoverable time: each call has a cheaper form, not a visibility caveat.
    assert "cheaper form" in f["title"] and "0 FLOPs" not in f["title"]
    assert all(api in f["title"] for api in ("eigh", "svd"))
    assert "lapack_" in f["what"] and "custom_calls.py:" in f["fix"]
    # The advice follows which outputs the HLO reads: the step uses eigenvectors (so no
    # `eigvalsh`) and only the singular values (U and V unread).
    assert "eigenvectors are read" in f["fix"] and "only the singular values" in f["fix"]
    cited = {(e["tool"], e["field"]) for e in f["evidence"]}
    assert ("mldiag.custom_calls", "custom_calls[0].percent_of_step") in cited
    # No bound is claimed from calls without a FLOP count, and the finding covers the calls,
    # so no caveat repeats it.
    assert not [x for x in a["findings"] if x["category"] in ("memory_bound", "compute_bound")]
    assert not any(n.startswith("custom-call efficiency") for n in a["not_judged"])
    assert "Library calls (" in text and "lapack_ssyevd_ffi" in text  # the HTML table


def test_transpose_fused_into_its_consumer_is_counted_with_its_cost(analysed):
    a, text = analysed("fused_transpose")
    f = a["findings"][0]
    assert f["category"] == "layout_copy" and f["priority"] == "P1"
    assert f["title"].startswith("Transpose fused into the add/tanh kernel")
    assert f["impact"]["value"] > 10 and "upper bound" in f["impact"]["text"]
    assert "add_tanh_fusion" in f["what"]
    # The fix is the user's `x.T` at its line, not a device_put format.
    assert "fused_transpose.py:" in f["fix"] and "x.T" in f["fix"]
    assert "Format(" not in f["fix"] and "einsum" in f["fix"]
    assert a["status"] == "NEEDS_ATTENTION"
    assert "Transpose fused into the add/tanh kernel" in text and "up to " in text


def test_converts_fused_into_their_reductions_are_not_findings(analysed):
    a, _ = analysed("fused_convert")
    assert not [f for f in a["findings"] if f["category"] == "convert_reduce"], a["findings"]
    assert _check(a, "no detector finding")["passed"] is True


def test_memory_is_judged_on_the_step_program_not_the_setup(analysed):
    a, text = analysed("setup_memory")
    m = a["metrics"]
    assert m["peak_memory_program"].startswith("jit_step(")
    assert m["peak_memory_gib"] < 0.1 and m["oom_risk"] == "LOW"
    assert not [f for f in a["findings"] if f["category"] == "memory_pressure"]
    assert "jit_init" not in a["summary"] and m["peak_memory_program"] in text


def test_healthy_cpu_baseline_is_optimal_and_shows_every_check(analysed):
    a, text = analysed("baseline")
    assert a["status"] == "OPTIMAL", (a["checks"], a["findings"])
    assert "Health checks" in text
    for c in a["checks"]:
        assert c["passed"] is True and c["check"] in text and c["target"] in text
        # As the table prints it (`{:g}`: 96.0 shows as 96).
        shown = f"{c['value']:g}" if isinstance(c["value"], int | float) else str(c["value"])
        assert shown in text
