"""What the control commands (`capture`, `continuous`, `autocapture`) share."""

from __future__ import annotations

import fcntl
import re
import socket
import time
from collections.abc import Sequence

from mldiag.bootstrap import ControlPlane, control_plane
from mldiag.errors import MldiagError
from mldiag.model import RunRecord, TargetRecord
from mldiag.settings import Settings

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|kib|mib|gib)?\s*$", re.IGNORECASE)


def duration(text: str) -> float:
    """`2s`, `500ms`, `1.5m`, `1h` or plain seconds, as seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"bad duration {text!r} (examples: 2s, 500ms, 1m)")
    scale = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2) or "s"]
    return float(match.group(1)) * scale


def size(text: str) -> int:
    """`2GB`, `512MiB` or plain bytes, as bytes."""
    match = _BYTES.match(text)
    if not match:
        raise ValueError(f"bad size {text!r} (examples: 2GB, 512MiB)")
    unit = (match.group(2) or "b").lower()
    scale = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20,
             "gib": 2**30}[unit]
    return int(float(match.group(1)) * scale)


def connect(home: str | None, *, need_runtime: bool) -> ControlPlane:
    """The control plane; locally, optionally check that `mldiag up` runs on the home."""
    settings = Settings.from_env(home=home)
    if settings.backend == "local":
        if not settings.state_db.is_file():
            raise MldiagError(f"no mldiag state in {settings.home} (start `mldiag up` there, or "
                              "set MLDIAG_HOME / --home)")
        if need_runtime and not runtime_running(settings):
            raise MldiagError(f"no `mldiag up` is running on {settings.home}: start it first, "
                              "it carries out captures and analyses")
    return control_plane(settings)


def runtime_running(settings: Settings) -> bool:
    """Whether a local runtime holds the home's lock."""
    lock = settings.home / "runtime.lock"
    if not lock.is_file():
        return False
    with open(lock) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def get_run(plane: ControlPlane, name: str) -> RunRecord:
    run = plane.state.get_run(name)
    if run is None:
        known = ", ".join(r.name for r in plane.state.list_runs()) or "none"
        raise MldiagError(f"unknown run {name!r} (known: {known})")
    return run


def reachable(address: str, port: int, timeout_s: float = 1.0) -> str:
    """'' when a TCP connection opens, else why not."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return ""
    except OSError as e:
        return e.strerror or str(e)


def select_targets(plane: ControlPlane, run: str, hosts: Sequence[str]) -> list[TargetRecord]:
    """The targets to act on; one clear error when none is registered, named or up."""
    targets = plane.state.list_targets(run)
    if not targets:
        raise MldiagError(f"run {run!r} has no profiler targets: start the workload with "
                          "mldiag.sdk.machinelearning_run(..., on_demand_xprof=True)")
    unknown = sorted(set(hosts) - {t.host for t in targets})
    if unknown:
        raise MldiagError(f"run {run!r} has no target(s) {', '.join(unknown)} (registered: "
                          f"{', '.join(sorted({t.host for t in targets}))})")
    return [t for t in targets if not hosts or t.host in hosts]


def target_down(plane: ControlPlane, t: TargetRecord, *, port: int | None = None) -> str:
    """'' when the target looks alive, else a one-line reason."""
    age = time.time() - t.last_heartbeat
    if not t.last_heartbeat:
        return f"target down: {t.host} ({t.address}:{t.port}) stopped (no heartbeat)"
    if age > plane.settings.target_stale_s:
        return f"target down: {t.host} ({t.address}:{t.port}) last heartbeat {age:.0f} s ago"
    why = reachable(t.address, port or t.port)
    if why:
        return f"target down: {t.host} ({t.address}:{port or t.port}) unreachable: {why}"
    return ""
