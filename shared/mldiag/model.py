"""Domain records: runs, sessions and their hosts, and the session state machine."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mldiag.limits import check_capture_duration

log = logging.getLogger(__name__)

REQUESTED, CAPTURING, CAPTURED = "REQUESTED", "CAPTURING", "CAPTURED"
ANALYZING, INVESTIGATING, REPORTED, FAILED = "ANALYZING", "INVESTIGATING", "REPORTED", "FAILED"
STATES = (REQUESTED, CAPTURING, CAPTURED, ANALYZING, INVESTIGATING, REPORTED, FAILED)
# States in which a session waits on a stage; the sweeper re-queues those stuck too long.
WORKING = (CAPTURED, ANALYZING, INVESTIGATING)
TERMINAL = (REPORTED, FAILED)

_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+=,-]{0,254}$")
XPLANE_SUFFIXES = (".xplane.pb", ".xplane.riegeli")


@dataclass
class RunRecord:
    """One ML workload run. `discovered` runs were created by a file dropped in the bucket."""

    name: str
    run_group: str | None = None
    configs: dict[str, Any] = field(default_factory=dict)
    storage_prefix: str = ""
    on_demand: bool = False
    discovered: bool = False
    created_at: float = 0.0
    # AutoCapturePolicy.to_dict(); empty means the default policy (disabled).
    auto_capture: dict[str, Any] = field(default_factory=dict)
    # The session that alert-triggered sessions are compared with (`runs set-baseline`);
    # empty: the run's most recent OPTIMAL session.
    baseline: str = ""
    # The SDK's `rl_orchestrator` (upstream's RlOrchestrator, e.g. "TUNIX", which Tunix's
    # MldiagHooks sets when training starts); empty: none.
    rl_orchestrator: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def policy(self) -> AutoCapturePolicy:
        return AutoCapturePolicy.from_dict(self.auto_capture)


CAPTURE_KINDS = ("on_demand", "snapshot", "auto")


@dataclass(frozen=True)
class AutoCapturePolicy:
    """What a degradation alert on a run does: capture or not, how, and how often.

    `kind` "auto" takes a snapshot of the continuous ring when continuous profiling is on,
    and an on-demand capture otherwise.
    """

    enabled: bool = False
    kind: str = "auto"
    duration_s: float = 3.0
    cooldown_s: float = 300.0
    max_per_hour: int = 4

    def __post_init__(self) -> None:
        if self.kind not in CAPTURE_KINDS:
            raise ValueError(f"auto-capture kind must be one of {', '.join(CAPTURE_KINDS)}, "
                             f"not {self.kind!r}")
        # The capture an alert starts is a capture: the same limit, the same message.
        check_capture_duration(self.duration_s)
        if self.cooldown_s < 0 or self.max_per_hour < 1:
            raise ValueError("auto-capture cooldown must be >= 0 s and max per hour >= 1")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> AutoCapturePolicy:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in (data or {}).items() if k in known})


PUSH, PULL = "push", "pull"
DELIVERIES = (PUSH, PULL)


@dataclass
class TargetRecord:
    """A profiler endpoint of a run (`host:port`), registered by the SDK inside the workload."""

    run: str
    host: str
    port: int = 9999
    process_index: int = 0
    framework: str = ""
    framework_version: str = ""
    last_heartbeat: float = 0.0
    # OFF | RING (the SDK's portable ring buffer) | NATIVE (xprof continuous profiling, TPU)
    continuous: str = "OFF"
    # When continuous profiling last started on this target (0 while it is OFF).
    continuous_since: float = 0.0
    # Where the capture stage reaches the target; `host` is its name in profile file names.
    address: str = "127.0.0.1"
    # How capture requests reach it: "push", the capture stage connects to its profiler
    # server (a plain `jax.profiler.start_server`); "pull", the mldiag SDK in the workload
    # takes its requests from the state store and uploads itself, so nothing connects in.
    delivery: str = "push"
    # The control endpoint of SDKs from before pull delivery, kept only so that their old
    # records still load: mldiag never connects to it, and stores no token any more.
    control_port: int = 0
    control_token: str = ""
    platform: str = ""  # cpu | gpu | tpu: the JAX backend of the target's devices
    pid: int = 0
    registered_at: float = 0.0
    # The SDK's heartbeat interval: a target whose heartbeat is late by half of it is down.
    heartbeat_s: float = 0.0
    # Why the last control action (continuous start/stop) on this target failed, if it did,
    # and which request that action was (so a CLI waiting on it knows it was handled).
    last_error: str = ""
    last_request: str = ""
    # A plain profiler server's last known liveness, from the background prober
    # (`stages.liveness`): "up" or "down" ("" before its first check), why, and when that
    # check started. Read paths show it with its age; they never connect to the target.
    probe_state: str = ""
    probe_reason: str = ""
    probed_at: float = 0.0

    def problem(self) -> str:
        """Why this record cannot be a target ("" when it can): its host names a file in the
        session's directory, so it must be one safe path segment, and its ports real ports.
        Stores refuse such records on write and skip them on read."""
        try:
            check_name("run", self.run)
            check_name("host", self.host)
        except ValueError as e:
            return str(e)
        for what, port, low in (("port", self.port, 1), ("control_port", self.control_port, 0)):
            if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= 65535:
                return f"bad {what} {port!r} for target {self.host!r}"
        if self.delivery not in DELIVERIES:
            return f"bad delivery {self.delivery!r} for target {self.host!r} (push or pull)"
        return ""

    @property
    def pulls(self) -> bool:
        """Whether the workload takes its own requests (the mldiag SDK)."""
        return self.delivery == PULL

    @property
    def service_addr(self) -> str:
        """The profiler server (gRPC) address for xprof's remote trace API."""
        return f"{self.address}:{self.port}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# What a pull target can be asked to do.
