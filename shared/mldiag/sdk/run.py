"""`machinelearning_run(...)`: register the run and this process as a profiler target."""

from __future__ import annotations

import atexit
import datetime
import enum
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mldiag.capture import remote
from mldiag.capture.remote import accepts_connections
from mldiag.capture.targets import liveness
from mldiag.errors import MldiagError
from mldiag.messages import DegradationDetected
from mldiag.model import (
    CAPTURING,
    FAILED,
    PULL,
    PUSH,
    REQUESTED,
    AutoCapturePolicy,
    HostRecord,
    RunRecord,
    SessionRecord,
    TargetRecord,
)
from mldiag.sdk import engines, hosts, metrics, workload
from mldiag.sdk.continuous import RingBuffer
from mldiag.sdk.current import current_run, release, set_current
from mldiag.sdk.custom_types.exceptions import MLRunConfigurationError
from mldiag.sdk.custom_types.mlrun_types import (
    AcceleratorOrchestrator,
    ApplicationFramework,
    ConfigDict,
    Framework,
    Orchestrator,
    RlOrchestrator,
    RunPhase,
    ServingEngine,
)
from mldiag.sdk.monitor import Degradation, StepTimeMonitor
from mldiag.sdk.pull import Puller
from mldiag.settings import Settings

if TYPE_CHECKING:
    # Not a circle (bootstrap imports no SDK module): bootstrap builds the whole pipeline
    # (the analysis, NumPy), which a workload pays for only when it starts a run.
    from mldiag.bootstrap import ControlPlane

log = logging.getLogger(__name__)
# How long an upload waits for its session's join (a state-store call) before going on: the
# upload registers its host through the bucket either way.
JOIN_WAIT_S = 120.0


