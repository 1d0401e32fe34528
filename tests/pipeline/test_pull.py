"""Pull delivery through the real stages and SQLite, with the workload's side played by the
test: what the capture stage leaves in a pull target's mailbox, and what it records when
nobody answers (the e2e tests run a real SDK workload)."""

from __future__ import annotations

import re
import time
from dataclasses import replace

from mldiag.capture.pull import take_requests
from mldiag.messages import CaptureProfile, ContinuousProfiling
from mldiag.model import FAILED, MAX_PENDING_REQUESTS, ControlRequest, TargetRecord
from tests.helpers.pipeline import MakeRuntime
from tests.helpers.wait import wait_until

RUN = "pulled"


def _pull_target(rt: object, host: str = "h0") -> TargetRecord:
    target = TargetRecord(run=RUN, host=host, delivery="pull", heartbeat_s=0.0,
                          last_heartbeat=time.time() + 3600)
    rt.state.ensure_run(RUN, discovered=False)  # type: ignore[attr-defined]
    rt.state.upsert_target(target)  # type: ignore[attr-defined]
    return target


def test_the_request_a_workload_takes_says_what_to_capture(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(pull_answer_s=5.0, capture_wait_s=3.0)
    _pull_target(rt)
    rt.start()
    before = time.time()
    rt.services.bus.publish(CaptureProfile(run=RUN, session="s1", duration_s=1.5,
                                           host_tracer_level=3, python_tracer_level=1))
    (request,) = wait_until(lambda: take_requests(rt.state, RUN, "h0", time.time()),
                            what="the request in h0's mailbox")
    assert (request.action, request.session, request.duration_s, request.wait_s) == (
        "on_demand", "s1", 1.5, 3.0)
    assert request.options == {"host_tracer_level": 3, "device_tracer_level": 1,
                               "python_tracer_level": 1}
    assert before < request.start_at < request.expires_at
    # Taken once: a second poll finds nothing. Then the workload answers with its upload.
    assert take_requests(rt.state, RUN, "h0", time.time()) == []
    s = wait_until(lambda: (x := rt.state.get_session(RUN, "s1")) and x.state == FAILED and x,
                   timeout=30, what="s1 to fail: the test uploads nothing")
    # It took the request, so the reason does not say it never did.
    assert s.hosts["h0"].reason.startswith("h0: no answer from h0 within ")
    assert "never took" not in s.hosts["h0"].reason


def test_a_request_nobody_takes_is_withdrawn_with_the_reason(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(pull_answer_s=1.0, capture_wait_s=0.5)
    _pull_target(rt)
    rt.start()
    rt.services.bus.publish(CaptureProfile(run=RUN, session="s2", duration_s=0.5))
    s = wait_until(lambda: (x := rt.state.get_session(RUN, "s2")) and x.state == FAILED and x,
                   timeout=30, what="s2 to fail")
    # 1.55 s to the common start, 0.5 s for a busy profiler, 0.5 s capture, 1 s to answer.
    assert re.fullmatch(r"h0: no answer from h0 within [34] s \(it never took the request\)",
                        s.hosts["h0"].reason)
    assert rt.state.take_requests(RUN, "h0", 0.0) == []  # withdrawn, not merely expired


def test_a_full_mailbox_fails_the_host_at_once(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(pull_answer_s=30.0)
    _pull_target(rt)
    for i in range(MAX_PENDING_REQUESTS):
        assert rt.state.put_request(ControlRequest(
            id=f"old-{i}", run=RUN, host="h0", action="snapshot", session=f"old{i}",
            created_at=time.time(), expires_at=time.time() + 600), time.time())
    rt.start()
    rt.services.bus.publish(CaptureProfile(run=RUN, session="s3", capture="snapshot"))
    s = wait_until(lambda: (x := rt.state.get_session(RUN, "s3")) and x.state == FAILED and x,
                   timeout=10, what="s3 to fail")
    assert f"{MAX_PENDING_REQUESTS} requests already wait for it" in s.hosts["h0"].reason


def test_continuous_start_is_answered_on_the_target_record(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(pull_answer_s=20.0)
    target = _pull_target(rt)
    rt.start()
    rt.services.bus.publish(ContinuousProfiling(run=RUN, action="start", window_s=1.0,
                                                request_id="req-1"))
    (request,) = wait_until(lambda: take_requests(rt.state, RUN, "h0", time.time()),
                            what="the continuous request")
    assert (request.action, request.id, request.options["window_s"]) == (
        "continuous_start", "req-1", 1.0)
    # The workload's answer, as mldiag.sdk.pull writes it.
    rt.state.update_target(RUN, "h0", target.port, continuous="RING", last_request="req-1",
                           last_error="")
    assert rt.wait_idle(timeout=30)
    (after,) = rt.state.list_targets(RUN)
    assert (after.continuous, after.last_request, after.last_error) == ("RING", "req-1", "")
    # Unanswered, the stage records why on the target (what `mldiag continuous` prints).
    rt.services.settings = replace(rt.services.settings, pull_answer_s=1.0)
    rt.services.bus.publish(ContinuousProfiling(run=RUN, action="stop", request_id="req-2"))
    wait_until(lambda: rt.state.list_targets(RUN)[0].last_request == "req-2", timeout=30,
               what="req-2 to be recorded")
    (after,) = rt.state.list_targets(RUN)
    assert after.last_error.startswith("continuous stop: no answer from h0 within ")
    assert "never took the request" in after.last_error and after.continuous == "RING"
