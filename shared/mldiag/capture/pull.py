"""Pull delivery: how the control plane asks an SDK target for a capture without connecting
to it.

The capture stage leaves a `ControlRequest` in the target's mailbox in the state store. The
SDK in the workload takes it (`mldiag.sdk.pull`, every `MLDIAG_PULL_POLL_S`), runs it in its
own process and answers through the paths a workload already has:

- a capture: it uploads `<run>/plugins/profile/<session>/<host>.xplane.pb`, which
  `on_profile_object` registers like any profile, or records its host FAILED with the reason;
- continuous start/stop: it updates its target record (`continuous`, `last_request`,
  `last_error`).

The stage waits for that answer until the request's deadline, or until the target stops
heartbeating, and then withdraws the request (if still untaken) and records "no answer from
<host> within N s". Locally the SDK takes its
requests from the state store itself; on Google Cloud through the registration function's
`take_requests` operation, which calls `take_requests` below.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping

from mldiag.capture.targets import liveness
from mldiag.messages import CaptureProfile, ContinuousProfiling
from mldiag.model import ControlRequest, TargetRecord, check_name
from mldiag.ports import StateStore
from mldiag.settings import Settings

# How often the stage looks for the answers it waits on.
ANSWER_POLL_S = 0.25


def take_requests(state: StateStore, run: str, host: str, now: float) -> list[ControlRequest]:
    """The requests waiting for the pull target (run, host), taken: each is returned to
    exactly one caller. What the SDK's poller calls, and the registration function's
    `take_requests` operation for a workload on Google Cloud. ValueError on a bad name."""
    check_name("run", run)
    check_name("host", host)
    return state.take_requests(run, host, now)


def no_answer(host: str, waited_s: float, why: str = "") -> str:
    """The reason recorded for a pull target that did not answer."""
    return f"no answer from {host} within {waited_s:.0f} s" + (f" ({why})" if why else "")


def capture_request(msg: CaptureProfile, target: TargetRecord, *, start_at: float,
                    wait_s: float, now: float, answer_s: float) -> ControlRequest:
    """The request for one host's capture of `msg`: trace (or cut from the ring) from
    `start_at`, waiting at most `wait_s` for a busy profiler. It can be taken until the latest
    start plus half the answer time, so a late taker still has time to upload."""
    return ControlRequest(
        id=f"{msg.request_id or 'capture'}:{msg.run}/{msg.session}/{target.host}"[:200],
        run=target.run, host=target.host, action=msg.capture, session=msg.session,
        created_at=now, expires_at=start_at + wait_s + answer_s / 2, start_at=start_at,
        duration_s=msg.duration_s, wait_s=wait_s,
        options={"host_tracer_level": msg.host_tracer_level,
                 "device_tracer_level": msg.device_tracer_level,
                 "python_tracer_level": msg.python_tracer_level})


def capture_deadline(request: ControlRequest, answer_s: float) -> float:
    """When the stage stops waiting for a capture's profile."""
    span = request.duration_s if request.action == "on_demand" and request.duration_s else 0.0
    return request.start_at + request.wait_s + span + answer_s


def continuous_request(msg: ContinuousProfiling, target: TargetRecord, *, now: float,
                       answer_s: float) -> ControlRequest:
    """The request to start or stop a target's continuous profiling (its ring)."""
    options = ({"window_s": msg.window_s, "max_bytes": msg.max_bytes,
                "host_tracer_level": msg.host_tracer_level,
                "device_tracer_level": msg.device_tracer_level,
                "python_tracer_level": msg.python_tracer_level}
               if msg.action == "start" else {})
    return ControlRequest(
        id=msg.request_id or uuid.uuid4().hex, run=target.run, host=target.host,
        action=f"continuous_{msg.action}", created_at=now, expires_at=now + answer_s / 2,
        start_at=now, options=options)


def await_answers(state: StateStore, settings: Settings, run: str,
                  waiting: Mapping[str, tuple[ControlRequest, float]],
                  answered: Callable[[str, TargetRecord | None], bool],
                  clock: Callable[[], float] = time.time) -> dict[str, str]:
    """Wait until every host in `waiting` (host -> (request, deadline)) has `answered`, its
    deadline has passed, or its target stopped heartbeating; returns {host: reason} for
    those that did not answer, whose requests are withdrawn if still untaken."""
    left = dict(waiting)
    failed: dict[str, str] = {}
    while left:
        now = clock()
        targets = {t.host: t for t in state.list_targets(run)}
        for host, (request, deadline) in list(left.items()):
            target = targets.get(host)
            if answered(host, target):
                del left[host]
                continue
            why = "its target is no longer registered" if target is None else liveness(
                target, settings, now)
            if why or now >= deadline:
                # Withdrawn, so that a workload that wakes up later does not serve it.
                untaken = state.withdraw_request(run, host, request.id)
                why = ", ".join(x for x in ("it never took the request" if untaken else "",
                                            why) if x)
                failed[host] = no_answer(host, now - request.created_at, why)
                del left[host]
        if left:
            time.sleep(ANSWER_POLL_S)
    return failed
