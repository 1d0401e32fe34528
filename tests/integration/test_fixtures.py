"""The engine on the team's real TPU and GPU traces, checked against xprof's own numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mldiag.analysis.collection.collect import COLLECTION_TOOLS, collect
from mldiag.analysis.engine import analyze
from mldiag.cli.main import main


@pytest.fixture(scope="module")
def tpu_result(tpu_logdir: Path, tmp_path_factory: pytest.TempPathFactory):
    return analyze(tpu_logdir, tmp_path_factory.mktemp("tpu_out"))


def test_tpu_verdict_and_p0_cause(tpu_result):
    a = tpu_result.analysis
    assert a["status"] == "NEEDS_ATTENTION"
    p0 = [f for f in a["findings"] if f["priority"] == "P0"]
    assert p0 and p0[0]["category"] in ("data_transfer", "memory_bound")
    assert "copy-done" in p0[0]["title"]
    # The fix names a concrete JAX change, not generic advice.
    assert "jax.device_put" in p0[0]["fix"]


def test_tpu_metrics_agree_with_xprof(tpu_result):
    m = tpu_result.analysis["metrics"]
    assert m["roofline_efficiency_percent"] == pytest.approx(4.35)
    assert m["peak_memory_gib"] == pytest.approx(20.02)
    assert m["memory_capacity_gib"] == pytest.approx(31.25)
    assert m["oom_risk"] == "LOW"
    assert m["device_idle_percent"] == pytest.approx(13.4)
    assert m["step_time_ms"] is None
    assert any("step time" in s for s in tpu_result.analysis["not_judged"])


def test_analysis_json_contract(tpu_result):
    a = json.loads((tpu_result.out_dir / "analysis.json").read_text())
    for key in ("schema_version", "session", "status", "summary", "metrics", "findings", "tools",
                "follow_ups", "investigator"):
        assert key in a
    assert set(a["metrics"]) >= {"step_time_ms", "device_idle_percent",
                                 "roofline_efficiency_percent", "peak_memory_gib",
                                 "memory_capacity_gib", "oom_risk"}
    assert a["investigator"] == "rule-based"
    assert len(a["follow_ups"]) <= 4
    assert [t["name"] for t in a["tools"]] == list(COLLECTION_TOOLS)
    assert 3 <= a["summary"].count(". ") + 1 <= 6
    for f in a["findings"]:
        assert f["priority"] in ("P0", "P1", "P2")
        assert f["evidence"] and all(set(e) == {"tool", "field", "value"} or (
            e["tool"].startswith("mldiag.") and set(e) == {"tool", "field", "value", "from"})
            for e in f["evidence"])
        assert f["what"] and f["fix"] and f["impact"]["unit"]
    # mldiag's own passes, which evidence cites by name, and what each is computed from.
    assert {p["name"] for p in a["passes"]} >= {"mldiag.timeline", "mldiag.custom_calls"}
    assert all(p["from"] for p in a["passes"])
    for name in ("health_snapshot.json", "investigation.json", "summary.html"):
        assert (tpu_result.out_dir / name).is_file()


def test_evidence_values_are_copied_from_the_snapshot(tpu_result):
    from mldiag.analysis.judgement import evidence as ev

    snap = json.loads((tpu_result.out_dir / "health_snapshot.json").read_text())
    findings = tpu_result.analysis["findings"]
    assert findings
    for f in findings:
        # Rows of a follow-up or an HLO excerpt are not in the snapshot; every finding cites
        # at least one value that is, and each of those is the snapshot's own.
        cited = [(e, data) for e in f["evidence"]
                 if (data := ev.tool_data(snap, e["tool"])) is not None]
        assert cited, f"{f['title']}: no evidence from the snapshot"
        for e, data in cited:
            assert ev.lookup(data, e["field"]) == e["value"], (f["title"], e)


def test_collect_is_deterministic(tpu_logdir: Path):
    first, second = collect(tpu_logdir), collect(tpu_logdir)
    for name in COLLECTION_TOOLS:
        a, b = first["tools"][name], second["tools"][name]
        assert a["status"] == b["status"], name
        assert a.get("data") == b.get("data"), name


def test_gpu_fixture_completes_with_an_honest_verdict(gpu_logdir: Path, tmp_path: Path):
    a = analyze(gpu_logdir, tmp_path).analysis
    assert a["status"] == "NEEDS_ATTENTION"
    # No HLO in a 2020 TensorFlow trace: the detectors say so instead of claiming health.
    assert any("detector" in s for s in a["not_judged"])
    assert a["metrics"]["roofline_efficiency_percent"] is None
    assert a["metrics"]["peak_memory_gib"] == pytest.approx(5.78)
    assert [f["category"] for f in a["findings"]][0] == "idle"
    # One captured 21 ms step is too few to judge by: the device is busy 3% of its 953 ms
    # active span, which the timeline measures, and the report says which source it used.
    m = a["metrics"]
    assert m["device_idle_source"].startswith("timeline")
    assert m["device_idle_window"] == m["judged_over"] == "capture window"
    assert m["device_idle_percent"] == pytest.approx(96.85)
    assert m["device_idle_sources"]["step trace (1 step)"] == pytest.approx(30.2)
    assert a["findings"][0]["priority"] == "P0"
    assert "capture window" in a["findings"][0]["title"]
    # Only GPU:4 and GPU:6 ran work; the six others are named.
    assert "6 of 8 devices ran no work (GPU:0, GPU:1, GPU:2, GPU:3, GPU:5, GPU:7)" in a[
        "findings"][0]["title"]
    # Devices that ran nothing are placement, not input: a TF distribution strategy, not
    # tf.data prefetching (nor JAX advice, for a TF program).
    fix = a["findings"][0]["fix"]
    assert "MirroredStrategy" in fix and "prefetch" not in fix and "jax" not in fix
    assert any(f["tool"] == "get_kernel_stats" and f["status"] == "DATA" for f in a["follow_ups"])
    # The top kernels are named, with their share of kernel time (Philox RNG is 26.6%).
    assert ("`tensorflow::functor::FillPhiloxRandomKernelLaunch` (26.6% of kernel time, 194 "
            "launches)") in a["findings"][0]["what"]


def test_per_device_idle_is_labelled_as_mldiags_own(gpu_logdir: Path):
    # xprof has no per-device idle for this trace (`get_step_trace --device_core N` answers
    # the session's 30.2% for every core): the timeline's own figures say whose they are.
    from mldiag.analysis.judgement import evidence as ev

    tl = ev.tool_data(collect(gpu_logdir), ev.TIMELINE)
    assert tl["device_idle_basis"]["by"] == ev.TIMELINE
    assert "--device_core" in tl["device_idle_basis"]["why"]
    devices = {d["device"]: d for d in tl["per_host"][0]["devices"]}
    assert devices["/device:GPU:0"]["idle_in_active_span_percent"] == 100.0
    assert devices["/device:GPU:6"]["idle_in_active_span_percent"] == pytest.approx(
        100.0 - devices["/device:GPU:6"]["busy_in_active_span_percent"])


def test_cli_prints_verdict_findings_and_report_path(tpu_logdir: Path, tmp_path: Path, capsys):
    assert main(["analyze", str(tpu_logdir), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[0].startswith("NEEDS_ATTENTION")
    assert any(ln.strip().startswith("P0 data_transfer") for ln in lines)
    assert lines[-1] == f"summary: {tmp_path / 'summary.html'}"
    assert "get_roofline_model" in out.err  # progress lines while the tools run


def test_cli_json_output(tpu_logdir: Path, tmp_path: Path, capsys):
    assert main(["analyze", str(tpu_logdir), "--out", str(tmp_path), "--json", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "NEEDS_ATTENTION"


def test_multi_host_session(tpu_logdir: Path, tmp_path: Path):
    """Two hosts in one session: all tools see both, single-host tools pick per host."""
    src = next(tpu_logdir.glob("plugins/profile/*/*.xplane.pb"))
    session = tmp_path / "run" / "plugins" / "profile" / "s1"
    session.mkdir(parents=True)
    for host in ("host-a", "host-b"):
        (session / f"{host}.xplane.pb").write_bytes(src.read_bytes())
    a = analyze(tmp_path / "run", tmp_path / "out").analysis
    assert a["session"]["hosts"] == ["host-a", "host-b"]
    assert a["metrics"]["peak_memory_gib"] == pytest.approx(20.02)
    assert a["metrics"]["oom_risk"] == "LOW"
    assert a["findings"][0]["category"] == "data_transfer"
    assert any(f["tool"] == "get_hosts" for f in a["follow_ups"])


def test_tool_timeout_is_recorded_not_fatal(tpu_logdir: Path):
    snap = collect(tpu_logdir, tool_timeout_s=0.0)
    assert snap["tools"]["get_xprof_overview"]["status"] == "DATA"
    timed_out = [t for t in snap["tools"].values() if "timed out" in t.get("error", "")]
    assert timed_out and all(t["status"] == "ERROR" for t in timed_out)


def test_a_stuck_op_stats_build_is_killed_and_the_analysis_still_finishes(
        tpu_eight_copies: Path):
    tpu_logdir = tpu_eight_copies
    snap = collect(tpu_logdir, prepare_timeout_s=0.0)
    tools = snap["tools"]
    assert tools["get_xprof_overview"]["status"] == "ERROR"
    assert "timed out after 0 s (worker killed)" in tools["get_xprof_overview"]["error"]
    # What reads op_stats is skipped with the reason rather than rebuilding them ...
    assert tools["get_roofline_model"]["status"] == "ERROR"
    assert "needs op_stats, which failed" in tools["get_roofline_model"]["error"]
    # ... and what does not still runs.
    assert tools["get_memory_profile"]["status"] == "DATA"
    killed = snap["collection"]["killed"]
    assert [k["job"] for k in killed] == ["op_stats"]
    # The next analysis starts clean.
    assert collect(tpu_logdir)["tools"]["get_xprof_overview"]["status"] == "DATA"


@pytest.mark.parametrize("logdir_fixture", ["tpu_logdir", "gpu_logdir"])
def test_smart_suggestions_beside_the_op_stats_build_are_those_after_it(
        logdir_fixture: str, request: pytest.FixtureRequest):
    # collect() converts them in a run directory of their own while op_stats are built,
    # which is only right if the converter does not read the saved op_stats.
    from mldiag.analysis.collection.profile_input import resolve_session
    from mldiag.analysis.collection.xprof_tools import XprofWorkspace

    session = resolve_session(request.getfixturevalue(logdir_fixture))
    with XprofWorkspace(session) as ws:
        beside = ws.fetch_tool_data("smart_suggestion", run_dir=ws.side_run_dir("smart"))
        assert not list(ws.run_dir.glob("*op_stats*"))
        ws.precompute_op_stats()
        after = ws.fetch_tool_data("smart_suggestion")
    assert beside == after
    assert "suggestions" in after