REQUEST_ACTIONS = ("on_demand", "snapshot", "continuous_start", "continuous_stop")
# Requests a target's mailbox holds at most: a workload that takes none is stuck or gone, and
# more would only pile up (the capture stage fails the host with the reason instead).
MAX_PENDING_REQUESTS = 16


@dataclass
class ControlRequest:
    """One request for a pull target, kept in the state store until the workload takes it.

    `on_demand`: trace `duration_s` from `start_at` (epoch seconds); `snapshot`: the newest
    `duration_s` (None: all) of the continuous ring; `continuous_start|stop`: the ring, with
    `options` (window_s, max_bytes, tracer levels). `wait_s` bounds how long a busy profiler
    is waited for. Nobody can take it after `expires_at`; the capture stage then fails the
    host with "no answer".
    """

    id: str
    run: str
    host: str
    action: str
    created_at: float
    expires_at: float
    session: str = ""
    start_at: float = 0.0
    duration_s: float | None = None
    wait_s: float = 0.0
    options: dict[str, Any] = field(default_factory=dict)

    def problem(self) -> str:
        """Why this cannot be a request ("" when it can)."""
        try:
            check_name("run", self.run)
            check_name("host", self.host)
            if self.session:
                check_name("session", self.session)
        except ValueError as e:
            return str(e)
        if not self.id or len(self.id) > 200:
            return f"bad request id {self.id!r}"
        if self.action not in REQUEST_ACTIONS:
            return f"unknown request action {self.action!r} (one of {', '.join(REQUEST_ACTIONS)})"
        if self.action in ("on_demand", "snapshot") and not self.session:
            return f"a {self.action} request needs a session"
        return ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ControlRequest:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


REASON_MAX = 500
# Supersessions a session keeps (a state document has a size limit).
MAX_SUPERSEDED = 20


