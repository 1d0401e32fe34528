"""One capture on one target, by whichever means the target offers.

Pull targets (the mldiag SDK) are never connected to: `mldiag.capture.pull` leaves them a
request. A push target is a plain `jax.profiler.start_server` reached through the egress
policy:

| request | target's continuous state | how |
|---|---|---|
| on-demand | OFF | xprof remote trace on the profiler server, from the aligned start |
| on-demand | NATIVE | the native buffer after `duration` (TPU; default tracer levels only) |
| on-demand | OFF, profiler held by a native session | as NATIVE (the workload started it) |
| snapshot | NATIVE, or OFF with a native session running | xprof's `get_snapshot` (TPU) |
| snapshot | OFF, no native session | fails: nothing is being recorded |
| any | RING | fails: an SDK from before pull delivery; mldiag does not call its endpoint |

Liveness (`status`): an SDK target by its heartbeat; a plain profiler server, which has none,
by its last check (`probe_now`, which the background prober `stages.liveness` runs; never on
a read path). A check asks the profiler service for nothing that starts a profiling session
(`remote.probe`), so it cannot collide with the workload's own tracing; everything that is
not a profiler server is the same "down", with the same reason, after the same time.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mldiag.capture import remote
from mldiag.capture.egress import EgressPolicy, EgressRefused
from mldiag.errors import MldiagError
from mldiag.messages import CaptureProfile, ContinuousProfiling
from mldiag.model import TargetRecord

if TYPE_CHECKING:
    from mldiag.ports import StateStore
    from mldiag.settings import Settings

LOOPBACK = ("127.0.0.1", "::1", "localhost")
# A plain profiler server that was never checked yet (registered while the prober was off).
UNKNOWN = "unknown"


def heartbeat_deadline(target: TargetRecord, stale_s: float) -> float:
    """How old a heartbeat may be before the target counts as down: one and a half of its own
    heartbeat intervals (plus a second) when it registered one, else `stale_s`."""
    if target.heartbeat_s > 0:
        return min(stale_s, 1.5 * target.heartbeat_s + 1.0)
    return stale_s


def watched_by_probe(target: TargetRecord) -> bool:
    """Whether the target's liveness comes from connecting to it: a push target with no
    heartbeat of its own, i.e. a plain profiler server (`jax.profiler.start_server`)
    registered by `mldiag profiler-target create`, the API or the console."""
    return not target.pulls and not target.last_heartbeat and target.heartbeat_s <= 0


def status(target: TargetRecord, settings: Settings, now: float | None = None
           ) -> tuple[str, str]:
    """(up | down | unknown, why) of a target, from what is stored: never connects to it.

    A plain profiler server: its last check (`probe_now`), "unknown" before the first. An
    SDK target: its heartbeat, and (a local process) its process."""
    if watched_by_probe(target):
        if not target.probed_at or target.probe_state not in (remote.UP, remote.DOWN):
            return UNKNOWN, "not checked yet"
        return target.probe_state, target.probe_reason
    why = _heartbeat_liveness(target, settings, now)
    return (remote.DOWN, why) if why else (remote.UP, "")


def checked_age(target: TargetRecord, now: float) -> float | None:
    """Seconds since a plain profiler server's last check began (None: never checked, or
    not a target that is checked)."""
    if not watched_by_probe(target) or not target.probed_at:
        return None
    return max(0.0, now - target.probed_at)


def describe(target: TargetRecord, settings: Settings, now: float) -> str:
    """The status as people read it, with its age: "up, checked 40 s ago"."""
    state, _ = status(target, settings, now)
    age = checked_age(target, now)
    return state if age is None else f"{state}, checked {age:.0f} s ago"


def probe_now(target: TargetRecord, settings: Settings, state: StateStore | None = None,
              now: float | None = None) -> tuple[str, str]:
    """Check a plain profiler server now, through the egress policy (`remote.probe`: no
    profiling session is started), and record the answer on its record in `state`.
    `probed_at` is when the check began, so the record does not tell how long it took."""
    began = time.time() if now is None else now
    try:
        addr = _profiler(target, EgressPolicy.from_settings(settings))
    except EgressRefused as e:
        answer = (remote.DOWN, str(e))
    else:
        answer = remote.probe(addr, timeout_s=settings.probe_timeout_s)
    target.probe_state, target.probe_reason, target.probed_at = (*answer, began)
    if state is not None:
        state.update_target(target.run, target.host, target.port, probe_state=answer[0],
                            probe_reason=answer[1], probed_at=began)
    return answer


def statuses(targets: Sequence[TargetRecord], settings: Settings,
             now: float | None = None) -> list[tuple[str, str]]:
    """`status` of each target (stored answers: nothing is connected to)."""
    return [status(t, settings, now) for t in targets]


def liveness(target: TargetRecord, settings: Settings, now: float | None = None) -> str:
    """'' while the target may be alive (a plain profiler server not checked yet counts: a
    capture tries it and records why it failed), else why not: see `status`."""
    state, why = status(target, settings, now)
    return why if state == remote.DOWN else ""


def check_target_cap(settings: Settings, run: str, count: int) -> None:
    """MldiagError when `run` would hold more than `max_targets_per_run` targets."""
    if count > settings.max_targets_per_run:
        raise MldiagError(
            f"run {run!r} would hold {count} targets, over the cap of "
            f"{settings.max_targets_per_run} per run (MLDIAG_MAX_TARGETS_PER_RUN): delete "
            "targets it no longer needs")


def _resolved(address: str) -> set[str]:
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(address, None,
                                                               proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        return {address}


def address_holders(state: StateStore, settings: Settings, address: str, port: int, *,
                    exclude: str = "", now: float | None = None) -> list[str]:
    """The runs (other than `exclude`) that hold the profiler at `address:port`: a push
    target of theirs at that address (compared after name resolution, so `localhost` and
    `127.0.0.1` are one address). A plain profiler server's record holds it until deleted;
    an SDK push target's only while its heartbeat is fresh (its process is gone after)."""
    now = time.time() if now is None else now
    mine = _resolved(address) | {address}
    holders = []
    for r in state.list_runs():
        if r.name == exclude:
            continue
        for t in state.list_targets(r.name):
            if t.pulls or t.port != port:
                continue
            if not watched_by_probe(t) and liveness(t, settings, now):
                continue
            if mine & (_resolved(t.address) | {t.address}):
                holders.append(r.name)
                break
    return holders


