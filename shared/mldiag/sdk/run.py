"""`machinelearning_run(...)`: register the run and this process as a profiler target."""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mldiag.errors import MldiagError
from mldiag.messages import DegradationDetected
from mldiag.model import AutoCapturePolicy, HostRecord, RunRecord, TargetRecord
from mldiag.sdk.monitor import Degradation, StepTimeMonitor
from mldiag.settings import Settings

if TYPE_CHECKING:
    from mldiag.bootstrap import ControlPlane
    from mldiag.sdk.continuous import RingBuffer
    from mldiag.sdk.control import ControlServer

log = logging.getLogger(__name__)

_current: MLRun | None = None
_current_lock = threading.Lock()


def _at_exit(fn: Callable[[], None]) -> None:
    """Call `fn` when the interpreter exits, while threads may still be started.

    Plain atexit handlers run after threading's shutdown, when the Cloud clients (gRPC) can no
    longer start threads, so the final target update and pending uploads would fail. The
    hook concurrent.futures uses for the same reason runs earlier; fall back to atexit.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        atexit.register(fn)
        return
    try:
        register(fn)
    except RuntimeError:  # already shutting down
        atexit.register(fn)


def current_run() -> MLRun | None:
    """The run this process registered last (what `xprof()` and `metrics` use by default)."""
    return _current


def _split_gcs_path(gcs_path: str | None) -> tuple[str, str]:
    """`gs://bucket/a/b` → ("bucket", "a/b")."""
    if not gcs_path:
        return "", ""
    if not gcs_path.startswith("gs://"):
        raise MldiagError(f"gcs_path must look like gs://BUCKET[/PREFIX], not {gcs_path!r}")
    bucket, _, prefix = gcs_path[len("gs://"):].partition("/")
    if not bucket:
        raise MldiagError(f"gcs_path {gcs_path!r} names no bucket")
    return bucket, prefix.strip("/")


@dataclass
class MLRun:
    """A registered run and this process's target; built by `machinelearning_run`."""

    name: str
    run_group: str | None
    configs: dict[str, Any]
    gcs_path: str | None
    project: str | None
    region: str | None
    on_demand_xprof: bool
    host: str
    target: TargetRecord
    plane: ControlPlane
    storage_prefix: str = ""
    framework: str = "jax"
    monitor: StepTimeMonitor | None = None
    ring: RingBuffer | None = None
    control: ControlServer | None = None
    profiler_server: Any = None
    alerts: list[DegradationDetected] = field(default_factory=list)
    _executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(2, thread_name_prefix="mldiag-upload"))
    _pending: list[Future[Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _closed: bool = False

    # Storage

    def session_dir(self, session: str) -> str:
        """`<prefix>/<run>/plugins/profile/<session>` in the run's storage."""
        parts = [self.storage_prefix, self.name, "plugins", "profile", session]
        return "/".join(p for p in parts if p)

    def upload(self, session: str, data: bytes | Callable[[], bytes]) -> Future[str]:
        """Write this host's xplane of `session` in the background; returns the object name.

        `data` may be a callable producing the bytes (it runs in the background too).
        """
        name = f"{self.session_dir(session)}/{self.host}.xplane.pb"

        def work() -> str:
            try:
                blob = data if isinstance(data, bytes) else data()
                if not blob:
                    raise MldiagError(f"session {session}: the profiler wrote an empty trace")
                self.plane.storage.write_bytes(name, blob)
            except Exception as e:
                # The session expects this host: record why it will not come, so the session
                # goes on with the other hosts (or fails with this reason) instead of waiting.
                self.plane.state.register_host(self.name, session, self.host, HostRecord(
                    object_name=name, generation="", size=0, arrived_at=time.time(),
                    status="FAILED", reason=f"{self.host}: {e}"), time.time())
                raise
            log.info("uploaded %s (%d bytes)", name, len(blob))
            return name

        future = self._executor.submit(work)
        # Keep only unfinished uploads (and failed ones, for wait_uploads to report).
        self._pending = [f for f in self._pending
                         if not f.done() or f.exception() is not None] + [future]
        return future

    def wait_uploads(self, timeout: float | None = None) -> list[str]:
        """Wait for every upload started so far; returns their object names (raises the
        first upload's error)."""
        pending, self._pending = list(self._pending), []
        return [f.result(timeout=timeout) for f in pending]

    # Continuous profiling (the SDK's portable ring buffer)

    def start_continuous(self, **options: Any) -> None:
        """Start continuous profiling of this process (snapshot mode) in the ring buffer."""
        if self.ring is None:
            raise MldiagError("continuous profiling is not available: the run was closed")
        self.ring.start(**options)
        self._set_continuous("RING")

    def stop_continuous(self) -> None:
        """Stop continuous profiling of this process."""
        if self.ring is not None:
            self.ring.stop()
        self._set_continuous("OFF")

    def _set_continuous(self, state: str) -> None:
        if state == "OFF":
            self.target.continuous_since = 0.0
        elif self.target.continuous == "OFF":
            self.target.continuous_since = time.time()
        self.target.continuous = state
        self.plane.state.update_target(self.name, self.host, self.target.port, continuous=state,
                                       continuous_since=self.target.continuous_since)

    # Degradation monitor

    def observe_step_time(self, seconds: float, at: float) -> None:
        """Feed one STEP_TIME sample to the degradation monitor."""
        if self.monitor is not None:
            self.monitor.observe(seconds, at)

    def _alert(self, found: Degradation) -> None:
        alert = DegradationDetected(
            alert_id=f"mldiag-monitor:{self.name}:{self.host}:{uuid.uuid4().hex[:12]}",
            run=self.name, source="mldiag-monitor", summary=found.summary(),
            targets=[self.host], detected_at=found.at)
        self.alerts.append(alert)
        log.warning("mldiag: %s: %s", self.name, alert.summary)
        if self._closed:
            return
        # Publish off the training thread: the step must not wait on the control plane.
        threading.Thread(target=self._publish_alert, args=(alert,), name="mldiag-alert",
                         daemon=True).start()

    def _publish_alert(self, alert: DegradationDetected) -> None:
        for attempt in range(5):
            try:
                self.plane.bus.publish(alert)
                return
            except Exception as e:  # noqa: BLE001 - retried, then reported; training goes on
                log.warning("mldiag: publishing alert %s failed (attempt %d): %s",
                            alert.alert_id, attempt + 1, e)
                time.sleep(2.0**attempt)

    # Lifetime

    def _heartbeat(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                self.plane.state.update_target(self.name, self.host, self.target.port,
                                               last_heartbeat=time.time(), pid=os.getpid())
            except Exception as e:  # noqa: BLE001 - a missed heartbeat must not kill training
                log.warning("mldiag heartbeat failed: %s", e)

    def close(self) -> None:
        """Finish uploads, stop continuous profiling, the control endpoint and heartbeats."""
        global _current
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        # Uploads first: one may still be cutting its trace from the ring.
        for f in list(self._pending):
            try:
                f.result(timeout=300)
            except Exception as e:  # noqa: BLE001 - report every failed upload, then go on
                log.error("mldiag: an upload failed: %s", e)
        self._executor.shutdown(wait=True)
        if self.ring is not None and self.ring.active:
            self.ring.stop()
        if self.control is not None:
            self.control.stop()
        if self.profiler_server is not None:
            import jax

            jax.profiler.stop_server()
            self.profiler_server = None
        try:
            # Only if the record is still ours: a newer process may own this host and port.
            mine = [t for t in self.plane.state.list_targets(self.name)
                    if t.host == self.host and t.port == self.target.port
                    and t.pid == self.target.pid and t.control_port == self.target.control_port]
            if mine:
                self.plane.state.update_target(self.name, self.host, self.target.port,
                                               continuous="OFF", last_heartbeat=0.0)
        except Exception as e:  # noqa: BLE001 - exiting anyway
            log.warning("mldiag: could not mark the target stopped: %s", e)
        with _current_lock:
            if _current is self:
                _current = None

    def __enter__(self) -> MLRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def machinelearning_run(
    name: str,
    run_group: str | None = None,
    configs: dict[str, Any] | None = None,
    project: str | None = None,
    region: str | None = None,
    gcs_path: str | None = None,
    on_demand_xprof: bool = False,
    *,
    port: int = 9999,
    host_name: str | None = None,
    continuous: bool | dict[str, Any] = False,
    auto_capture: dict[str, Any] | AutoCapturePolicy | None = None,
    monitor: bool | dict[str, Any] = True,
    heartbeat_s: float = 10.0,
    settings: Settings | None = None,
    **_ignored: Any,
) -> MLRun:
    """Register the run and this process as a profiler target; returns the run.

    Mirrors `google_cloud_mldiagnostics.machinelearning_run`. Profiles go to the embedded
    bucket locally, or to `gcs_path` (`gs://BUCKET[/PREFIX]`) with MLDIAG_BACKEND=gcp.

    mldiag extensions (keyword-only): `port` of the on-demand profiler server (9999);
    `host_name`, this process's name in profile file names (default $MLDIAG_HOST_NAME or the
    hostname); `continuous` starts continuous profiling at once (True, or ring options);
    `auto_capture` sets the run's auto-capture policy; `monitor` configures the step-time
    degradation monitor (False turns it off); `heartbeat_s`.
    """
    global _current
    import jax

    from mldiag.bootstrap import control_plane
    from mldiag.sdk import metrics
    from mldiag.sdk.continuous import RingBuffer
    from mldiag.sdk.control import ControlServer

    if not name or "/" in name:
        raise MldiagError(f"run name must be a non-empty name without '/', not {name!r}")
    with _current_lock:
        previous = _current
    if previous is not None:
        # One run per process at a time: its profiler server and port are taken.
        previous.close()
    bucket, prefix = _split_gcs_path(gcs_path)
    overrides: dict[str, Any] = {"project": project, "location": region}
    if bucket:
        overrides["bucket"] = bucket
    settings = settings or Settings.from_env(**overrides)
    plane = control_plane(settings)
    now = time.time()
    plane.state.register_run(RunRecord(
        name=name, run_group=run_group, configs=dict(configs or {}), storage_prefix=prefix,
        on_demand=on_demand_xprof, created_at=now))
    if auto_capture is not None:
        policy = (auto_capture if isinstance(auto_capture, AutoCapturePolicy)
                  else AutoCapturePolicy.from_dict(dict(auto_capture)))
        plane.state.set_auto_capture(name, policy.to_dict())

    host = host_name or os.environ.get("MLDIAG_HOST_NAME") or socket.gethostname()
    address = os.environ.get("MLDIAG_TARGET_ADDRESS") or (
        "127.0.0.1" if settings.backend == "local" else socket.gethostbyname(socket.gethostname()))
    # The control endpoint and the monitor report to the run, built once the servers are up.
    holder: list[MLRun] = []
    # Bad monitor options fail here, before any server starts or the target is registered.
    step_monitor = (StepTimeMonitor(lambda found: holder[0]._alert(found),
                                    **(monitor if isinstance(monitor, dict) else {}))
                    if monitor else None)
    server = jax.profiler.start_server(port) if on_demand_xprof else None
    ring = RingBuffer()
    token = secrets.token_urlsafe(24)
    # A fixed control port (MLDIAG_CONTROL_PORT) lets a firewall open just that port.
    control = ControlServer(ring, token, host=address,
                            port=int(os.environ.get("MLDIAG_CONTROL_PORT") or 0),
                            on_change=lambda state: holder[0]._set_continuous(state))
    control_port = control.start()
    target = TargetRecord(
        run=name, host=host, port=port, process_index=jax.process_index(), framework="jax",
        framework_version=jax.__version__, last_heartbeat=now, address=address,
        control_port=control_port, control_token=token, platform=jax.devices()[0].platform,
        pid=os.getpid(), registered_at=now, heartbeat_s=heartbeat_s)
    plane.state.upsert_target(target)

    run = MLRun(name=name, run_group=run_group, configs=dict(configs or {}), gcs_path=gcs_path,
                project=project, region=region, on_demand_xprof=on_demand_xprof, host=host,
                target=target, plane=plane, storage_prefix=prefix, ring=ring, control=control,
                profiler_server=server)
    holder.append(run)
    run.monitor = step_monitor
    _at_exit(run.close)
    threading.Thread(target=run._heartbeat, args=(heartbeat_s,), name="mldiag-heartbeat",
                     daemon=True).start()
    with _current_lock:
        _current = run
    metrics.clear()
    if continuous:
        try:
            run.start_continuous(**(continuous if isinstance(continuous, dict) else {}))
        except BaseException:
            run.close()  # bad ring options: leave no server or live target behind
            raise
    log.info("mldiag: run %s registered; target %s (%s:%d, control %d)", name, host, address,
             port, control_port)
    return run