def _at_exit(fn: Callable[[], None]) -> None:
    """Call `fn` when the interpreter exits, before the non-daemon threads are joined.

    Plain atexit handlers run after threading's shutdown, when the upload threads have been
    joined; the hook concurrent.futures uses runs earlier (fall back to atexit). Neither may
    start a thread from Python 3.12 on, so `fn` must need none: the Firestore adapter reads
    by unary calls, and the run lists nothing at exit (adapters.gcp.firestore_client.read).
    """
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        atexit.register(fn)
        return
    try:
        register(fn)
    except RuntimeError:  # already shutting down
        atexit.register(fn)


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
    """A registered run and this process's target; built by `machinelearning_run`.

    Has the attributes of `google_cloud_mldiagnostics`'s MLRun (`name`, `display_name`,
    `run_group`, `configs`, `gcs_path`, `location`, `project`, `run_phase`, `created_at`,
    `orchestrator`, `workload_details`, ...). `name` is the sanitised name the run is stored
    under; `display_name` is the name as given. `configs` is a ConfigDict: item or attribute
    changes are saved to the run's record.
    """

    name: str
    run_group: str | None
    configs: ConfigDict
    gcs_path: str | None
    project: str | None
    location: str | None
    on_demand_xprof: bool
    host: str
    target: TargetRecord
    plane: ControlPlane
    storage_prefix: str = ""
    display_name: str = ""
    run_phase: RunPhase = RunPhase.PHASE_ACTIVE
    created_at: str | None = None
    orchestrator: Orchestrator = Orchestrator.CUSTOM
    workload_details: dict[str, Any] | None = None
    workload_targets: list[dict[str, Any]] | None = None
    log_system_metrics: bool = False
    metric_only_run: bool = False
    environment: str = "prod"
    framework: Framework = Framework.JAX
    serving_engine: ServingEngine = ServingEngine.NONE
    metrics_exporter_config: dict[str, Any] | None = None
    accelerator_orchestrator: AcceleratorOrchestrator = AcceleratorOrchestrator.NONE
    application_framework: ApplicationFramework = ApplicationFramework.NONE
    rl_orchestrator: RlOrchestrator = RlOrchestrator.NONE
    control_plane_url: str | None = None
    ml_run_id: str | None = None
    cluster_id: str | None = None
    workload_id: str | None = None
    namespace: str | None = None
    monitor: StepTimeMonitor | None = None
    ring: RingBuffer | None = None
    puller: Puller | None = None
    profiler_server: Any = None
    # The framework's profiler (mldiag.sdk.engines): JAX, PyTorch/XLA or TorchTPU.
    engine: engines.ProfilerEngine = field(default_factory=engines.JaxEngine)
    alerts: list[DegradationDetected] = field(default_factory=list)
    _executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(2, thread_name_prefix="mldiag-upload"))
    # Session joins and failure records, in the order xprof() made them (one thread: a
    # failure is recorded after the join it follows).
    _joins: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="mldiag-join"))
    _pending: list[Future[Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _closed: bool = False
    _record: RunRecord | None = None
    _slot: hosts.HostSlot | None = None

    @property
    def region(self) -> str | None:
        """The run's region (`location`)."""
        return self.location

    def _save_configs(self, configs: ConfigDict) -> None:
        """Store changed configs on the run's record (ConfigDict calls this)."""
        if self._record is None or self._closed:
            return
        self._record.configs = _json_safe(dict(configs))
        self._save_record("configs")

    def set_rl_orchestrator(self, value: RlOrchestrator) -> None:
        """Set the run's RL orchestrator and store it on the run's record (what an
        integration such as Tunix's MldiagHooks does when training starts)."""
        self.rl_orchestrator = value
        if self._record is None or self._closed:
            return
        self._record.rl_orchestrator = _stored_orchestrator(value)
        self._save_record("rl_orchestrator")

    def _save_record(self, what: str) -> None:
        assert self._record is not None
        try:
            self.plane.state.register_run(self._record)
        except Exception as e:  # noqa: BLE001 - a field update must not stop training
            log.warning("mldiag: could not save the %s of run %s: %s", what, self.name, e)

    def join(self, session: str, process_index_list: list[int] | None = None
             ) -> Future[SessionRecord | None]:
        """Join this process to the programmatic session `session`, in the background;
        the future gives the stored session (None when it could not be recorded: the
        upload still registers the host, through the bucket).

        The session is created by the first process of the job that gets there, and
        records the job: in a multi-process job (`process_count > 1`) its process count,
        the processes that capture (`process_index_list`) and this process's index and host
        name, from which the pipeline knows when every process's trace is in, however far
        apart the processes start. Outside one, the run's live targets are the hosts it
        expects. Nothing here waits on another process.
        """
        count = self.engine.process_count()
        index = self.target.process_index

        def _join() -> SessionRecord | None:
            now = time.time()
            expected: list[str] = []
            indices: list[int] = []
            if count > 1:
                indices = sorted({i for i in process_index_list or () if 0 <= i < count})
            else:
                stale = self.plane.settings.target_stale_s
                expected = sorted({
                    t.host for t in self.plane.state.list_targets(self.name)
                    if (now - t.last_heartbeat <= stale or t.host == self.host) and (
                        process_index_list is None or t.process_index in process_index_list)})
            record = SessionRecord(
                run=self.name, session=session, state=CAPTURING, kind="programmatic",
                trigger="manual", expected_hosts=expected, created_at=now, updated_at=now,
                process_count=count if count > 1 else 0, process_indices=indices)
            try:
                stored, _ = self.plane.state.join_session(record, self.host, index)
            except Exception as e:  # noqa: BLE001 - the capture goes on; its upload registers it
                log.warning("mldiag: could not register session %s: %s", session, e)
                return None
            return stored

        return self._joins.submit(_join)

    def fail_host_later(self, session: str, reason: str) -> None:
        """`fail_host` in the background, after this process's join of `session`."""
        def _record() -> None:
            try:
                self.fail_host(session, reason)
            except Exception as e:  # noqa: BLE001 - the state store is down: the log says it
                log.error("mldiag: could not record the failure of session %s: %s", session, e)

        self._joins.submit(_record)

    def fail_host(self, session: str, reason: str) -> None:
        """Record that this host's profile of `session` will not come, and why.

        When no host of the session can arrive any more (every host it expects failed),
        the session is FAILED at once with the reason, instead of waiting for the sweeper.
        """
        now = time.time()
        state = self.plane.state
        s, _ = state.register_host(self.name, session, self.host, HostRecord(
            object_name=f"{self.session_dir(session)}/{self.host}.xplane.pb", generation="",
            size=0, arrived_at=now, status="FAILED", reason=f"{self.host}: {reason}"), now)
        if s.hopeless():
            state.transition(self.name, session, FAILED, expect=[REQUESTED, CAPTURING],
                             version=s.version, now=now, reason=f"{self.host}: {reason}")

    # Storage

    def session_dir(self, session: str) -> str:
        """`<prefix>/<run>/plugins/profile/<session>` in the run's storage."""
        parts = [self.storage_prefix, self.name, "plugins", "profile", session]
        return "/".join(p for p in parts if p)

    def upload(self, session: str, data: bytes | Callable[[], bytes], *,
               after: Future[Any] | None = None) -> Future[str]:
        """Write this host's xplane of `session` in the background; returns the object name.

        `data` may be a callable producing the bytes (it runs in the background too).
        `after` (this process's join of the session) is waited for first, so that the
        session knows its job before the trace lands.
        """
        name = f"{self.session_dir(session)}/{self.host}.xplane.pb"

        def _joined() -> None:
            if after is None:
                return
            try:
                after.result(timeout=JOIN_WAIT_S)
            except Exception as e:  # noqa: BLE001 - the upload registers the host anyway
                log.warning("mldiag: session %s: joining did not finish (%s); uploading",
                            session, e)

        def _upload_trace() -> str:
            try:
                # The bytes first (a ring's windows do not wait), then the join, then the write.
                blob = data if isinstance(data, bytes) else data()
                if not blob:
                    raise MldiagError(f"session {session}: the profiler wrote an empty trace")
                _joined()
                self.plane.storage.write_bytes(name, blob)
            except Exception as e:
                # The session expects this host: record why it will not come, so the session
                # goes on with the other hosts (or fails with this reason) instead of waiting;
                # after the join, so that the session knows its job first.
                try:
                    _joined()
                    self.fail_host(session, str(e))
                except Exception as state_error:  # noqa: BLE001 - the upload error is raised
                    log.error("mldiag: could not record the failed upload of %s: %s", name,
                              state_error)
                raise
            log.info("uploaded %s (%d bytes)", name, len(blob))
            return name

        future = self._executor.submit(_upload_trace)
        # Keep only unfinished uploads (and failed ones, for wait_uploads to report).
        self._pending = [f for f in self._pending
                         if not f.done() or f.exception() is not None] + [future]
        return future

    def wait_uploads(self, timeout: float | None = None) -> list[str]:
        """Wait for every upload started so far; returns their object names (raises the
        first upload's error)."""
        pending, self._pending = list(self._pending), []
        return [f.result(timeout=timeout) for f in pending]

    # Continuous profiling (the SDK's portable ring buffer, or xprof's own when the workload
    # started it)

    @property
    def profiler_address(self) -> str | None:
        """This process's profiler server, where xprof's native continuous profiling runs
        when the workload started it (`start_continuous_profiling('localhost:PORT', ...)`);
        None when this process runs none (a server on that port is another process's)."""
        if self.profiler_server is None and not _jax_server_running():
            return None
        return f"127.0.0.1:{self.target.port}"

    def native_running(self) -> bool:
        """Whether xprof's native continuous profiling holds this process's profiler."""
        address = self.profiler_address
        return address is not None and remote.native_running(address)

    def _profiler_holder(self) -> str | None:
        """Who holds the profiler, by name, when the ring cannot start a window."""
        if self.native_running():
            return ("xprof's native continuous profiling (started with continuous_profiling_"
                    f"snapshot.start_continuous_profiling on :{self.target.port}); mldiag's "
                    "snapshots read its buffer")
        return None

    def start_continuous(self, **options: Any) -> None:
        """Start continuous profiling of this process (snapshot mode) in the ring buffer.

        When the workload already runs xprof's native continuous profiling on its profiler
        server, that session is adopted instead (the target is NATIVE and snapshots are
        xprof's `get_snapshot`): only one profiler session can run in a process.
        """
        if self.ring is None:
            raise MldiagError("continuous profiling is not available: the run was closed")
        if self.ring.active:
            self.ring.start(**options)  # validates; the running ring is kept
            self._set_continuous("RING")
            return
        if self.native_running():
            log.info("mldiag: %s: xprof's native continuous profiling already runs on :%d; "
                     "adopted", self.host, self.target.port)
            self._set_continuous("NATIVE")
            return
        self.ring.start(**options)
        self._set_continuous("RING")

    def stop_continuous(self) -> None:
        """Stop continuous profiling of this process (an adopted native session too: the
        user asked for it to stop)."""
        if self.ring is not None:
            self.ring.stop()
        if self.target.continuous == "NATIVE" and self.profiler_address is not None:
            remote.native_stop(self.profiler_address)
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
        # Kept with the run's metrics, so the step-time chart marks it even when the policy
        # took no capture (disabled, cooldown).
        metrics.record_alert(self, alert, found)
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
        """Stop taking capture requests, finish uploads, stop continuous profiling and
        heartbeats."""
        if self._closed:
            return
        # Metrics first, while the run is still current: they are written in batches.
        metrics.flush_to(self)
        self._closed = True
        self._stop.set()
        if self.puller is not None:
            # No new requests; those taken finish (their uploads join the pending ones).
            self.puller.stop()
        # Uploads first: one may still be cutting its trace from the ring (and each waits
        # for its session's join, which the join thread finishes meanwhile).
        for f in list(self._pending):
            try:
                f.result(timeout=300)
            except Exception as e:  # noqa: BLE001 - report every failed upload, then go on
                log.error("mldiag: an upload failed: %s", e)
        self._executor.shutdown(wait=True)
        self._joins.shutdown(wait=True)
        if self.ring is not None and self.ring.active:
            self.ring.stop()
        if self.profiler_server is not None:
            server, self.profiler_server = self.profiler_server, None
            self.engine.stop_server(server)
        try:
            # Only if the record is still ours: a newer process may own this host and port.
            # One read-modify-write, no listing: at exit nothing may start a thread (a listing
            # streams, and a gRPC stream needs one; see adapters.gcp.firestore_client.read).
            self.plane.state.update_target(
                self.name, self.host, self.target.port,
                expect={"pid": self.target.pid, "registered_at": self.target.registered_at},
                continuous="OFF", last_heartbeat=0.0)
        except Exception as e:  # noqa: BLE001 - exiting anyway
            log.warning("mldiag: could not mark the target stopped: %s", e)
        if self._slot is not None:
            self._slot.release()
        release(self)

    def __enter__(self) -> MLRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _jax_server_running() -> bool:
    """Whether the workload started jax's profiler server itself (`jax.profiler.start_server`,
    which keeps it in this private slot; False where jax's internals differ)."""
    from jax._src import profiler as jax_profiler

    return getattr(jax_profiler, "_profiler_server", None) is not None


def _live_hosts(plane: ControlPlane, run: str, settings: Settings) -> set[str]:
    """The host names that live processes registered in `run` (taken by someone else)."""
    now = time.time()
    return {t.host for t in plane.state.list_targets(run)
            if not liveness(t, settings, now)}


def _json_safe(configs: dict[str, Any]) -> dict[str, Any]:
    """Configs as the state store can keep them: JSON values as they are, anything else
    (arrays, dtypes, objects) as its str(), which is what upstream stores for every value."""
    out: dict[str, Any] = {}
    for key, value in configs.items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            value = str(value)
        out[str(key)] = value
    return out


def _enum[E: enum.Enum](kind: type[E], value: E | str | None, what: str) -> E:
    """An enum argument given as a member, its name (any case) or None (NONE)."""
    if value is None:
        return kind["NONE"]
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        try:
            return kind[value.upper()]
        except KeyError:
            pass
        raise MLRunConfigurationError(
            f"Invalid {what}: {value!r}. Supported values are: {[e.value for e in kind]}")
    raise MLRunConfigurationError(
        f"Invalid {what}: {value!r}. Expected {kind.__name__} or str.")


def _stored_orchestrator(value: RlOrchestrator) -> str:
    """The run record's `rl_orchestrator`: the enum's value, "" for none."""
    return "" if value is RlOrchestrator.NONE else value.value


def machinelearning_run(
    name: str,
    run_group: str = "",
    configs: dict[str, Any] | None = None,
    gcs_path: str | None = None,
    base_url: str | None = None,
    cluster_id: str | None = None,
    project: str | None = None,
    region: str | None = "us-central1",
    metrics_record_interval_sec: float = 10.0,
    on_demand_xprof: bool = False,
    log_system_metrics: bool = False,
    environment: str = "prod",
    framework: Framework = Framework.JAX,
    serving_engine: ServingEngine = ServingEngine.NONE,
    run_workload_id: str | None = None,
    metric_only_run: bool = False,
    metrics_exporter_config: dict[str, Any] | None = None,
    accelerator_orchestrator: AcceleratorOrchestrator = AcceleratorOrchestrator.NONE,
    application_framework: ApplicationFramework | str = ApplicationFramework.NONE,
    rl_orchestrator: RlOrchestrator | str = RlOrchestrator.NONE,
    *,
    port: int | None = None,
    host_name: str | None = None,
    continuous: bool | dict[str, Any] = False,
    auto_capture: dict[str, Any] | AutoCapturePolicy | None = None,
    monitor: bool | dict[str, Any] = True,
    heartbeat_s: float = 10.0,
    settings: Settings | None = None,
) -> MLRun:
    """Register the run and this process as a profiler target; returns the run.

    `google_cloud_mldiagnostics.machinelearning_run` 1.0.10's signature, positional order and
    checks (a missing name, an unknown `environment`, `application_framework` or
    `rl_orchestrator`, a zone for `region`: MLRunConfigurationError; an unknown keyword:
    TypeError). The name is sanitised as upstream does it ("My Run 1" → `my-run-1`, the
    run's `name`; `display_name` keeps the original). Profiles go to the embedded bucket
    locally, or to `gcs_path` (`gs://BUCKET[/PREFIX]`) with MLDIAG_BACKEND=gcp.

    mldiag extensions (keyword-only): `port` of the on-demand profiler server (default
    $MLDIAG_PROFILER_PORT, else 9999 as upstream, or the next port free on this machine);
    `host_name`, this process's name in profile file names (default $MLDIAG_HOST_NAME,
    $HOSTNAME or the hostname, plus `-<process index>` in a multi-process JAX job; a name
    that another live process of the run holds on this machine gets the lowest free
    `-<n>`, see mldiag.sdk.hosts); `continuous` starts continuous profiling at once (True, or
    ring options); `auto_capture` sets the run's auto-capture policy; `monitor` configures
    the step-time degradation monitor (False turns it off); `heartbeat_s`; `settings`.

    Example::

        run = machinelearning_run(name="experiment_1", run_group="training_set_v1",
                                  configs={"epochs": 100, "batch_size": 32})
        run.configs.update({"epochs": 300, "optimizer": "adam"})
        run.configs.batch_size = 64
    """
    if not name:
        raise MLRunConfigurationError(
            "name is required and must be provided. The name parameter helps identify and "
            "organize your ML workloads. Please provide a meaningful name (e.g., "
            "'training_v1', 'experiment_batch_1').")
    if environment not in ("autopush", "staging", "prod"):
        raise MLRunConfigurationError(
            "environment must be one of 'autopush', 'staging', or 'prod'.")
    application_framework = _enum(ApplicationFramework, application_framework,
                                  "application_framework")
    rl_orchestrator = _enum(RlOrchestrator, rl_orchestrator, "rl_orchestrator")
    framework = Framework.JAX if framework is None else _enum(Framework, framework, "framework")
    serving_engine = _enum(ServingEngine, serving_engine, "serving_engine")
    engine = engines.select(framework, profiling=not metric_only_run)
    if continuous and not engine.pulls:
        raise MLRunConfigurationError(
            f"continuous profiling is the SDK's JAX ring: the {engine.name} profiler cannot "
            "run it (start on_demand_xprof and capture on demand instead)")
    if region is not None:
        workload.validate_region(region)
    display_name = name
    stored_name = workload.run_name(name)
    if stored_name != name:
        log.info("mldiag: run %r is stored as %r", name, stored_name)
    if metric_only_run:
        if continuous:
            raise MLRunConfigurationError("a metric_only_run profiles nothing: it cannot "
                                          "start continuous profiling")
        on_demand_xprof = False

    # Upstream's self-hosted Diagon control plane: mldiag is the control plane, so only the
    # identifiers are kept on the run.
    base_url = base_url or os.environ.get("DIAGON_BASE_URL")
    namespace = workload_id = None
    if base_url:
        log.warning("mldiag: base_url/DIAGON_BASE_URL %s is not used: mldiag registers the "
                    "run in its own state store", base_url)
        namespace = os.environ.get("POD_NAMESPACE") or "default"
        workload_id = (run_workload_id or os.environ.get("DIAGON_WORKLOAD_ID")
                       or os.environ.get("WORKLOAD_ID") or name)
        cluster_id = cluster_id or os.environ.get("DIAGON_CLUSTER_ID", "")
    orchestrator, details = workload.detect(run_workload_id=run_workload_id)
    workload_id = workload_id or run_workload_id or os.environ.get("RUN_WORKLOAD_ID")

    # Imported here, not with the SDK (it does not import the SDK back): bootstrap builds the
    # whole pipeline.
    from mldiag.bootstrap import control_plane

    previous = current_run()
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
    user_configs = _json_safe(dict(configs or {}))
    record = plane.state.register_run(RunRecord(
        name=stored_name, run_group=run_group or None, configs=user_configs,
        storage_prefix=prefix, on_demand=on_demand_xprof, created_at=now,
        rl_orchestrator=_stored_orchestrator(rl_orchestrator)))
    if auto_capture is not None:
        policy = (auto_capture if isinstance(auto_capture, AutoCapturePolicy)
                  else AutoCapturePolicy.from_dict(dict(auto_capture)))
        plane.state.set_auto_capture(stored_name, policy.to_dict())

    try:
        base = workload.safe_segment("host name", host_name or workload.hostname())
    except ValueError as e:
        raise MLRunConfigurationError(str(e)) from e
    # A metric-only run uploads nothing, so it takes no name another process could want.
    slot = hosts.HostSlot(base) if metric_only_run else hosts.claim(
        stored_name, base, process_index=engine.process_index(),
        process_count=1 if host_name else engine.process_count(),
        taken=lambda: _live_hosts(plane, stored_name, settings))
    host = slot.name
    try:
        if port is None and os.environ.get("MLDIAG_PROFILER_PORT"):
            port = int(os.environ["MLDIAG_PROFILER_PORT"])
        elif port is None:
            # Upstream's 9999, or the next free one when processes share the machine.
            port = slot.claim_port(9999, lambda p: accepts_connections(f"127.0.0.1:{p}")) \
                if on_demand_xprof else 9999
        address = os.environ.get("MLDIAG_TARGET_ADDRESS") or (
            "127.0.0.1" if settings.backend == "local"
            else socket.gethostbyname(socket.gethostname()))
        # The monitor reports to the run, built once the server is up.
        holder: list[MLRun] = []
        # Bad monitor options fail here, before any server starts or the target is registered.
        step_monitor = (StepTimeMonitor(lambda found: holder[0]._alert(found),
                                        **(monitor if isinstance(monitor, dict) else {}))
                        if monitor else None)
        # mldiag's own captures come by pull (mldiag.sdk.pull): nothing listens for them. JAX's
        # profiler server is only for tools that push (TensorBoard, the XProf UI's capture).
        # A torch engine's target is its profiler server, which the capture stage connects to.
        server = engine.start_server(port) if on_demand_xprof else None
        ring = RingBuffer()
        ring.holder = lambda: holder[0]._profiler_holder() if holder else None
        target = TargetRecord(
            run=stored_name, host=host, port=port, process_index=engine.process_index(),
            framework=engine.framework, framework_version=engine.version(),
            last_heartbeat=now, address=address, delivery=PULL if engine.pulls else PUSH,
            platform=engine.platform(), pid=os.getpid(), registered_at=now,
            heartbeat_s=heartbeat_s)
        if not metric_only_run:
            # A metric-only run profiles nothing: no target to capture from or to wait for.
            plane.state.upsert_target(target)

        run = MLRun(
            name=stored_name, run_group=run_group, configs=ConfigDict(configs or {}),
            gcs_path=gcs_path, project=project or settings.project or None,
            location=region or settings.location, on_demand_xprof=on_demand_xprof, host=host,
            target=target, plane=plane, storage_prefix=prefix, display_name=display_name,
            created_at=datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat(),
            orchestrator=orchestrator, workload_details=details,
            workload_targets=[{"display_name": host, "hostname": host, "state": "RUNNING"}],
            log_system_metrics=log_system_metrics, metric_only_run=metric_only_run,
            environment=environment, framework=framework, serving_engine=serving_engine,
            metrics_exporter_config=metrics_exporter_config,
            accelerator_orchestrator=accelerator_orchestrator,
            application_framework=application_framework, rl_orchestrator=rl_orchestrator,
            control_plane_url=base_url, cluster_id=cluster_id, workload_id=workload_id,
            namespace=namespace, ring=ring, profiler_server=server, engine=engine,
            _record=record, _slot=slot)
    except BaseException:
        slot.release()  # no run holds it: a retry in this process takes the same name
        raise
    object.__setattr__(run.configs, "_on_change", run._save_configs)
    holder.append(run)
    run.monitor = step_monitor
    _at_exit(run.close)
    if not metric_only_run:
        threading.Thread(target=run._heartbeat, args=(heartbeat_s,), name="mldiag-heartbeat",
                         daemon=True).start()
        if engine.pulls:
            run.puller = Puller(run, settings.pull_poll_s)
            run.puller.start()
    set_current(run)
    metrics.clear()
    if log_system_metrics and metrics_record_interval_sec > 0:
        metrics.start_system_metrics(run, metrics_record_interval_sec)
    if continuous:
        try:
            run.start_continuous(**(continuous if isinstance(continuous, dict) else {}))
        except BaseException:
            run.close()  # bad ring options: leave no server or live target behind
            raise
    log.info("mldiag: run %s registered; target %s takes its capture requests by pull%s",
             stored_name, host, f" (profiler server on :{port})" if server else "")
    return run
