"""Reaching a target's profiler: xprof's remote trace and native continuous-profiling APIs.

Both talk gRPC to the profiler server that `jax.profiler.start_server(port)` runs inside a
push target (a workload without the mldiag SDK; SDK targets pull their requests instead). The
native continuous-profiling API works on TPU only: on CPU it answers OK and records nothing,
so the capture stage uses it only for TPU push targets.

A busy profiler (another session holds it) and a dead one raise the same error in xprof's
client; a server that still accepts connections is the busy one (`ProfilerBusy`).
"""

from __future__ import annotations

import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from mldiag.errors import MldiagError


class CaptureFailed(MldiagError):
    """A target answered, but no usable profile came back (the reason says why).

    Permanent for this capture: the host is recorded FAILED with the reason (a later
    capture may succeed).
    """


class ProfilerUnreachable(CaptureFailed):
    """The target's profiler server did not answer.

    Permanent for this capture, recorded on its host; the target may answer a later one.
    """


class ProfilerBusy(CaptureFailed):
    """The profiler server is up but already profiling (its ALREADY_EXISTS answer).

    Transient: the capture stage tries again until its deadline, then records it.
    """


# The tracer levels a capture asks for when it names none (CaptureProfile's defaults): all that
# a buffer recorded at levels nobody told mldiag can be trusted to hold.
DEFAULT_LEVELS = {"host_tracer_level": 2, "device_tracer_level": 1, "python_tracer_level": 0}


class NativeAlreadyRunning(ProfilerBusy):
    """xprof's own continuous profiling already runs on the target: someone else (the
    workload, with `continuous_profiling_snapshot.start_continuous_profiling`) started it.

    Not an error for a `continuous start`: the session is adopted (its snapshots are xprof's
    `get_snapshot`). Permanent for a one-off trace: the session never ends on its own, so
    the capture reads its buffer instead of waiting.
    """


# What xprof's client raises both when nobody listens and when the server refused the session
# with ALREADY_EXISTS ("Another profiling session active", in the workload's log only).
_NO_TRACE = "No trace event was collected"
# The profiler server's answer to StartContinuousProfiling when a continuous session already
# runs (a one-off trace holding the profiler answers INTERNAL "Another profiling session
# active" instead), measured with xprof 2.24.2 and jax 0.9.
_NATIVE_RUNNING = "A profiling session is already running"
# Its answer to GetSnapshot and StopContinuousProfiling when none runs.
_NO_NATIVE = "No continuous profiling session found"


def accepts_connections(service_addr: str) -> bool:
    """Whether `host:port` accepts a TCP connection within a second."""
    host, _, port = service_addr.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


# Liveness of a profiler server (`probe`).
UP, DOWN = "up", "down"
# The profiler service's Terminate RPC: it only marks a session id as stopped, so asked for a
# session id that no capture uses, it answers OK and changes nothing (a profiler server has no
# health or status call, and its Monitor answers UNIMPLEMENTED like any other server would).
_TERMINATE = "/tensorflow.ProfilerService/Terminate"
PROBE_SESSION = "mldiag-liveness-probe"
UNREACHABLE = "unreachable: no profiler server answers at this address"


def probe(service_addr: str, *, timeout_s: float = 1.0) -> tuple[str, str]:
    """(UP | DOWN, why) of the profiler server at `host:port`, without ever starting a
    profiling session: a gRPC `Terminate` for a session id that no capture uses, which a
    profiler server answers OK at once, and which changes nothing there (it cannot collide
    with the workload's own `jax.profiler.start_trace`, nor with a capture).

    Whatever else is at the address (nothing, a port that does not speak HTTP/2, another
    gRPC or HTTP/2 service, a server that never answers) gets the same DOWN answer, with the
    same reason, after the same `timeout_s`: the probe tells a profiler from everything
    else, and nothing about the rest (it is no port scanner)."""
    import grpc  # the control plane's; a workload never imports this module

    started = time.monotonic()
    # Its own connection (no subchannel shared with other channels), closed after.
    channel = grpc.insecure_channel(service_addr, options=[
        ("grpc.enable_retries", 0), ("grpc.use_local_subchannel_pool", 1)])
    try:
        call = channel.unary_unary(_TERMINATE)
        sid = PROBE_SESSION.encode()
        call(b"\x0a" + bytes([len(sid)]) + sid, timeout=timeout_s, wait_for_ready=True)
        return UP, ""
    except (grpc.RpcError, ValueError):
        pass
    finally:
        channel.close()
    # Every other answer at the same time: the deadline's.
    time.sleep(max(0.0, timeout_s - (time.monotonic() - started)))
    return DOWN, UNREACHABLE


def _plugin() -> Any:
    from xprof.convert import _pywrap_profiler_plugin

    return _pywrap_profiler_plugin


def _read_single_xplane(logdir: Path, what: str, max_bytes: int | None = None) -> bytes:
    found = sorted(logdir.glob("plugins/profile/*/*.xplane.pb")) + sorted(
        logdir.glob("*.xplane.pb"))
    if not found:
        raise CaptureFailed(f"{what}: the profiler wrote no .xplane.pb")
    size = found[-1].stat().st_size
    if max_bytes is not None and size > max_bytes:
        raise CaptureFailed(f"{what}: answer of {size:,} bytes is over the {max_bytes:,}-byte "
                            "cap")
    data = found[-1].read_bytes()
    if not data:
        # A known failure of long captures: the file exists and holds nothing.
        raise CaptureFailed(f"{what}: empty capture (0-byte xplane)")
    return data