def short_reason(*reasons: str, limit: int = 4000) -> str:
    """Reasons joined with "; ", each and all bounded (a state document has a size limit)."""
    parts = [r if len(r) <= REASON_MAX else r[: REASON_MAX - 1] + "…" for r in reasons if r]
    out: list[str] = []
    for i, part in enumerate(parts):
        if sum(len(p) + 2 for p in out) + len(part) > limit:
            out.append(f"… and {len(parts) - i} more")
            break
        out.append(part)
    return "; ".join(out)


@dataclass
class HostRecord:
    """One host's xplane in a session."""

    object_name: str
    generation: str
    size: int
    arrived_at: float
    status: str = "ARRIVED"  # ARRIVED | FAILED
    reason: str = ""
    content_hash: str = ""  # as ProfileObjectFinalized carries it; "" when unknown


@dataclass
class SessionRecord:
    """One profile capture of a run, with its hosts and where it is in the state machine."""

    run: str
    session: str
    state: str
    version: int = 1
    kind: str = "programmatic"
    trigger: str = "manual"
    hosts: dict[str, HostRecord] = field(default_factory=dict)
    expected_hosts: list[str] = field(default_factory=list)
    verdict: str | None = None
    reason: str = ""
    report_path: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    last_arrival_at: float = 0.0
    # State name -> time it was last entered, for `sessions describe`.
    timings: dict[str, float] = field(default_factory=dict)
    reported_version: int = 0
    # The last stage finished for this version ("collected:<triage status>", "investigated"),
    # so a redelivered message skips the work and re-publishes what comes next.
    progress: str = ""
    # The capture request or alert that created the session, for idempotent redelivery.
    request_id: str = ""
    # Why the session was captured (an alert's summary), for the report.
    note: str = ""
    # How often the sweeper re-queued this version's work (a stage that crashed or timed out).
    requeues: int = 0
    # The job a programmatic session belongs to, as its processes' SDKs recorded it when they
    # joined (`join`): its process count (0: not known, not a multi-process job) and the
    # processes that capture (`process_index_list`; empty: all of them).
    process_count: int = 0
    process_indices: list[int] = field(default_factory=list)
    # host -> process index of each process that joined the session.
    processes: dict[str, int] = field(default_factory=dict)
    # Versions whose work a later host made moot, oldest first: {"version", "by", "at",
    # "host", "state"} ("v1 superseded by v2 at T, in ANALYZING, when host h arrived").
    superseded: list[dict[str, Any]] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.run}/{self.session}"

    @property
    def dropped(self) -> bool:
        """Nothing asked for this session: no capture request made it and no SDK process
        joined it, its first profile file in the bucket did (a file copied there, or uploaded
        by a workload that did not announce it). Its stored kind is "programmatic"."""
        return (self.kind == "programmatic" and not self.processes and not self.process_count
                and not self.request_id)

    @classmethod
    def arriving(cls, run: str, session: str, now: float,
                 expected_hosts: Sequence[str] = ()) -> SessionRecord:
        """A session created by its first host's arrival."""
        return cls(run=run, session=session, state=CAPTURING, created_at=now,
                   timings={CAPTURING: now}, expected_hosts=list(expected_hosts))

    def add_host(self, host: str, record: HostRecord, now: float) -> bool:
        """Register a host's object; False when nothing changed (this generation is already
        registered, with its content hash if `record` has one).

        A new generation of the bytes already registered (same content hash) only updates
        the generation; the content hash of a generation registered without one is filled in.

        A host arriving after the analysis started (or after the report) starts the next
        version: the current version's hosts are fixed, and the old version's messages stop
        at their version check. Every state store applies this inside its transaction.
        """
        existing = self.hosts.get(host)
        if existing is not None and existing.generation == record.generation:
            if record.content_hash and not existing.content_hash:
                # A later word on the generation registered: its content hash, known now
                # (the local runtime hashes after registering, not before).
                existing.content_hash = record.content_hash
                return True
            return False
        if (existing is not None and existing.status == record.status == "ARRIVED"
                and existing.content_hash and existing.content_hash == record.content_hash):
            # The same bytes again (a `touch`, a re-upload): no new version, nothing to
            # analyse; reads now pin the newest generation of those bytes.
            existing.generation = record.generation
            return True
        self.hosts[host] = record
        self.last_arrival_at = now
        if self.state == REQUESTED:
            self.state = CAPTURING
            self.timings[CAPTURING] = now
        elif self.state != CAPTURING:
            # The old version's stages stop at their next check (stages.sessions.current,
            # stages.supersede); this says when and why.
            self.superseded = [*self.superseded, {
                "version": self.version, "by": self.version + 1, "at": now, "host": host,
                "state": self.state}][-MAX_SUPERSEDED:]
            self.version += 1
            self.state, self.reason, self.verdict, self.progress = CAPTURING, "", None, ""
            self.report_path = ""  # the old version's report stays at analysis/v<n>/
            self.timings[CAPTURING] = now
        self.updated_at = now
        return True

    def move(self, to: str, now: float, *, expect: Sequence[str] | None = None,
             version: int | None = None, **fields: Any) -> bool:
        """Go to state `to` (setting `fields`) if in one of `expect` and at `version`."""
        if expect is not None and self.state not in expect:
            return False
        if version is not None and self.version != version:
            return False
        before = self.state
        self.state = to
        for k, v in fields.items():
            setattr(self, k, v)
        if before != to:
            # When the state was entered: progress updates and the sweeper's touch keep it.
            self.timings[to] = now
        self.updated_at = now
        if to == REPORTED:
            self.reported_version = self.version
        return True

    def join(self, host: str, process_index: int, process_count: int,
             process_indices: Sequence[int] = ()) -> bool:
        """Record that process `process_index` of a job of `process_count` processes captures
        into this session as `host`; False when nothing changed.

        The first process that joins sets the job's process count and the processes that
        capture (a later one's differing view is logged, not taken: the session has one
        job). A process may join at any time, before or after its host's profile arrived,
        also after the analysis started: joining starts no version (its profile does).
        """
        changed = False
        if process_count > 0 and not self.process_count:
            self.process_count = process_count
            self.process_indices = sorted(set(process_indices))
            changed = True
        elif process_count and (process_count != self.process_count or (
                sorted(set(process_indices)) != self.process_indices)):
            log.warning("session %s: host %s joined as one of %d processes %s; the session "
                        "keeps %d %s", self.key, host, process_count, list(process_indices),
                        self.process_count, self.process_indices)
        if self.processes.get(host) != process_index:
            self.processes = {**self.processes, host: process_index}
            changed = True
        return changed

    @property
    def expected_count(self) -> int:
        """How many processes of the job capture (0: the session does not know its job)."""
        return len(self.process_indices) if self.process_indices else self.process_count

    def missing_processes(self) -> list[int]:
        """The process indices of the job that capture and have not joined the session."""
        wanted = self.process_indices or list(range(self.process_count))
        return sorted(set(wanted) - set(self.processes.values()))

    def expects(self) -> bool:
        """Whether the session knows which hosts make it whole (a capture's targets, or the
        job's processes); otherwise the settle window decides."""
        return bool(self.expected_hosts) or self.expected_count > 0

    def complete(self) -> bool:
        """Every host the session expects has arrived (or failed): the capture's expected
        hosts, and with a known job, each process that joined and as many hosts as the job
        has processes that capture. False when nothing is expected: the settle window
        decides."""
        if not self.expects():
            return False
        present = set(self.hosts)
        if not set(self.expected_hosts) <= present:
            return False
        if self.expected_count:
            return set(self.processes) <= present and len(present) >= self.expected_count
        return True

    def hopeless(self) -> bool:
        """No host's profile arrived and none can any more: every host it expects failed."""
        if any(r.status == "ARRIVED" for r in self.hosts.values()):
            return False
        return self.complete() if self.expects() else bool(self.hosts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SessionRecord:
        """A stored session: records written before a field existed get its default, and
        fields a newer writer added are ignored (old and new code share one store while a
        deployment rolls)."""
        known = cls.__dataclass_fields__
        host_fields = HostRecord.__dataclass_fields__
        hosts = {h: HostRecord(**{k: x for k, x in v.items() if k in host_fields})
                 for h, v in (data.get("hosts") or {}).items()}
        return cls(**{**{k: v for k, v in data.items() if k in known}, "hosts": hosts})


@dataclass(frozen=True)
class ProfileObjectName:
    """`<prefix>/<run>/plugins/profile/<session>/<host>.xplane.pb`, parsed and validated."""

    prefix: str
    run: str
    session: str
    host: str
    suffix: str

    @property
    def session_dir(self) -> str:
        parts = [p for p in (self.prefix, self.run, "plugins", "profile", self.session) if p]
        return "/".join(parts)

    @property
    def analysis_dir(self) -> str:
        return f"{self.session_dir}/analysis"


def usable_targets(records: Iterable[TargetRecord]) -> list[TargetRecord]:
    """The records that can be targets; the others (written around the store's check) are
    skipped with a warning rather than failing every capture of their run."""
    out = []
    for t in records:
        why = t.problem()
        if why:
            log.warning("ignoring target record of run %r: %s", t.run, why)
        else:
            out.append(t)
    return out


def check_name(kind: str, value: str) -> str:
    """A run, session or host name usable as one path segment; ValueError otherwise."""
    if not isinstance(value, str) or value in (".", "..") or not _SEGMENT.match(value):
        raise ValueError(f"bad {kind} name {value!r}: use letters, digits and ._:@+=,- "
                         "(at most 255, not starting with a symbol)")
    if kind == "run" and value in RESERVED_RUN_NAMES:
        raise ValueError(f"bad run name {value!r}: reserved for the viewer caches' prefix "
                         "(the bucket's lifecycle deletes what is under it)")
    return value


# Top-level bucket prefixes that are mldiag's own, never a run (viewer_cache.CACHE_ROOT).
RESERVED_RUN_NAMES = frozenset({"xprof-cache"})


def session_dir(prefix: str, run: str, session: str) -> str:
    """`<prefix>/<run>/plugins/profile/<session>`, the logdir layout XProf reads."""
    return "/".join(p for p in (prefix.strip("/"), run, "plugins", "profile", session) if p)


def parse_object_name(name: str) -> ProfileObjectName | None:
    """The profile an object name denotes, or None for any other object (artifacts, junk).

    Whatever lies under a session's `analysis/` is ours, never an upload: the viewer's cache
    keeps a windowed host's windows there in XProf's own layout
    (`analysis/xprof_cache/<key>/plugins/profile/<session>/<host>.window00.xplane.pb`), and
    taking them for a new session would analyse them, cache them again, and so on forever.

    Raises ValueError for names that try path tricks ("..", empty or odd segments).
    """
    if not name.endswith(XPLANE_SUFFIXES):
        return None
    parts = name.split("/")
    if len(parts) < 5 or parts[-4:-2] != ["plugins", "profile"]:
        return None
    if any(parts[i:i + 2] == ["plugins", "profile"] and parts[i + 3] == "analysis"
           for i in range(len(parts) - 5)):
        return None
    for p in parts:
        if p in ("", ".", "..") or not _SEGMENT.match(p):
            raise ValueError(f"unsafe object name {name!r}: bad path segment {p!r}")
    filename = parts[-1]
    suffix = next(s for s in XPLANE_SUFFIXES if filename.endswith(s))
    host = filename[: -len(suffix)]
    if not host:
        raise ValueError(f"unsafe object name {name!r}: empty host name")
    if parts[-5] in RESERVED_RUN_NAMES:
        raise ValueError(f"object name {name!r}: {parts[-5]} is the viewer caches' prefix, "
                         "not a run (the bucket's lifecycle deletes what is under it)")
    return ProfileObjectName(prefix="/".join(parts[:-5]), run=parts[-5], session=parts[-2],
                             host=host, suffix=suffix)


def misplaced_profile(name: str) -> str:
    """Why an xplane that `parse_object_name` does not take is not analysed, and where it
    belongs. The common slip is `cp -r LOGDIR/plugins <run>/` into a run folder that does not
    exist yet: cp then copies the folder's contents, so the file lands at
    `<run>/profile/<session>/<host>.xplane.pb`."""
    parts = name.split("/")
    layout = "<run>/plugins/profile/<session>/<host>.xplane.pb"
    if len(parts) >= 4 and parts[-3] == "profile" and parts[-4] != "plugins":
        right = "/".join([*parts[:-3], "plugins", *parts[-3:]])
        run = parts[-4]
        return (f"{name} lacks the plugins/ level (what `cp -r LOGDIR/plugins {run}/` does "
                f"when {run}/ does not exist yet): move it to {right}, or copy the logdir "
                f"with `mldiag add LOGDIR --run {run}`")
    if len(parts) == 3:
        right = "/".join([parts[0], "plugins", "profile", *parts[1:]])
        return (f"{name} is not in a session directory: a profile is analysed at {layout}; "
                f"move it to {right}, or copy it with `mldiag add FILE --run {parts[0]}`")
    return (f"{name} is not in a session directory: a profile is analysed at {layout} (move "
            "it there, or copy its logdir with `mldiag add LOGDIR --run RUN`)")


@dataclass(frozen=True)
class MetricPoint:
    """One value a workload recorded with `metrics.record`, kept per run in the state store.

    A number has `value`; a str or dict recorded as a metric (upstream's log entries) has
    `body` and no value. `labels` carry the unit (`unit`) like upstream's.
    """

    name: str
    at: float
    value: float | None = None
    step: int | None = None
    host: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    body: str | dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        # By hand: asdict's deep copy is most of the cost of storing a point.
        return {"name": self.name, "at": self.at, "value": self.value, "step": self.step,
                "host": self.host, "labels": dict(self.labels), "body": self.body}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetricPoint:
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})


