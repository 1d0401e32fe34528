"""One bootstrap: build every service from Settings. Nothing connects or opens files at import.

`bootstrap` builds the embedded runtime (local directory, SQLite, in-process bus, rule-based
investigator); with `backend == "gcp"`, `gcp_services` and `control_plane` build the Google
Cloud adapters instead (GCS, Firestore, Pub/Sub), imported only then.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

from mldiag.adapters.local.bus import InProcessBus
from mldiag.adapters.local.periodic import Periodic
from mldiag.adapters.local.state import SqliteStateStore
from mldiag.adapters.local.storage import DirectoryWatcher, LocalDirStorage
from mldiag.analysis import RuleBasedInvestigator
from mldiag.errors import MldiagError
from mldiag.messages import (
    TOPIC_OF,
    AnalyzeSession,
    CollectHost,
    InvestigateSession,
    PrebuildViewer,
    ProfileObjectFinalized,
    RenderReport,
)
from mldiag.model import XPLANE_SUFFIXES, SessionRecord
from mldiag.ports import Bus, Investigator, ObjectInfo, StateStore, Storage
from mldiag.registration import Registrar
from mldiag.settings import Settings
from mldiag.stages import (
    Services,
    dead_lettered,
    dispatch,
    probe_targets,
    requeue_stuck,
    sweep,
)

log = logging.getLogger(__name__)


# One queue serves every topic locally, where Pub/Sub gives each its own subscription. So that
# a backlog of analyses never holds back the reports of sessions already analysed (nor the
# registration of arriving hosts, which the settle window times), deliver arrivals first, then
# the work that finishes a session before the work that starts one.
TOPIC_PRIORITY = {
    TOPIC_OF[ProfileObjectFinalized]: 0,
    TOPIC_OF[RenderReport]: 1,
    TOPIC_OF[InvestigateSession]: 2,
    TOPIC_OF[CollectHost]: 3,
    TOPIC_OF[AnalyzeSession]: 4,
    TOPIC_OF[PrebuildViewer]: 5,
}


class RuntimeBusy(MldiagError):
    """Another `mldiag up` already owns this MLDIAG_HOME.

    Transient: it clears when that runtime stops.
    """


class LocalRuntime:
    """The embedded pipeline: watcher → bus workers → stages, plus the sweeper."""

    def __init__(self, services: Services, bus: InProcessBus, state: SqliteStateStore,
                 storage: LocalDirStorage) -> None:
        self.services = services
        self.bus = bus
        self.state = state
        self.storage = storage
        settings = services.settings
        self.watcher = DirectoryWatcher(storage, settings.stability_s,
                                        poll_s=min(settings.poll_s, 0.05))
        # The local stand-in for Cloud Scheduler's sweeper job.
        self.sweeper = Periodic("mldiag-sweeper", lambda: sweep(services),
                                min(0.25, settings.settle_s / 4 or 0.25))
        # The background prober of plain profiler servers (off the bus's workers).
        self.prober = Periodic("mldiag-prober", lambda: probe_targets(services),
                               max(0.05, min(1.0, settings.probe_interval_s / 4)))
        self._lock_file: IO[str] | None = None

    def _acquire(self) -> None:
        home = self.services.settings.home
        home.mkdir(parents=True, exist_ok=True)
        f = open(home / "runtime.lock", "a+")  # noqa: SIM115 - held for the runtime's life
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            f.close()
            raise RuntimeBusy(f"another `mldiag up` is running on {home}") from e
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._lock_file = f

    def start(self) -> None:
        """Recover what a previous process left in flight, then start every worker."""
        self._acquire()
        released = self.state.release_all_held()
        recovered = self.bus.recover()
        # A crash between a stage's transition and its publish leaves a session whose message
        # was never sent: replay the work of every session still in a working state.
        replayed = requeue_stuck(self.services, stuck_after_s=0.0)
        if released or recovered or replayed:
            log.info("recovered %d in-flight message(s), released %d claim(s), replayed %d "
                     "session(s)", recovered, released, replayed)
        self.bus.start(dispatch(self.services))
        self.watcher.start()
        self.sweeper.start()
        self.prober.start()

    def stop(self) -> None:
        """Stop watching, finish the messages in progress, release the home."""
        self.watcher.stop()
        self.sweeper.stop()
        self.prober.stop()
        self.bus.stop()
        if self._lock_file is not None:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Wait until no message is pending and no session is waiting to settle."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            busy = self.bus.pending() or any(
                s.state in ("CAPTURING", "CAPTURED", "ANALYZING", "INVESTIGATING")
                for s in self.state.list_sessions())
            if not busy:
                return True
            time.sleep(0.05)
        return False


def open_state(settings: Settings) -> SqliteStateStore:
    """The state store alone, for read-only commands (`runs`, `sessions`, `targets`)."""
    if not Path(settings.state_db).is_file():
        raise MldiagError(f"no mldiag state in {settings.home} (start `mldiag up` there, or set "
                          "MLDIAG_HOME / --home)")
    return SqliteStateStore(settings.state_db)


@dataclass
class ControlPlane:
    """State, storage and a publish-only bus: what processes that do not run the stages need
    (the SDK inside a workload, the CLI's control commands)."""

    settings: Settings
    state: StateStore
    storage: Storage
    bus: Bus


def control_plane(settings: Settings | None = None) -> ControlPlane:
    """Connect to the control plane that `settings` names, without starting any worker.

    Locally, messages published here are rows in the queue that `mldiag up` delivers; with
    `backend == "gcp"` they go to Pub/Sub, state to Firestore and objects to GCS.
    """
    settings = settings or Settings.from_env()
    if settings.backend == "gcp" and settings.registration_url:
        return workload_plane(settings)
    if settings.backend == "gcp":
        gcp = gcp_adapters(settings)
        return ControlPlane(settings=settings, state=gcp.state, storage=gcp.storage,
                            bus=gcp.bus)
    state = SqliteStateStore(settings.state_db)
    bus = InProcessBus(state, max_attempts=settings.max_attempts,
                       backoff_s=settings.retry_backoff_s, workers=0, poll_s=settings.poll_s)
    return ControlPlane(settings=settings, state=state,
                        storage=LocalDirStorage(Path(settings.bucket_dir)), bus=bus)


def workload_plane(settings: Settings) -> ControlPlane:
    """A GCP workload's control plane: its state and uploads go through the registration
    function (MLDIAG_REGISTRATION_URL), its alerts to Pub/Sub; no Firestore or bucket access.

    The registrar adapters offer only what the SDK calls, so they are the ports' subset."""
    from mldiag.adapters.gcp.bus import PubSubBus
    from mldiag.adapters.gcp.registrar import (
        RegistrationClient,
        RegistrationStateStore,
        SignedUrlStorage,
    )

    if not settings.project or not settings.bucket:
        raise MldiagError("MLDIAG_BACKEND=gcp needs MLDIAG_PROJECT and MLDIAG_BUCKET")
    client = RegistrationClient(settings.registration_url)
    return ControlPlane(settings=settings,
                        state=cast(StateStore, RegistrationStateStore(client)),
                        storage=cast(Storage, SignedUrlStorage(client, settings.bucket)),
                        bus=PubSubBus(settings.project, settings.topic_prefix))


def registrar(settings: Settings) -> Registrar:
    """The registration function's services: Firestore state and run owners, and the GCS
    signer of upload URLs (GCP only)."""
    from mldiag.adapters.gcp.registration import FirestoreRunOwners, GcsUploadSigner

    if settings.backend != "gcp" or not settings.registration_url:
        raise MldiagError("the registration function needs MLDIAG_BACKEND=gcp and "
                          "MLDIAG_REGISTRATION_URL (its own URL: its callers' token audience)")
    gcp = gcp_adapters(settings)
    return Registrar(settings=settings, state=gcp.state,
                     owners=FirestoreRunOwners(project=settings.project,
                                               database=settings.firestore_database),
                     uploads=GcsUploadSigner(settings.bucket, project=settings.project))


@dataclass
class GcpAdapters:
    """The Google Cloud adapters that `settings` name (GCS, Firestore, Pub/Sub)."""

    state: StateStore
    storage: Storage
    bus: Bus


def gcp_adapters(settings: Settings) -> GcpAdapters:
    """Build GcsStorage, FirestoreStateStore and PubSubBus from settings, unconnected.

    Their modules (and the Cloud SDKs) are imported here, only when GCP is chosen. Each client
    is created on first use with the ambient credentials, or the emulators named by
    STORAGE_EMULATOR_HOST, FIRESTORE_EMULATOR_HOST and PUBSUB_EMULATOR_HOST.
    """
    missing = [f"MLDIAG_{k.upper()}" for k in ("project", "bucket") if not getattr(settings, k)]
    if missing:
        raise MldiagError(f"MLDIAG_BACKEND=gcp needs {' and '.join(missing)}")
    try:
        from mldiag.adapters.gcp.bus import PubSubBus
        from mldiag.adapters.gcp.state import FirestoreStateStore
        from mldiag.adapters.gcp.storage import GcsStorage
    except ImportError as e:
        raise MldiagError(f"MLDIAG_BACKEND=gcp needs the gcp extra (pip install "
                          f"'mldiag[gcp]'): {e}") from e
    return GcpAdapters(
        state=FirestoreStateStore(project=settings.project,
                                  database=settings.firestore_database),
        storage=GcsStorage(settings.bucket, project=settings.project),
        bus=PubSubBus(settings.project, settings.topic_prefix),
    )


def gcp_services(
    settings: Settings,
    *,
    investigator: Investigator | None = None,
    clock: Callable[[], float] = time.time,
) -> Services:
    """The stages' services on Google Cloud: what each Cloud Function instance builds once.

    Delivery, retries and dead letters are Pub/Sub's and Eventarc's, so there is no runtime
    to start; the sweeper is a Cloud Scheduler job.
    """
    gcp = gcp_adapters(settings)
    services = Services(settings=settings, storage=gcp.storage, state=gcp.state, bus=gcp.bus,
                        clock=clock)
    services.investigator = investigator or make_investigator(settings)
    if settings.collect_job and not settings.in_job:
        from mldiag.adapters.gcp.jobs import CloudRunJobRunner

        services.jobs = CloudRunJobRunner(settings.project, settings.location,
                                          settings.collect_job)
    return services


def make_investigator(settings: Settings) -> Investigator:
    """The investigator that settings choose: rule-based, or Gemini on Vertex AI (which falls
    back to the rule-based one per session, with the reason, when Vertex fails)."""
    if settings.investigator == "gemini":
        from mldiag.adapters.gcp.gemini import GeminiInvestigator

        return GeminiInvestigator.from_settings(settings)
    if settings.investigator not in ("rule-based", ""):
        raise MldiagError(f"MLDIAG_INVESTIGATOR must be rule-based or gemini, not "
                          f"{settings.investigator!r}")
    return RuleBasedInvestigator()


def bootstrap(
    settings: Settings | None = None,
    *,
    investigator: Investigator | None = None,
    clock: Callable[[], float] = time.time,
    listener: Callable[[SessionRecord], None] | None = None,
) -> LocalRuntime:
    """Build the embedded runtime from settings (default: `Settings.from_env()`)."""
    settings = settings or Settings.from_env()
    state = SqliteStateStore(settings.state_db)
    if listener is not None:
        state.add_listener(listener)
    bus = InProcessBus(state, max_attempts=settings.max_attempts,
                       backoff_s=settings.retry_backoff_s, workers=settings.workers,
                       poll_s=settings.poll_s, clock=clock, priorities=TOPIC_PRIORITY)
    storage = LocalDirStorage(Path(settings.bucket_dir))

    services = Services(settings=settings, storage=storage, state=state, bus=bus, clock=clock)
    if settings.collect_job and not settings.in_job:
        from mldiag.adapters.local.jobs import LocalProcessJobRunner

        services.jobs = LocalProcessJobRunner(settings, log_dir=settings.home)

    def finalized(info: ObjectInfo) -> None:
        # Registered before it is hashed (seconds for 2 GB): hosts dropped together register
        # together. Its hash follows on the storage's hasher, for the same-bytes check of a
        # later rewrite (stages.intake).
        # Through services.bus, so a bus swapped in later (a test's, Pub/Sub) gets the events.
        services.bus.publish(ProfileObjectFinalized(
            bucket=storage.bucket, name=info.name, generation=info.generation, size=info.size,
            content_hash=storage.known_hash(info)))
        if info.name.endswith(XPLANE_SUFFIXES):
            storage.hash_later(info)

    storage.on_finalize = finalized
    services.investigator = investigator or make_investigator(settings)

    def dead(topic: str, payload: str, reason: str) -> None:
        dead_lettered(services, topic, payload, reason)

    bus.on_dead = dead
    return LocalRuntime(services, bus, state, storage)