def _heartbeat_liveness(target: TargetRecord, settings: Settings,
                        now: float | None = None) -> str:
    """'' while an SDK target looks alive, else why not: stopped, a late heartbeat, or (a
    target on this machine under the embedded runtime) its process is gone, which a `kill -9`
    shows at once, before any heartbeat is missed."""
    now = time.time() if now is None else now
    if not target.last_heartbeat:
        return "stopped (no heartbeat)"
    age = now - target.last_heartbeat
    if age > heartbeat_deadline(target, settings.target_stale_s):
        return f"last heartbeat {age:.0f} s ago"
    if settings.backend == "local" and target.pid > 0 and target.address in LOOPBACK:
        try:
            os.kill(target.pid, 0)
        except ProcessLookupError:
            # No such process here; its profiler port tells a dead one from one in another
            # pid namespace (a container sharing this network).
            if not remote.accepts_connections(target.service_addr):
                return f"its process {target.pid} is gone"
        except PermissionError:
            pass  # alive, another user's
    return ""


def _legacy(target: TargetRecord) -> remote.CaptureFailed:
    return remote.CaptureFailed(
        f"target {target.host} was registered by an mldiag SDK from before pull delivery (its "
        "ring is behind a control endpoint, which mldiag no longer connects to): restart the "
        "workload with this SDK, which takes its requests itself")


def _profiler(target: TargetRecord, egress: EgressPolicy | None) -> str:
    """The profiler server's `ip:port`, after the egress check."""
    if egress is None:
        return target.service_addr
    ip = egress.check(target.address, target.port)
    return f"[{ip}]:{target.port}" if ":" in ip else f"{ip}:{target.port}"


