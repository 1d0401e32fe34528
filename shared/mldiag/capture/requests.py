"""Capture and continuous-profiling requests, validated the same way for the CLI and the
console: unknown run, no targets, a target down. Whether continuous profiling is on for a
snapshot is the target's to say (the workload may run xprof's own): the snapshot asks it.

Each returns the message to publish and the warnings about targets that will fail, or raises
MldiagError with one line when nothing can be captured.
"""

from __future__ import annotations

import re
import secrets
import socket
import time
import uuid
from collections.abc import Sequence
from typing import Any

from mldiag import limits
from mldiag.access import BROWSE, CAPTURE, Principal
from mldiag.bootstrap import ControlPlane
from mldiag.capture.egress import EgressPolicy
from mldiag.capture.targets import (
    address_holders,
    check_target_cap,
    liveness,
    probe_now,
    watched_by_probe,
)
from mldiag.errors import MldiagError
from mldiag.kube.pods import NOWHERE
from mldiag.messages import CaptureProfile, ContinuousProfiling
from mldiag.model import PUSH, RunRecord, TargetRecord, check_name


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
    """The targets to act on, named by host name or by `address:port`; one clear error when
    none is registered, named or up."""
    targets = plane.state.list_targets(run)
    if not targets:
        raise MldiagError(f"run {run!r} has no profiler targets: start the workload with "
                          "mldiag.sdk.machinelearning_run(...), or register its profiler "
                          f"server with `mldiag profiler-target create {run} --address "
                          "HOST:PORT`")
    by_address = {f"{t.address}:{t.port}": t.host for t in targets}
    wanted = {by_address.get(h, h) for h in hosts}
    unknown = sorted(wanted - {t.host for t in targets})
    if unknown:
        raise MldiagError(f"run {run!r} has no target(s) {', '.join(unknown)} (registered: "
                          f"{', '.join(sorted({t.host for t in targets}))})")
    return [t for t in targets if not hosts or t.host in wanted]


