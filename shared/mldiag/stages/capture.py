"""The capture stages: an alert becomes a capture under the run's auto-capture policy; a
capture request captures a session on the run's profiler targets (push targets are called,
pull targets answer through their mailbox), and continuous profiling starts or stops.
"""

from __future__ import annotations

import logging
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from mldiag import limits
from mldiag.analysis import validate_xplane
from mldiag.capture import pull
from mldiag.capture.alerts import alert_session
from mldiag.capture.egress import EgressPolicy
from mldiag.capture.remote import CaptureFailed, ProfilerBusy
from mldiag.capture.targets import capture as capture_target
from mldiag.capture.targets import liveness, set_continuous
from mldiag.errors import MldiagError, PermanentFailure, PoisonMessage, ProfileUnreadable
from mldiag.kube.pods import NOWHERE
from mldiag.messages import CaptureProfile, ContinuousProfiling, DegradationDetected
from mldiag.model import (
    CAPTURING,
    FAILED,
    MAX_PENDING_REQUESTS,
    ControlRequest,
    HostRecord,
    SessionRecord,
    TargetRecord,
    check_name,
    session_dir,
    short_reason,
)
from mldiag.stages.claims import claimed
from mldiag.stages.intake import complete_session, live_targets
from mldiag.stages.services import Services, fail

log = logging.getLogger(__name__)

# A capture runs inside one Cloud Functions invocation: waits for a busy target fit in it.
INVOCATION_S = 540.0


# on_degradation_alert


def on_degradation_alert(msg: DegradationDetected, services: Services) -> None:
    """Apply the run's auto-capture policy to an alert: at most one capture per storm."""
    run = services.state.get_run(msg.run)
    if run is None:
        raise PoisonMessage(f"alert {msg.alert_id}: unknown run {msg.run!r}")
    policy = run.policy
    if not policy.enabled:
        log.info("alert %s on run %s: auto-capture is off", msg.alert_id, msg.run)
        return
    key = f"alert:{msg.alert_id}"
    with claimed(services, key) as mine:
        if not mine:
            return
        now = services.clock()
        # The whole job, not only the alerting host: a synchronous job slows down together.
        targets = live_targets(services, run.name)
        if not targets:
            log.warning("alert %s on run %s: no live profiler target to capture", msg.alert_id,
                        run.name)
        elif services.state.reserve_capture(run.name, now, cooldown_s=policy.cooldown_s,
                                            max_per_hour=policy.max_per_hour, key=key):
            kind = policy.kind
            if kind == "auto":
                kind = "snapshot" if any(t.continuous != "OFF" for t in targets) else "on_demand"
            session = alert_session(msg.alert_id)
            services.bus.publish(CaptureProfile(
                run=run.name, session=session, capture=kind,
                targets=sorted({t.host for t in targets}), duration_s=policy.duration_s,
                trigger="alert", request_id=f"alert:{msg.alert_id}",
                note=f"{msg.source} alert: {msg.summary or msg.alert_id}"[:1000]))
            log.info("alert %s on run %s: %s capture %s (%s)", msg.alert_id, run.name, kind,
                     session, msg.summary)
        else:
            log.info("alert %s on run %s: suppressed by the cooldown (%.0f s) or the hourly cap "
                     "(%d)", msg.alert_id, run.name, policy.cooldown_s, policy.max_per_hour)


# on_capture_request


def _select_targets(services: Services, run: str, hosts: Sequence[str]) -> list[TargetRecord]:
    """The named targets, or (none named) those with a fresh heartbeat; one per host name.

    Named targets are tried even when their heartbeat is stale: the user asked for them, and
    the capture records why a dead one failed.
    """
    targets = services.state.list_targets(run)
    unknown = sorted(set(hosts) - {t.host for t in targets})
    if unknown:
        raise PoisonMessage(f"run {run!r} has no target(s) {', '.join(unknown)} (registered: "
                            f"{', '.join(sorted({t.host for t in targets})) or 'none'})")
    if not hosts:
        now = services.clock()
        targets = [t for t in targets if not liveness(t, services.settings, now)]
    # One file per host name: a host re-registered on another port is its newest record.
    newest: dict[str, TargetRecord] = {}
    for t in targets:
        if (not hosts or t.host in hosts) and (
                t.host not in newest or t.last_heartbeat > newest[t.host].last_heartbeat):
            newest[t.host] = t
    try:
        limits.check_hosts(len(newest))
    except ValueError as e:
        raise PoisonMessage(str(e)) from e
    return [newest[h] for h in sorted(newest)]


