"""`mldiag diff` on the team's real traces: honest about what a TPU inference trace and a
GPU training trace cannot share, and xprof's own kernel diff where kernels exist."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mldiag.analysis.collection.profile_input import resolve_session
from mldiag.analysis.diff.compare import build_diff, kpi
from mldiag.analysis.diff.sides import Side
from mldiag.analysis.diff.xprof import xprof_diff
from mldiag.analysis.engine import analyze


def _side(logdir: Path, out: Path, label: str) -> Side:
    import json

    result = analyze(logdir, out)
    return Side(label, json.loads((out / "health_snapshot.json").read_text()), result.analysis,
                json.loads((out / "investigation.json").read_text()), source="analysed now")


@pytest.fixture(scope="module")
def sides(tpu_logdir: Path, gpu_logdir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> dict[str, Side]:
    return {"tpu": _side(tpu_logdir, tmp_path_factory.mktemp("tpu"), "tpu"),
            "gpu": _side(gpu_logdir, tmp_path_factory.mktemp("gpu"), "gpu")}


def test_a_trace_against_itself_has_no_change(sides: dict[str, Side]) -> None:
    doc = build_diff(sides["tpu"], sides["tpu"])
    assert doc["explanation"] == []
    assert all(m["status"] == "unchanged" for m in doc["hlo"]["modules"])
    assert doc["hlo"]["modules"] and doc["ops"]["changed"]
    assert {n["aspect"] for n in doc["comparability"]["notes"]} == {"step markers"}
    assert "no step markers on A and B" in doc["headline"]
    assert doc["findings"]["new"] == [] and doc["findings"]["resolved"] == []


def test_a_tpu_and_a_gpu_trace_are_compared_honestly(sides: dict[str, Side]) -> None:
    doc: dict[str, Any] = build_diff(sides["tpu"], sides["gpu"])
    notes = {n["aspect"]: n for n in doc["comparability"]["notes"]}
    assert (notes["device type"]["a"], notes["device type"]["b"]) == ("TPU v6 Lite", "GPU")
    assert doc["comparability"]["level"] == "step level only"
    assert "step markers" in notes and "HLO of B" in notes
    assert "no HLO modules" in notes["HLO of B"]["consequence"]
    # Nothing op by op across devices; device idle, which both measure, is compared.
    assert doc["ops"]["changed"] == [] and "different device types" in doc["ops"]["note"]
    assert [i["kind"] for i in doc["explanation"]] == ["device_idle"]
    assert kpi(doc, "device idle")["a"] == pytest.approx(13.4)
    assert doc["headline"].startswith("Against tpu (TPU v6 Lite; this is GPU)")
    assert {c["key"] for c in doc["config"]["changed"]} >= {"device_type"}


def test_xprofs_diff_sessions_gives_the_kernel_diff_of_gpu_traces(gpu_logdir: Path,
                                                                  sides: dict[str, Side]
                                                                  ) -> None:
    session = resolve_session(gpu_logdir)
    result, why = xprof_diff(session, session)
    assert result is not None, why
    assert result["kernel_diffs"] and result["total_device_duration_delta_us"] == 0
    doc = build_diff(sides["gpu"], sides["gpu"], xprof_diff=result)
    k = doc["kernels"]
    assert k["source"] == "xprof diff_sessions" and k["available"]
    assert k["total_device_ms"]["a"] == k["total_device_ms"]["b"] > 0
    # Without xprof's diff, the investigations' get_kernel_stats follow-ups are used.
    assert build_diff(sides["gpu"], sides["gpu"])["kernels"]["source"] == (
        "get_kernel_stats follow-ups")
