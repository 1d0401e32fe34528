"""Big sessions: many hosts fan out to one collect_host each and are combined into one
analysis; a session over the collect function's limits goes to the collect job."""

from __future__ import annotations

import html
import json
from typing import Any

from mldiag.model import ANALYZING, FAILED, REPORTED
from tests.helpers.pipeline import (
    RUN,
    SESSION,
    MakeRuntime,
    analysis_dir,
    bus_messages,
    object_name,
    session_of,
    wait_state,
)
from tests.helpers.wait import wait_until

HOSTS = [f"host-{i}" for i in range(8)]


def _drop(rt: Any, hosts: list[str], content: dict[str, bytes] | None = None,
          default: bytes = b"") -> None:
    for h in hosts:
        rt.storage.write_bytes(object_name(h), (content or {}).get(h, default))


def test_an_eight_host_session_fans_out_and_is_combined_into_one_analysis(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    rt = make_runtime(workers=4)
    rt.start()
    _drop(rt, HOSTS, default=xplane_bytes)
    s = wait_state(rt, REPORTED, timeout=180)
    assert sorted(s.hosts) == HOSTS
    messages = bus_messages(rt.state)
    per_host = [m for m in messages if m["topic"] == "host-analysis-requests"]
    assert sorted(m["body"]["host"] for m in per_host) == HOSTS
    base = analysis_dir(rt)
    assert sorted(p.stem for p in (base / "v1" / "hosts").glob("*.json")) == HOSTS
    snapshot = json.loads((base / "health_snapshot.json").read_text())
    assert snapshot["session"]["hosts"] == HOSTS
    fanned = snapshot["collection"]["fanned_out"]
    assert fanned["hosts"] == 8 and fanned["failed"] == []
    tools = snapshot["tools"]
    # One combined analysis: xprof's op_stats over all eight hosts, and every host's memory.
    assert tools["get_xprof_overview"]["status"] == "DATA"
    assert sorted(tools["get_memory_profile"]["data"]["per_host_peak_gib"]) == HOSTS
    assert tools["get_step_trace"]["status"] in ("DATA", "NO_DATA")
    # Jobs that wait on the per-host parts (the KPI tool needs the memory profile) still run.
    assert tools["get_kpi_metrics"]["status"] == "DATA"
    # The smart suggestions read the combined op_stats, after their build.
    assert tools["get_smart_suggestions"]["status"] == "DATA"
    assert "op_stats" in snapshot["collection"]["jobs"]
    assert snapshot["collection"]["skipped"] == [] and snapshot["collection"]["killed"] == []
    # The async-overlap follow-up, precomputed by each host's share and combined as xprof
    # combines trace files: every host's windows, never merged across hosts.
    overlap = snapshot["precomputed_follow_ups"]["analyze_async_overlap"]["data"]
    assert overlap["summary"]["count"] == 8 * 2395
    assert sorted({k.split(":", 1)[0] for k in overlap["by_plane"]}) == HOSTS
    analyses = [m for m in messages if m["topic"] == "analysis-requests"]
    assert len(analyses) >= 2  # the first asks for the fan-out, the last host's for the combine
    assert rt.wait_idle(30) and rt.state.list_dead_letters() == []


def test_a_host_that_cannot_be_read_is_named_in_a_partial_report(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    rt = make_runtime(workers=4, fanout_min_hosts=3)
    rt.start()
    hosts = HOSTS[:3]
    _drop(rt, hosts, {"host-1": xplane_bytes[:30000]}, default=xplane_bytes)
    s = wait_state(rt, REPORTED, timeout=180)
    snapshot = json.loads((analysis_dir(rt) / "health_snapshot.json").read_text())
    failed = snapshot["session"]["capture"]["failed_hosts"]
    assert list(failed) == ["host-1"] and "not a readable XSpace" in failed["host-1"]
    assert snapshot["session"]["hosts"] == ["host-0", "host-2"]
    assert snapshot["collection"]["fanned_out"]["failed"] == ["host-1"]
    html = (analysis_dir(rt) / "summary.html").read_text()
    assert "host-1" in html and "not a readable XSpace" in html
    assert s.state == REPORTED


def test_a_fanned_out_session_with_no_readable_host_fails_with_each_reason(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    rt = make_runtime(fanout_min_hosts=2)
    rt.start()
    _drop(rt, HOSTS[:2], default=xplane_bytes[:30000])
    s = wait_state(rt, FAILED, timeout=120)
    assert s.reason.startswith("no host could be analysed: host-0: ")
    assert "host-1: " in s.reason


class RecordingJobs:
    """A JobRunner that records what it was asked to start."""

    def __init__(self, execution: str) -> None:
        self.started: list[Any] = []
        self.execution = execution

    def run(self, message: Any) -> str:
        self.started.append(message)
        return self.execution


def test_a_session_over_the_function_limits_goes_to_the_collect_job(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    jobs = RecordingJobs("executions/e1")
    started = jobs.started
    rt = make_runtime(function_max_host_bytes=100_000)
    rt.services.jobs = jobs
    rt.start()
    _drop(rt, ["h0"], default=xplane_bytes)

    def handed() -> bool:
        s = rt.state.get_session(RUN, SESSION)
        return s is not None and s.progress == "job:executions/e1"

    wait_until(handed, what="the hand-off to the collect job")
    assert [(m.run, m.session, m.version) for m in started] == [(RUN, SESSION, 1)]
    assert session_of(rt).state == ANALYZING  # the job's to finish now
    wait_until(lambda: not rt.bus.pending(), what="the bus to drain")
    assert len(started) == 1


def test_without_a_collect_job_an_oversized_session_fails_with_the_reason(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    rt = make_runtime(function_max_host_bytes=100_000)
    rt.start()
    _drop(rt, ["h0"], default=xplane_bytes)
    s = wait_state(rt, FAILED)
    assert "over the collect function's 0.00 GiB per host" in s.reason
    assert "no collect job is configured" in s.reason


def test_the_local_collect_job_runs_the_same_stage_in_its_own_process(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    rt = make_runtime(function_max_host_bytes=100_000, collect_job="local")
    rt.start()
    _drop(rt, ["h0"], default=xplane_bytes)
    s = wait_state(rt, REPORTED, timeout=120)
    assert s.timings.get(ANALYZING)
    snapshot = json.loads((analysis_dir(rt) / "health_snapshot.json").read_text())
    assert snapshot["tools"]["get_xprof_overview"]["status"] == "DATA"
    log = (rt.services.settings.home / "collect-job.log").read_text()
    assert "Traceback" not in log
    # The report says the session took the big-session path, and why.
    why = snapshot["collection"]["collect_job"]["why"]
    assert "over the collect function's 0.00 GiB per host" in why
    analysis = json.loads((analysis_dir(rt) / "analysis.json").read_text())
    assert analysis["collection"]["collect_job"]["why"] == why
    summary = (analysis_dir(rt) / "summary.html").read_text()
    assert "in the collect job (a Cloud Run job), because its largest host is" in summary


def test_a_session_over_the_memory_budget_goes_to_the_collect_job_when_there_is_one(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    jobs = RecordingJobs("executions/e2")
    rt = make_runtime(memory_budget="64M")
    rt.services.jobs = jobs
    rt.start()
    _drop(rt, ["h0"], default=xplane_bytes)
    wait_until(lambda: (s := rt.state.get_session(RUN, SESSION)) is not None
               and s.progress == "job:executions/e2", what="the hand-off to the collect job")
    assert len(jobs.started) == 1 and session_of(rt).state == ANALYZING


def test_in_the_collect_job_the_tasks_share_a_fanned_out_session_s_hosts(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    """A session over the function's limits that fans out: its hosts never go to a function
    instance (no CollectHost on the bus); the job's two tasks take them, task 0 combines."""
    hosts = HOSTS[:6]
    rt = make_runtime(function_max_host_bytes=100_000, collect_job="local",
                      collect_job_tasks=2, fanout_min_hosts=4)
    rt.start()
    _drop(rt, hosts, default=xplane_bytes)
    wait_state(rt, REPORTED, timeout=240)
    log = (rt.services.settings.home / "collect-job.log").read_text()
    assert "Traceback" not in log
    assert bus_messages(rt.state, "host-analysis-requests") == []
    snapshot = json.loads((analysis_dir(rt) / "health_snapshot.json").read_text())
    fanned = snapshot["collection"]["fanned_out"]
    assert fanned["hosts"] == 6 and fanned["failed"] == []
    by_task = fanned["hosts_by_task"]
    assert sorted(by_task) == hosts and set(by_task.values()) <= {0, 1}
    assert 1 in by_task.values(), by_task  # task 1 took its share
    assert fanned["op_stats_windows"] == {h: 1 for h in hosts}
    assert snapshot["tools"]["get_xprof_overview"]["status"] == "DATA"
    assert snapshot["collection"]["skipped"] == [] and snapshot["collection"]["killed"] == []
    summary = html.unescape((analysis_dir(rt) / "summary.html").read_text())
    assert "its 6 hosts were collected one by one and their op_stats combined as xprof " \
           "combines hosts, by the collect job's tasks (task 0: " in summary


def test_a_host_whose_windows_do_not_add_up_is_said_degraded_in_the_fan_out() -> None:
    """A fanned-out host built in time windows whose host database would not add up (an
    activity spanning a cut) is a `degraded` entry naming the host and why; hosts built
    whole or combined exactly are not."""
    from mldiag.stages.analysis import fanned_out_record

    def part(windows: int, inexact: str | None) -> dict[str, Any]:
        built: dict[str, Any] = {"windows": windows, "bytes": 1}
        if inexact is not None:
            built["host_inexact"] = inexact
        return {"parts": {"op_stats": built}, "elapsed_ms": 1.0}

    parts = {"a": part(4, "2 host activities span a cut between windows"), "b": part(3, ""),
             "c": part(1, None), "d": {"failed": "unreadable"}}
    ok = {h: p for h, p in parts.items() if "failed" not in p}
    fanned, degraded = fanned_out_record(parts, ok)
    assert fanned["op_stats_windows"] == {"a": 4, "b": 3, "c": 1}
    assert fanned["failed"] == ["d"]
    assert degraded == [{
        "tools": "xprof's op_stats of host a",
        "reason": "built in 4 time windows and combined: its host op database is not combined "
                  "exactly: 2 host activities span a cut between windows"}]