def on_capture_request(msg: CaptureProfile | ContinuousProfiling, services: Services) -> None:
    """Capture a session on the run's targets, or start/stop continuous profiling."""
    if isinstance(msg, ContinuousProfiling):
        continuous(msg, services)
        return
    if msg.capture not in ("on_demand", "snapshot"):
        raise PoisonMessage(f"capture must be on_demand or snapshot, not {msg.capture!r}")
    try:
        limits.check_capture_duration(msg.duration_s)
        check_name("session", msg.session)
    except ValueError as e:
        raise PoisonMessage(str(e)) from e
    run = services.state.get_run(msg.run)
    if run is None:
        raise PoisonMessage(f"capture {msg.session}: unknown run {msg.run!r}")
    targets = _select_targets(services, run.name, msg.targets)
    now = services.clock()
    request_id = msg.request_id or f"capture:{msg.run}/{msg.session}"
    record = SessionRecord(
        run=run.name, session=msg.session, state=CAPTURING, kind=msg.capture,
        trigger=msg.trigger, expected_hosts=[t.host for t in targets], created_at=now,
        updated_at=now, last_arrival_at=now, timings={CAPTURING: now}, request_id=request_id,
        note=msg.note)
    if not targets:
        record.state, record.reason = FAILED, (
            f"run {run.name} has no live profiler targets (none registered, or no heartbeat "
            f"within {services.settings.target_stale_s:g} s): start the workload with "
            "mldiag.sdk.machinelearning_run(...)")
        services.state.create_session(record)
        _give_back_reservation(services, msg)
        return
    stored, created = services.state.create_session(record)
    if not created and stored.request_id != request_id:
        raise PoisonMessage(f"session {run.name}/{msg.session} already exists (created by "
                            f"{stored.request_id or stored.kind}); choose another name")
    if stored.state != CAPTURING:
        return
    key = f"capture:{run.name}/{msg.session}"
    lease = max(services.settings.lease_s, msg.duration_s + _turn_wait_s(services, msg)
                + services.settings.pull_answer_s + 180.0)
    with claimed(services, key, lease_s=lease) as mine:
        if not mine:
            return
        _capture_all(services, run.storage_prefix, msg,
                     [t for t in targets if t.host not in stored.hosts])


def _check_xspace(data: bytes, host: str) -> None:
    """Only bytes that parse as an XSpace go to the bucket: a target's answer is not trusted."""
    with tempfile.NamedTemporaryFile(suffix=".xplane.pb") as f:
        f.write(data)
        f.flush()
        try:
            validate_xplane(Path(f.name), max_bytes=max(len(data), 1))
        except ProfileUnreadable as e:
            raise CaptureFailed(f"the answer of {host} is not a profile, nothing was stored: "
                                f"{str(e).split(': ', 1)[-1]}") from e


def _capture_all(services: Services, prefix: str, msg: CaptureProfile,
                 targets: list[TargetRecord]) -> None:
    """Capture every target in parallel from one start time; keep what succeeds.

    Push targets are called (their profiler server); pull targets get a request in their
    mailbox and answer with their upload, or their host FAILED, which this waits for."""
    directory = session_dir(prefix, msg.run, msg.session)
    # A host of a GKE job that has no pod to capture (kube-discover's record at NOWHERE): the
    # session expects it, as every host of the job, and fails it with why (no pod yet, no IP
    # yet, its pod ended) rather than with the egress refusal of its placeholder address.
    absent = {t.host: f"{t.host}: {t.last_error}" for t in targets
              if t.address == NOWHERE and t.last_error and not t.pulls}
    targets = [t for t in targets if t.host not in absent]
    # One start time for all, far enough ahead that every request reaches its target first
    # (a pull target looks for requests every pull_poll_s).
    pulled = [t for t in targets if t.pulls]
    lead = services.settings.pull_poll_s + 0.5 if pulled else 0.5
    start_at = services.clock() + lead + 0.05 * len(targets)

    egress = EgressPolicy.from_settings(services.settings)
    cap = services.settings.max_host_bytes

    def one(target: TargetRecord) -> str:
        # One bound for both waits: for our own earlier capture, then for anyone else's.
        deadline = time.monotonic() + _turn_wait_s(services, msg)
        with _profiler_turn(services, target, msg, deadline):
            data = _capture_when_free(target, msg, start_at, egress, cap, deadline)
        _check_xspace(data, target.host)
        services.storage.write_bytes(f"{directory}/{target.host}.xplane.pb", data)
        return ""

    failures: dict[str, str] = dict(absent)
    waiting = _ask_pull_targets(services, msg, pulled, start_at, failures)
    pushed = [t for t in targets if not t.pulls]
    with ThreadPoolExecutor(max(1, len(pushed)), thread_name_prefix="capture") as pool:
        # One thread per push target: they wait on the network, and all must start together.
        futures = {t.host: pool.submit(one, t) for t in pushed}
        if waiting:
            unanswered = pull.await_answers(
                services.state, services.settings, msg.run, waiting,
                lambda host, _: _host_answered(services, msg, directory, host),
                services.clock)
            failures |= {host: f"{host}: {reason}" for host, reason in unanswered.items()}
        for host, future in futures.items():
            try:
                future.result()
            except MldiagError as e:
                failures[host] = f"{host}: {e}"
            except Exception as e:  # noqa: BLE001 - one host's failure must not lose the rest
                log.exception("capture %s/%s: %s", msg.run, msg.session, host)
                failures[host] = f"{host}: {type(e).__name__}: {e}"
    for host, reason in failures.items():
        log.warning("capture %s/%s: %s", msg.run, msg.session, reason)
        record = HostRecord(object_name=f"{directory}/{host}.xplane.pb", generation="",
                            size=0, arrived_at=services.clock(), status="FAILED",
                            reason=short_reason(reason))
        services.state.register_host(msg.run, msg.session, host, record, services.clock())
    s = services.state.get_session(msg.run, msg.session)
    if s is None or s.state != CAPTURING or not s.complete():
        return
    if not any(h.status == "ARRIVED" for h in s.hosts.values()):
        fail(services, msg.run, msg.session, "every target failed: " + short_reason(
            *(h.reason for h in s.hosts.values())), s.version)
        _give_back_reservation(services, msg)
    else:
        complete_session(services, s)