def summarize_metrics(points: Sequence[MetricPoint]) -> list[dict[str, Any]]:
    """One row per metric name, by name: unit, points, hosts, step range, last value and
    when it was recorded (what `mldiag metrics list` and the console's run page show)."""
    rows: dict[str, dict[str, Any]] = {}
    for p in points:
        row = rows.setdefault(p.name, {"name": p.name, "unit": p.labels.get("unit", "1"),
                                       "points": 0, "hosts": set(), "first_step": None,
                                       "last_step": None, "first_at": p.at})
        row["points"] += 1
        row["hosts"].add(p.host)
        if p.step is not None:
            first, last = row["first_step"], row["last_step"]
            row["first_step"] = p.step if first is None else min(first, p.step)
            row["last_step"] = p.step if last is None else max(last, p.step)
        row["last_at"] = p.at
        row["last_value"] = p.value if p.value is not None else p.body
    return [{**r, "hosts": sorted(r["hosts"])} for _, r in sorted(rows.items())]


def newest_points(chunks: Iterable[tuple[float, list[dict[str, Any]]]], since: float,
                  limit: int | None) -> list[MetricPoint]:
    """The points of metric chunks read newest first (by their last time, `t1`), oldest
    first; with `limit`, the newest `limit`, reading no chunk that cannot hold one of them."""
    points: list[MetricPoint] = []
    for t1, chunk in chunks:
        if limit is not None and len(points) >= limit:
            points.sort(key=lambda p: p.at)
            del points[:-limit]
            if t1 <= points[0].at:
                break  # this chunk and every later one hold only older points
        points.extend(p for p in map(MetricPoint.from_dict, chunk) if p.at > since)
    points.sort(key=lambda p: p.at)
    return points[-limit:] if limit is not None else points