def capture(target: TargetRecord, msg: CaptureProfile, start_at: float, *,
            egress: EgressPolicy | None = None, max_bytes: int = 2 * 1024**3) -> bytes:
    """The xplane of a push target (its profiler server) for this request; raises an
    MldiagError with the reason. Pull targets are asked through `mldiag.capture.pull`.

    With `egress`, the target's address is checked (and pinned) before any connection."""
    if target.pulls:
        raise ValueError(f"target {target.host} takes its requests itself (pull delivery)")
    if target.continuous == "RING":
        raise _legacy(target)
    if msg.capture == "snapshot":
        try:
            # Also when mldiag did not start it: the workload may run xprof's own.
            return remote.native_snapshot(_profiler(target, egress), max_bytes)
        except remote.NativeOff:
            raise remote.CaptureFailed(
                f"target {target.host}: continuous profiling is off, so there is no snapshot "
                f"to take (start it with `mldiag continuous start --run {target.run}`)"
            ) from None
    if target.continuous == "NATIVE":
        return _from_native(target, msg, start_at, _profiler(target, egress), max_bytes)
    addr = _profiler(target, egress)
    try:
        return remote.remote_trace(
            addr, msg.duration_s, delay_s=max(0.0, start_at - time.time()),
            host_tracer_level=msg.host_tracer_level,
            device_tracer_level=msg.device_tracer_level,
            python_tracer_level=msg.python_tracer_level, max_bytes=max_bytes)
    except remote.ProfilerBusy:
        # The holder may be xprof's native continuous profiling, which the workload started
        # and which never ends on its own: read its buffer rather than wait for it.
        if not remote.native_running(addr):
            raise
        return _from_native(target, msg, start_at, addr, max_bytes)


def _from_native(target: TargetRecord, msg: CaptureProfile, start_at: float, addr: str,
                 max_bytes: int) -> bytes:
    """An on-demand interval from the native buffer, read once the interval ends; refused
    when it asks for tracer levels that the native session may not record."""
    asked = {"host_tracer_level": msg.host_tracer_level,
             "device_tracer_level": msg.device_tracer_level,
             "python_tracer_level": msg.python_tracer_level}
    if asked != remote.DEFAULT_LEVELS:
        raise remote.CaptureFailed(
            f"target {target.host}: on-demand sessions can't be captured while continuous "
            "profiling is active (xprof's native session holds the profiler with its own "
            "tracer levels, and this capture asks for "
            + ", ".join(f"{k}={v}" for k, v in asked.items()
                        if remote.DEFAULT_LEVELS[k] != v)
            + "); ask for the default levels or a snapshot")
    time.sleep(max(0.0, start_at + msg.duration_s - time.time()))
    return remote.native_snapshot(addr, max_bytes)


def set_continuous(target: TargetRecord, msg: ContinuousProfiling, *,
                   egress: EgressPolicy | None = None) -> str:
    """Start or stop continuous profiling on a push target; returns its new state.

    A plain profiler server has only xprof's native continuous profiling, which is TPU-only;
    elsewhere the SDK's ring is the way, asked for by pull."""
    if target.pulls:
        raise ValueError(f"target {target.host} takes its requests itself (pull delivery)")
    levels: dict[str, Any] = {"host_tracer_level": msg.host_tracer_level,
                              "device_tracer_level": msg.device_tracer_level,
                              "python_tracer_level": msg.python_tracer_level}
    if msg.action == "start":
        if target.continuous == "RING":
            raise _legacy(target)
        if target.continuous == "NATIVE" or remote.native_running(_profiler(target, egress)):
            # The workload runs xprof's own already: adopted, on any platform.
            return "NATIVE"
        if target.platform != "tpu":
            platform = target.platform or "an unknown platform"
            raise remote.CaptureFailed(
                f"target {target.host} is a plain profiler server on {platform}: xprof's "
                "native continuous profiling works on TPU only; run the workload with "
                "mldiag.sdk.machinelearning_run for its ring")
        remote.native_start(_profiler(target, egress), duration_ms=int(msg.window_s * 1000),
                            **levels)
        return "NATIVE"
    if target.continuous == "NATIVE":
        remote.native_stop(_profiler(target, egress))
    elif target.continuous == "RING":
        raise _legacy(target)
    return "OFF"