def _ask_pull_targets(services: Services, msg: CaptureProfile, targets: list[TargetRecord],
                      start_at: float, failures: dict[str, str]
                      ) -> dict[str, tuple[ControlRequest, float]]:
    """Leave each pull target its capture request; host -> (request, deadline) of those that
    got one (a full mailbox is a failure: the workload is not taking its requests)."""
    settings = services.settings
    waiting: dict[str, tuple[ControlRequest, float]] = {}
    for target in targets:
        request = pull.capture_request(msg, target, start_at=start_at,
                                       wait_s=_turn_wait_s(services, msg),
                                       now=services.clock(), answer_s=settings.pull_answer_s)
        if services.state.put_request(request, services.clock()):
            waiting[target.host] = (request, pull.capture_deadline(request,
                                                                   settings.pull_answer_s))
        else:
            failures[target.host] = (
                f"{target.host}: {MAX_PENDING_REQUESTS} requests already wait for it: the "
                "workload is not taking its requests (stuck, or gone without a goodbye)")
    return waiting


def _host_answered(services: Services, msg: CaptureProfile, directory: str, host: str) -> bool:
    """Whether a pull target has answered: its upload is in the bucket (its registration is
    on_profile_object's, which must not wait behind this stage for a free worker), or it
    recorded its host FAILED."""
    if services.storage.stat(f"{directory}/{host}.xplane.pb") is not None:
        return True
    s = services.state.get_session(msg.run, msg.session)
    return s is None or host in s.hosts or s.state != CAPTURING


def _give_back_reservation(services: Services, msg: CaptureProfile) -> None:
    """A failed automatic capture does not count for its run's cooldown or hourly cap: an
    alert storm against a busy or dead target must not use up the quota."""
    if msg.trigger == "alert" and msg.request_id:
        services.state.release_capture(msg.run, msg.request_id)


def _uses_profiler(msg: CaptureProfile, target: TargetRecord) -> bool:
    """Whether this capture runs a trace on the target's profiler server, which serves one
    session at a time (snapshots and the ring read what is already recorded)."""
    return msg.capture == "on_demand" and target.continuous == "OFF" and not target.pulls


def _turn_wait_s(services: Services, msg: CaptureProfile) -> float:
    """How long a capture may wait for a busy profiler: `capture_wait_s`, within what one
    function invocation leaves after the capture itself and its upload."""
    return min(services.settings.capture_wait_s,
               max(0.0, INVOCATION_S - 60.0 - msg.duration_s))


@contextmanager
def _profiler_turn(services: Services, target: TargetRecord, msg: CaptureProfile,
                   deadline: float) -> Iterator[None]:
    """Hold the target's profiler for this capture (a claim in the state store, so across
    processes and function instances too). A second capture waits its turn until
    `deadline` (monotonic), then fails with the reason."""
    if not _uses_profiler(msg, target):
        yield
        return
    # The target's identity, not its address text: a run holds only its own targets'
    # profilers (another run registering the same address cannot hold this one).
    key = f"profiler:{target.run}/{target.host}"
    owner = f"{services.owner}:{msg.run}/{msg.session}"
    waited = time.monotonic()
    while not services.state.claim(key, owner, msg.duration_s + 60.0, services.clock()):
        if time.monotonic() >= deadline:
            raise ProfilerBusy(f"another profiling session is active on {target.host}: an "
                               f"earlier mldiag capture still held its profiler after "
                               f"{time.monotonic() - waited:.0f} s")
        time.sleep(0.2)
    try:
        yield
    finally:
        services.state.release(key, owner)