def _classify(service_addr: str, e: RuntimeError) -> CaptureFailed:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if _NATIVE_RUNNING in text:
        return NativeAlreadyRunning(
            f"xprof's native continuous profiling already runs on {service_addr} (started "
            "outside mldiag, by the workload itself)")
    if "ALREADY_EXISTS" in text or "Another profiling session active" in text or (
            _NO_TRACE in text and accepts_connections(service_addr)):
        # A server that is up and answers no trace has refused the session: another one (a
        # programmatic xprof(), jax.profiler.trace, another tool) holds the profiler.
        return ProfilerBusy(f"another profiling session is active on {service_addr} (its "
                            "profiler server is up and refused the trace: ALREADY_EXISTS)")
    if "UNAVAILABLE" in text or "failed to connect" in text or "DEADLINE_EXCEEDED" in text:
        return ProfilerUnreachable(f"profiler server {service_addr} unreachable: {text}")
    return CaptureFailed(f"remote trace of {service_addr} failed: {text}")


def remote_trace(service_addr: str, duration_s: float, *, delay_s: float = 0.0,
                 host_tracer_level: int = 2, device_tracer_level: int = 1,
                 python_tracer_level: int = 0, max_bytes: int | None = None) -> bytes:
    """Trace the target for `duration_s`, starting `delay_s` from now; the xplane bytes
    (CaptureFailed over `max_bytes`)."""
    options = {"host_tracer_level": host_tracer_level,
               "device_tracer_level": device_tracer_level,
               "python_tracer_level": python_tracer_level,
               "delay_ms": max(0, int(delay_s * 1000))}
    with tempfile.TemporaryDirectory(prefix="mldiag-trace-") as tmp:
        try:
            _plugin().trace(service_addr, tmp, "", False, max(1, int(duration_s * 1000)), 1,
                            options)
        except RuntimeError as e:
            raise _classify(service_addr, e) from e
        return _read_single_xplane(Path(tmp), f"remote trace of {service_addr}", max_bytes)


def native_start(service_addr: str, *, duration_ms: int = 2000, host_tracer_level: int = 2,
                 device_tracer_level: int = 1, python_tracer_level: int = 0) -> None:
    """Start xprof's own continuous profiling on a (TPU) target; NativeAlreadyRunning when
    one already runs there."""
    options = {"duration_ms": duration_ms, "host_tracer_level": host_tracer_level,
               "device_tracer_level": device_tracer_level,
               "python_tracer_level": python_tracer_level}
    try:
        _plugin().start_continuous_profiling(service_addr, options)
    except RuntimeError as e:
        raise _classify(service_addr, e) from e


def native_stop(service_addr: str) -> None:
    """Stop xprof's continuous profiling on a target."""
    try:
        _plugin().stop_continuous_profiling(service_addr)
    except RuntimeError as e:
        if _NO_NATIVE in str(e):
            return  # already stopped: what was asked for
        raise _classify(service_addr, e) from e


def native_snapshot(service_addr: str, max_bytes: int | None = None) -> bytes:
    """The target's continuous-profiling buffer, as xplane bytes (xprof's `get_snapshot`);
    NativeOff when no native session runs there."""
    with tempfile.TemporaryDirectory(prefix="mldiag-snapshot-") as tmp:
        try:
            _plugin().get_snapshot(service_addr, tmp)
        except RuntimeError as e:
            if _NO_NATIVE in str(e):
                raise NativeOff(f"xprof's native continuous profiling is not running on "
                                f"{service_addr}") from e
            raise _classify(service_addr, e) from e
        try:
            return _read_single_xplane(Path(tmp), f"snapshot of {service_addr}", max_bytes)
        except CaptureFailed as e:
            if "wrote no .xplane.pb" not in str(e):
                raise
            raise CaptureFailed(
                f"snapshot of {service_addr}: xprof's native continuous profiling answered "
                "with no trace (it records device traces on TPU only; on CPU and GPU its "
                "buffer stays empty)") from e


class NativeOff(CaptureFailed):
    """No native continuous-profiling session runs on the target (its NOT_FOUND answer).

    Permanent for this request: there is no buffer to read.
    """


def native_running(service_addr: str) -> bool:
    """Whether xprof's native continuous profiling holds the profiler at `service_addr`.

    The server says so only when asked to start one (xprof has no status call), so this
    asks: a server already running one refuses with "already running". A free profiler
    would accept, so the session the probe started is stopped again at once; call this
    when the profiler is known to be busy, where the probe changes nothing.
    """
    if not accepts_connections(service_addr):
        return False
    try:
        _plugin().start_continuous_profiling(service_addr, {})
    except RuntimeError as e:
        return _NATIVE_RUNNING in str(e)
    try:
        _plugin().stop_continuous_profiling(service_addr)
    except RuntimeError:
        pass  # stopped meanwhile (by whoever else probed): not running either way
    return False
