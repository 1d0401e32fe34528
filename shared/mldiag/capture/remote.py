"""Reaching a target's profiler: xprof's remote trace and native continuous-profiling APIs.

Both talk gRPC to the profiler server that `jax.profiler.start_server(port)` (the SDK's
`on_demand_xprof=True`) runs inside the workload. The native continuous-profiling API works
on TPU only: on CPU it answers OK and records nothing, so the capture stage uses it only for
TPU targets and the SDK's ring buffer everywhere else.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from mldiag.errors import MldiagError


class CaptureFailed(MldiagError):
    """A target answered, but no usable profile came back (the reason says why)."""


class ProfilerUnreachable(CaptureFailed):
    """The target's profiler server did not answer."""


def _plugin() -> Any:
    from xprof.convert import _pywrap_profiler_plugin

    return _pywrap_profiler_plugin


def _read_single_xplane(logdir: Path, what: str) -> bytes:
    found = sorted(logdir.glob("plugins/profile/*/*.xplane.pb")) + sorted(
        logdir.glob("*.xplane.pb"))
    if not found:
        raise CaptureFailed(f"{what}: the profiler wrote no .xplane.pb")
    data = found[-1].read_bytes()
    if not data:
        # A known failure of long captures: the file exists and holds nothing.
        raise CaptureFailed(f"{what}: empty capture (0-byte xplane)")
    return data


def _classify(service_addr: str, e: RuntimeError) -> CaptureFailed:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if "UNAVAILABLE" in text or "failed to connect" in text or "DEADLINE_EXCEEDED" in text:
        return ProfilerUnreachable(f"profiler server {service_addr} unreachable: {text}")
    return CaptureFailed(f"remote trace of {service_addr} failed: {text}")


def remote_trace(service_addr: str, duration_s: float, *, delay_s: float = 0.0,
                 host_tracer_level: int = 2, device_tracer_level: int = 1,
                 python_tracer_level: int = 0) -> bytes:
    """Trace the target for `duration_s`, starting `delay_s` from now; the xplane bytes."""
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
        return _read_single_xplane(Path(tmp), f"remote trace of {service_addr}")


def native_start(service_addr: str, *, duration_ms: int = 2000, host_tracer_level: int = 2,
                 device_tracer_level: int = 1, python_tracer_level: int = 0) -> None:
    """Start xprof's own continuous profiling on a (TPU) target."""
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
        raise _classify(service_addr, e) from e


def native_snapshot(service_addr: str) -> bytes:
    """The target's continuous-profiling buffer, as xplane bytes."""
    with tempfile.TemporaryDirectory(prefix="mldiag-snapshot-") as tmp:
        try:
            _plugin().get_snapshot(service_addr, tmp)
        except RuntimeError as e:
            raise _classify(service_addr, e) from e
        return _read_single_xplane(Path(tmp), f"snapshot of {service_addr}")