PLATFORMS = ("tpu", "gpu", "cpu")


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` or `[IPV6]:PORT` as (host, port); MldiagError otherwise."""
    match = re.fullmatch(r"\s*(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.-]+)):"
                         r"(?P<port>\d{1,5})\s*", text or "")
    if not match or not 1 <= int(match["port"]) <= 65535:
        raise MldiagError(f"--address wants HOST:PORT (e.g. 10.0.0.7:9999, the port of "
                          f"jax.profiler.start_server), not {text!r}")
    return match["v6"] or match["host"], int(match["port"])


def register_push_target(plane: ControlPlane, run: str, address: str, *, host_name: str = "",
                         platform: str = "", now: float | None = None,
                         principal: Principal | None = None, process_index: int = 0
                         ) -> tuple[TargetRecord, tuple[str, str]]:
    """Register a plain profiler server (`jax.profiler.start_server(PORT)` in a workload
    without the SDK) as a push target of `run`; the record and its status (up or down, with
    why: one check that starts no profiling session, `targets.probe_now`). The address
    must pass the egress policy: a refused one is named in the error, and nothing is stored.

    A profiler address belongs to one run: an address that another run holds
    (`address_holders`) is registered only by a `principal` with capture rights on that run,
    or an admin (None: the local operator, who is one). A run holds at most
    `max_targets_per_run` targets. `process_index` is the job's process it profiles
    (kube-discover's, from the pod's completion index)."""
    run_record = get_run(plane, run)
    host, port = parse_address(address)
    if platform and platform not in PLATFORMS:
        raise MldiagError(f"--platform must be one of {', '.join(PLATFORMS)}, not {platform!r}")
    name = host_name or _default_name(plane.state.list_targets(run_record.name), host, port)
    try:
        check_name("host", name)
    except ValueError as e:
        raise MldiagError(f"{e}: pass --host-name") from e
    ip = EgressPolicy.from_settings(plane.settings).check(host, port)
    now = time.time() if now is None else now
    targets = plane.state.list_targets(run_record.name)
    existing = [t for t in targets if t.host == name]
    if any(t.pulls for t in existing):
        raise MldiagError(f"run {run_record.name!r} already has an SDK target named {name!r} "
                          "(it registers itself): choose another --host-name")
    check_target_cap(plane.settings, run_record.name,
                     len({t.host for t in targets} | {name}))
    for other in address_holders(plane.state, plane.settings, ip, port,
                                 exclude=run_record.name, now=now):
        if principal is not None and not principal.can(CAPTURE, other):
            # The other run is named only to those who may see it.
            which = f"run {other!r}" if principal.can(BROWSE, other) else "another run"
            raise TargetHeld(
                f"{host}:{port} is the profiler of {which}, which holds it as a push "
                f"target: registering it on run {run_record.name!r} needs editor rights on "
                f"{which} (or admin)")
    for t in existing:
        if t.port != port:
            plane.state.delete_target(run_record.name, name, t.port)
    record = TargetRecord(run=run_record.name, host=name, port=port, address=host,
                          delivery=PUSH, platform=platform, registered_at=now,
                          process_index=process_index)
    plane.state.upsert_target(record)
    return record, probe_now(record, plane.settings, plane.state, now)


class TargetHeld(MldiagError):
    """The profiler address is another run's, and the caller has no rights on that run.

    Permanent for this caller: an editor of that run, or an admin, may register it.
    """


def _default_name(targets: Sequence[TargetRecord], host: str, port: int) -> str:
    """The name of a push target registered without --host-name: the one it already has, else
    a new `target-` and 8 random hex digits. Not its address: host names are shown to every role
    (sessions' hosts, reports), addresses only to those who may view profiles."""
    for t in targets:
        if t.delivery == PUSH and (t.address, t.port) == (host, port):
            return t.host
    taken = {t.host for t in targets}
    while (name := f"target-{secrets.token_hex(4)}") in taken:
        continue
    return name


def remove_target(plane: ControlPlane, run: str, name: str) -> int:
    """Forget a target of `run`, named by host name or `address:port`; how many records
    went. MldiagError when the run has no such target."""
    run_record = get_run(plane, run)
    targets = plane.state.list_targets(run_record.name)
    host = {f"{t.address}:{t.port}": t.host for t in targets}.get(name, name)
    gone = plane.state.delete_target(run_record.name, host)
    if not gone:
        raise MldiagError(f"run {run_record.name!r} has no target {name!r} (registered: "
                          f"{', '.join(sorted({t.host for t in targets})) or 'none'})")
    return gone


def target_down(plane: ControlPlane, t: TargetRecord, *, port: int | None = None) -> str:
    """'' when the target looks alive, else a one-line reason. A plain profiler server is
    checked now (a request, not a read: `targets.probe_now` starts no profiling session)."""
    if t.address == NOWHERE and t.last_error and not t.pulls:
        # A GKE job's host without a pod (kube-discover): why, not its placeholder address.
        return f"target down: {t.host}: {t.last_error}"
    if watched_by_probe(t) and port is None:
        state, why = probe_now(t, plane.settings, plane.state)
        return f"target down: {t.host} ({t.address}:{t.port}) {why}" if state == "down" \
            else ""
    why = liveness(t, plane.settings)
    if why:
        return f"target down: {t.host} ({t.address}:{t.port}) {why}"
    if t.pulls:
        # It takes its requests itself: nothing to connect to.
        return ""
    why = reachable(t.address, port or t.port)
    if why:
        return f"target down: {t.host} ({t.address}:{port or t.port}) unreachable: {why}"
    return ""


def capture_request(plane: ControlPlane, run: str, session: str, *, kind: str = "on_demand",
                    hosts: Sequence[str] = (), duration_s: float = 2.0,
                    host_tracer_level: int = 2, device_tracer_level: int = 1,
                    python_tracer_level: int = 0, trigger: str = "manual"
                    ) -> tuple[CaptureProfile, list[str]]:
    """The CaptureProfile to publish for `session`, and warnings about targets that will
    fail; MldiagError when the request cannot capture anything."""
    try:
        check_name("session", session)
    except ValueError as e:
        raise MldiagError(str(e)) from e
    kind = kind.replace("-", "_")
    if kind not in ("on_demand", "snapshot"):
        raise MldiagError(f"capture kind must be on-demand or snapshot, not {kind!r}")
    limits.check_capture_duration(duration_s)
    for name, level, top in (("host", host_tracer_level, 3), ("device", device_tracer_level, 2),
                             ("python", python_tracer_level, 1)):
        if not 0 <= level <= top:
            raise MldiagError(f"{name} tracer level must be 0-{top}, not {level}")
    run_record = get_run(plane, run)
    targets = select_targets(plane, run_record.name, hosts)
    limits.check_hosts(len({t.host for t in targets}))
    down = []
    for t in targets:
        # A snapshot is not refused by mldiag's own record of continuous profiling: the
        # workload may have started xprof's native continuous profiling itself. The target
        # is asked by the snapshot, and its own answer is the host's reason when it fails.
        reason = target_down(plane, t)
        if reason:
            down.append(reason)
    if len(down) == len(targets):
        raise MldiagError("; ".join(down))
    if plane.state.get_session(run_record.name, session) is not None:
        raise MldiagError(f"session {run_record.name}/{session} already exists")
    message = CaptureProfile(
        run=run_record.name, session=session, capture=kind, targets=[t.host for t in targets],
        duration_s=duration_s, host_tracer_level=host_tracer_level,
        device_tracer_level=device_tracer_level, python_tracer_level=python_tracer_level,
        trigger=trigger)
    return message, down


def continuous_request(plane: ControlPlane, run: str, action: str, *,
                       hosts: Sequence[str] = (), options: dict[str, Any] | None = None
                       ) -> tuple[ContinuousProfiling, list[str], set[tuple[str, int]]]:
    """The ContinuousProfiling to publish, warnings, and the (host, port) targets whose
    `last_request` will carry its request id once each has answered."""
    if action not in ("start", "stop"):
        raise MldiagError(f"continuous action must be start or stop, not {action!r}")
    if action == "start" and options:
        if options.get("window_s") is not None:
            limits.check_window(options["window_s"])
        if options.get("max_bytes") is not None:
            limits.check_ring_bytes(options["max_bytes"])
    run_record = get_run(plane, run)
    targets = select_targets(plane, run_record.name, hosts)
    down = [r for r in (target_down(plane, t) for t in targets) if r]
    if len(down) == len(targets):
        raise MldiagError("; ".join(down))
    # The stage acts on the newest record of each host; wait for exactly those.
    newest: dict[str, TargetRecord] = {}
    for t in targets:
        if t.host not in newest or t.last_heartbeat > newest[t.host].last_heartbeat:
            newest[t.host] = t
    wanted = {(t.host, t.port) for t in newest.values()}
    message = ContinuousProfiling(run=run_record.name, action=action, targets=sorted(newest),
                                  request_id=uuid.uuid4().hex,
                                  **(options if action == "start" and options else {}))
    return message, down, wanted
