"""Settings: one frozen object, built from the environment; explicit arguments win."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

GIB = 1024**3


@dataclass(frozen=True)
class Settings:
    """Everything the bootstrap needs to build the services.

    Environment variables (all optional): MLDIAG_HOME, MLDIAG_SETTLE_S, MLDIAG_SETTLE_MAX_S,
    MLDIAG_STABILITY_S,
    MLDIAG_MAX_HOST_BYTES, MLDIAG_MAX_SESSION_BYTES, MLDIAG_MAX_ATTEMPTS, MLDIAG_RETRY_BACKOFF_S,
    MLDIAG_STUCK_AFTER_S, MLDIAG_RESCAN_INTERVAL_S, MLDIAG_RESCAN_WINDOW_S, MLDIAG_LEASE_S,
    MLDIAG_WORKERS, MLDIAG_POLL_S, MLDIAG_BACKEND,
    MLDIAG_PROJECT, MLDIAG_BUCKET, MLDIAG_LOCATION, MLDIAG_TOPIC_PREFIX,
    MLDIAG_FIRESTORE_DATABASE, MLDIAG_INVESTIGATOR,
    MLDIAG_GEMINI_MODEL, MLDIAG_GEMINI_TIMEOUT_S, MLDIAG_TARGET_STALE_S, MLDIAG_MEMORY_BUDGET,
    MLDIAG_TOOL_TIMEOUT_S, MLDIAG_FANOUT_MIN_HOSTS, MLDIAG_FANOUT_MIN_BYTES,
    MLDIAG_FUNCTION_MAX_HOST_BYTES, MLDIAG_FUNCTION_MAX_HOSTS, MLDIAG_IN_JOB, MLDIAG_COLLECT_JOB,
    MLDIAG_CONSOLE_HOST, MLDIAG_CONSOLE_PORT, MLDIAG_CONSOLE_AUTH, MLDIAG_IAP_AUDIENCE,
    MLDIAG_IAP_CERTS_URL, MLDIAG_ID_TOKEN_AUDIENCE, MLDIAG_CONSOLE_SECRET, MLDIAG_PUBLIC_URL,
    MLDIAG_VIEWER_CACHE_DIR, MLDIAG_VIEWER_KEEP, MLDIAG_PREBUILD_VIEWER,
    MLDIAG_CAPTURE_ALLOWED_NETWORKS, MLDIAG_CAPTURE_ALLOWED_PORTS, MLDIAG_CAPTURE_ALLOW_LOOPBACK,
    MLDIAG_REGISTRATION_URL, MLDIAG_ID_TOKEN_CERTS_URL, MLDIAG_PULL_ANSWER_S, MLDIAG_PULL_POLL_S,
    MLDIAG_MAX_TARGETS_PER_RUN, MLDIAG_PROBE_INTERVAL_S, MLDIAG_PROBE_TIMEOUT_S,
    MLDIAG_PROBE_WORKERS, MLDIAG_PROBE_PER_RUN.
    """

    home: Path = Path(".mldiag")
    # A session that knows which hosts make it whole (a capture's targets, or the job's
    # processes that its SDKs recorded) is analysed when they all arrived, or after
    # stuck_after_s with the hosts that came. One that does not know (a dropped file, a
    # trace without the SDK) settles: it waits, after its last arrival, settle_s or twice
    # the longest gap between two of its arrivals so far, whichever is longer, at most
    # settle_max_s; and while a profile in its directory is not registered at the bucket's
    # generation (locally: a file still being written or copied; on GCS: an object whose
    # finalize event is on its way), up to stuck_after_s (stages.maintenance.settled).
    settle_s: float = 2.0
    settle_max_s: float = 60.0
    # A dropped file must keep its size and mtime this long before it counts as written. A
    # writer that pauses longer gets a FAILED first version, and its finished file (a new
    # generation) a second version, so the window trades latency, not correctness.
    stability_s: float = 0.2
    # Per host and per session; mldiag.limits caps both (settings may lower them only).
    max_host_bytes: int = 2 * GIB
    max_session_bytes: int = 64 * GIB
    max_attempts: int = 5
    retry_backoff_s: float = 0.5
    # A session in a working state for longer than this is re-queued by the sweeper.
    stuck_after_s: float = 600.0
    # How often the sweeper lists the bucket for profiles no finalize event registered, and
    # how far back it looks (Eventarc retries an event for 24 h); 0 turns the rescan off.
    rescan_interval_s: float = 3600.0
    rescan_window_s: float = 2 * 86400.0
    # How long a stage's claim holds before another delivery may take over.
    lease_s: float = 300.0
    workers: int = 2
    poll_s: float = 0.1
    # Which adapters the bootstrap builds: "local" (directory, SQLite, in-process bus) or
    # "gcp" (GCS, Firestore, Pub/Sub; needs the `gcp` extra).
    backend: str = "local"
    project: str = ""
    bucket: str = ""
    location: str = "us-central1"
    # Deployed topic names are `<topic_prefix><topic>` (e.g. mldiag-analysis-requests).
    topic_prefix: str = "mldiag-"
    firestore_database: str = "(default)"
    # "rule-based" or "gemini" (Vertex AI through google-genai; falls back to rule-based).
    investigator: str = "rule-based"
    gemini_model: str = "gemini-2.5-flash"
    gemini_timeout_s: float = 60.0
    # A target whose heartbeat is older than this is reported as down.
    target_stale_s: float = 60.0
    # Push targets a run may hold (registering one more is refused with this cap named).
    max_targets_per_run: int = 256
    # The background prober (`stages.liveness`): how often a plain profiler server is checked,
    # how long one check may take (every answer but a profiler's takes exactly this long),
    # and how many checks run at once, in all and per run.
    probe_interval_s: float = 30.0
    probe_timeout_s: float = 1.0
    probe_workers: int = 8
    probe_per_run: int = 2
    # How long a capture waits for a target's profiler that another session holds.
    capture_wait_s: float = 120.0
    # Pull targets (the mldiag SDK): how long the capture stage waits, past the end of the
    # capture, for the workload's answer before it fails the host with "no answer"; and how
    # often the SDK looks for requests.
    pull_answer_s: float = 60.0
    pull_poll_s: float = 1.0
    # Collection's memory budget (bytes, or "6G"/"512M"); empty: what the cgroup or host
    # allows. Jobs that would exceed it wait, are skipped, or are stopped (see workers.py).
    memory_budget: str = ""
    # Each collection job's deadline; past it, its worker process is killed.
    tool_timeout_s: float = 300.0
    # A session fans out, one `collect_host` per host, then one combine step, when it has at
    # least this many hosts, or several hosts and at least fanout_min_bytes in all.
    fanout_min_hosts: int = 8
    fanout_min_bytes: int = 512 * 1024**2
    # What one collect function instance takes on (0: no limit). A session over either goes
    # to the collect job (a Cloud Run job on GCP) that runs the same stage code.
    function_max_host_bytes: int = 0
    function_max_hosts: int = 0
    # Set in the collect job itself: it never hands a session on again.
    in_job: bool = False
    # The collect job: a Cloud Run job name on GCP, "local" for a separate local process;
    # empty: a session over the function limits is FAILED with the reason.
    collect_job: str = ""
    # How many tasks the collect job runs: a large host's time windows are shared by them
    # (analysis/collection/hosts/window_tasks.py). On GCP the job's task count (Cloud Run's
    # CLOUD_RUN_TASK_COUNT, terraform's collect_job_tasks); locally, how many processes the
    # local job runner starts.
    collect_job_tasks: int = 1
    # In the collect job: this task's index (Cloud Run's CLOUD_RUN_TASK_INDEX).
    job_task: int = 0
    # A single host over window_min_bytes is converted in time windows of at most
    # window_bytes (0: the defaults, 256 MiB and 128 MiB; analysis/collection/plan.py).
    window_min_bytes: int = 0
    window_bytes: int = 0
    # The console. Locally it binds loopback only; on Cloud Run `--host 0.0.0.0 --port $PORT`.
    console_host: str = "127.0.0.1"
    console_port: int = 8790
    # How callers sign in: "token" (mldiag tokens, the local login URL) or "iap" (the IAP
    # JWT, or a Google ID token for API calls; mldiag tokens work too).
    console_auth: str = "token"
    iap_audience: str = ""
    iap_certs_url: str = "https://www.gstatic.com/iap/verify/public_key-jwk"
    id_token_audience: str = ""
    # Keys the CSRF tokens of signed-in browsers; empty: a random key kept in MLDIAG_HOME.
    console_secret: str = ""
    # The console's address as users reach it, for the links the CLI prints.
    public_url: str = ""
    # Where the console keeps session workspaces (xplanes and XProf caches); LRU of
    # viewer_keep sessions.
    viewer_cache_dir: str = ""
    viewer_keep: int = 8
    # Build each REPORTED session's viewer caches in the pipeline (the prebuild_viewer stage).
    prebuild_viewer: bool = True
    # The memory the viewer prebuild may use (bytes, or "14G"); empty: memory_budget. A
    # session whose prebuild needs more goes to the collect job, which sets its own (its
    # container's memory: no collection workers run beside a prebuild); over that, its large
    # hosts are viewed in time windows. In the console: the most one conversion may take
    # (empty: memory_budget, else the container's); more is refused with a 503.
    viewer_memory_budget: str = ""
    # The time the viewer prebuild may take, in seconds (0: no limit): the collect job sets
    # its task's deadline. A prebuild estimated over it is skipped with the reason
    # (`viewer_prebuild.VIEW_SECONDS_PER_BYTE`), instead of being killed at the deadline.
    viewer_deadline_s: float = 0.0
    # Where the capture stage may connect (target records are workload-written data):
    # comma-separated CIDRs (default: the private ranges), ports ("a-b,c"), and whether
    # loopback is allowed ("auto": only with the local backend).
    capture_allowed_networks: str = ""
    capture_allowed_ports: str = "1024-65535"
    capture_allow_loopback: str = "auto"
    # The `register` function (mldiag.registration) that GCP workloads call instead of writing
    # Firestore and the bucket; its URL is also the audience of their ID tokens. Set in the
    # workloads (the SDK then goes through it) and on the function itself.
    registration_url: str = ""
    # Where Google's ID-token signing keys are published (a JWK set).
    id_token_certs_url: str = "https://www.googleapis.com/oauth2/v3/certs"

    def to_env(self) -> dict[str, str]:
        """These settings as MLDIAG_* variables, for a process that builds its own."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f"MLDIAG_{f.name.upper()}"] = ("1" if value else "0") if isinstance(
                value, bool) else str(value)
        return out

    @property
    def memory_budget_bytes(self) -> int | None:
        if not self.memory_budget:
            return None
        from mldiag.analysis import parse_bytes

        return parse_bytes(self.memory_budget)

    @property
    def viewer_memory_budget_bytes(self) -> int | None:
        if not self.viewer_memory_budget:
            return self.memory_budget_bytes
        from mldiag.analysis import parse_bytes

        return parse_bytes(self.viewer_memory_budget)

    @property
    def console_url(self) -> str:
        return (self.public_url or f"http://{self.console_host}:{self.console_port}").rstrip("/")

    @property
    def viewer_cache(self) -> Path:
        return Path(self.viewer_cache_dir) if self.viewer_cache_dir else self.home / "viewer"

    @property
    def bucket_dir(self) -> Path:
        return self.home / "bucket"

    @property
    def state_db(self) -> Path:
        return self.home / "state.db"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> Settings:
        """Read MLDIAG_* variables; keyword arguments override them."""
        env = dict(os.environ) if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"MLDIAG_{f.name.upper()}")
            if raw is None or raw == "":
                continue
            kind = type(getattr(cls, f.name)) if hasattr(cls, f.name) else str
            try:
                if kind is bool:
                    values[f.name] = raw.strip().lower() in ("1", "true", "yes")
                    continue
                values[f.name] = Path(raw) if f.name == "home" else kind(raw)
            except ValueError as e:
                raise ValueError(f"MLDIAG_{f.name.upper()}={raw!r}: {e}") from e
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "home" in values:
            values["home"] = Path(values["home"])
        settings = replace(cls(), **values)
        from mldiag import limits

        for name, top in (("max_host_bytes", limits.MAX_HOST_BYTES),
                          ("max_session_bytes", limits.MAX_SESSION_BYTES)):
            if not 0 < getattr(settings, name) <= top:
                raise ValueError(f"MLDIAG_{name.upper()}={getattr(settings, name)}: must be "
                                 f"in (0, {top}] bytes (mldiag.limits)")
        try:
            settings.memory_budget_bytes  # noqa: B018 - a bad size fails here, with its name
        except ValueError as e:
            raise ValueError(f"MLDIAG_MEMORY_BUDGET={settings.memory_budget!r}: {e}") from e
        try:
            settings.viewer_memory_budget_bytes  # noqa: B018
        except ValueError as e:
            raise ValueError(
                f"MLDIAG_VIEWER_MEMORY_BUDGET={settings.viewer_memory_budget!r}: {e}") from e
        return settings