def _capture_when_free(target: TargetRecord, msg: CaptureProfile, start_at: float,
                       egress: EgressPolicy, cap: int, deadline: float) -> bytes:
    """Capture; while the profiler answers that another session (not ours: a programmatic
    capture in the workload, another tool) holds it, try again until `deadline`."""
    waited = time.monotonic()
    while True:
        try:
            return capture_target(target, msg, start_at, egress=egress, max_bytes=cap)
        except ProfilerBusy as e:
            if time.monotonic() + 1.0 >= deadline:
                raise ProfilerBusy(f"{e}; still busy after "
                                   f"{time.monotonic() - waited:.0f} s") from e
            time.sleep(1.0)


def continuous(msg: ContinuousProfiling, services: Services) -> None:
    """Start or stop continuous profiling (snapshot mode) on the selected targets."""
    if msg.action not in ("start", "stop"):
        raise PoisonMessage(f"continuous action must be start or stop, not {msg.action!r}")
    try:
        limits.check_window(msg.window_s)
        limits.check_ring_bytes(msg.max_bytes)
    except ValueError as e:
        raise PoisonMessage(str(e)) from e
    run = services.state.get_run(msg.run)
    if run is None:
        raise PoisonMessage(f"continuous {msg.action}: unknown run {msg.run!r}")
    targets = _select_targets(services, run.name, msg.targets)
    if not targets:
        raise PermanentFailure(f"continuous {msg.action}: run {run.name} has no profiler "
                               "targets")
    errors: list[str] = []

    def one(target: TargetRecord) -> None:
        try:
            state = set_continuous(target, msg,
                                   egress=EgressPolicy.from_settings(services.settings))
        except Exception as e:  # noqa: BLE001 - recorded on the target, the others go on
            reason = str(e) if isinstance(e, MldiagError) else f"{type(e).__name__}: {e}"
            services.state.update_target(target.run, target.host, target.port,
                                         last_error=f"continuous {msg.action}: {reason}",
                                         last_request=msg.request_id)
            errors.append(f"{target.host}: {reason}")
            return
        since = 0.0 if state == "OFF" else (target.continuous_since
                                            if target.continuous != "OFF" else services.clock())
        services.state.update_target(target.run, target.host, target.port, continuous=state,
                                     continuous_since=since, last_error="",
                                     last_request=msg.request_id)

    pulled = [t for t in targets if t.pulls]
    with ThreadPoolExecutor(min(16, max(1, len(targets) - len(pulled))),
                            thread_name_prefix="continuous") as pool:
        list(pool.map(one, [t for t in targets if not t.pulls]))
    if pulled:
        errors += _continuous_by_pull(services, msg, pulled)
    if len(errors) == len(targets):
        raise PermanentFailure(f"continuous {msg.action} failed on every target: "
                               + "; ".join(errors))
    for error in errors:
        log.warning("continuous %s on run %s: %s", msg.action, run.name, error)


def _continuous_by_pull(services: Services, msg: ContinuousProfiling,
                        targets: list[TargetRecord]) -> list[str]:
    """Ask pull targets to start or stop their ring and wait for their answers (each writes
    the request's id, and any error, on its target record); the errors, one per host."""
    settings = services.settings
    request_id = msg.request_id or uuid.uuid4().hex
    msg_ = replace(msg, request_id=request_id)
    waiting: dict[str, tuple[ControlRequest, float]] = {}
    errors: list[str] = []
    by_host = {t.host: t for t in targets}
    for target in targets:
        request = pull.continuous_request(msg_, target, now=services.clock(),
                                          answer_s=settings.pull_answer_s)
        if services.state.put_request(request, services.clock()):
            waiting[target.host] = (request, request.created_at + settings.pull_answer_s)
        else:
            errors.append(f"{target.host}: {MAX_PENDING_REQUESTS} requests already wait for "
                          "it: the workload is not taking its requests")
    unanswered = pull.await_answers(
        services.state, settings, msg.run, waiting,
        lambda _, t: t is not None and t.last_request == request_id, services.clock)
    for host, reason in unanswered.items():
        t = by_host[host]
        services.state.update_target(t.run, t.host, t.port,
                                     last_error=f"continuous {msg.action}: {reason}",
                                     last_request=request_id)
        errors.append(f"{host}: {reason}")
    answered = {t.host: t for t in services.state.list_targets(msg.run)
                if t.host in waiting and t.host not in unanswered}
    errors += [f"{h}: {t.last_error}" for h, t in sorted(answered.items()) if t.last_error]
    return errors
