"""StoredWindows: the collect job's tasks meet through the state store's claims and the
bucket (`window_tasks.WindowExchange` on the pipeline's own ports).

A window is claimed as `window:<run>/<session>#v<n>/<k>of<K>`, renewed by this task while it
holds it, and published as `<analysis>/v<n>/windows/window<k>.op_stats.pb` and then
`window<k>.json` (its presence is what says the window is done); the claim is then completed,
so nobody builds it again. A task that dies stops renewing: the claim lapses after `lease_s`
and task 0 takes the window over.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mldiag.analysis import default_budget_bytes, window_count
from mldiag.model import SessionRecord
from mldiag.stages.services import Services

log = logging.getLogger(__name__)

# How long a window's claim holds without renewal: how long task 0 waits before it builds
# the window of a task that died (a window takes 10-20 s to build).
WINDOW_LEASE_S = 60.0


class StoredWindows:
    """`WindowExchange` for task `task` of the collect job, on one session version."""

    def __init__(self, services: Services, *, prefix: str, claim_base: str, windows: int,
                 task: int, lease_s: float = WINDOW_LEASE_S) -> None:
        self.task = task
        self._services = services
        self._prefix = prefix.rstrip("/")
        self._claim_base = claim_base
        self._windows = windows
        self._lease = lease_s
        self._held: set[int] = set()
        self._metas: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._beat: threading.Thread | None = None

    def _key(self, window: int) -> str:
        return f"{self._claim_base}/{window}of{self._windows}"

    def _name(self, window: int, suffix: str) -> str:
        return f"{self._prefix}/window{window}.{suffix}"

    def take(self, window: int) -> bool:
        if self._meta(window) is not None:
            return False
        state, clock = self._services.state, self._services.clock
        if not state.claim(self._key(window), self._services.owner, self._lease, clock()):
            return False
        with self._lock:
            self._held.add(window)
        self._keep_renewing()
        return True

    def give_up(self, window: int) -> None:
        with self._lock:
            if window not in self._held:
                return
            self._held.discard(window)
        self._services.state.release(self._key(window), self._services.owner)

    def publish(self, window: int, meta: Mapping[str, Any], op_stats: Path | None) -> None:
        storage = self._services.storage
        if op_stats is not None:
            storage.put_file(self._name(window, "op_stats.pb"), op_stats,
                             content_type="application/octet-stream")
        storage.write_bytes(self._name(window, "json"), json.dumps(dict(meta)).encode(),
                            content_type="application/json")
        with self._lock:
            self._held.discard(window)
        self._services.state.complete(self._key(window), self._services.owner)

    def published(self) -> dict[int, dict[str, Any]]:
        for info in self._services.storage.list(f"{self._prefix}/"):
            name = info.name.rsplit("/", 1)[-1]
            if not (name.startswith("window") and name.endswith(".json")):
                continue
            try:
                window = int(name[len("window"):-len(".json")])
            except ValueError:
                continue
            self._meta(window, listed=True)
        return dict(self._metas)

    def _meta(self, window: int, listed: bool = False) -> dict[str, Any] | None:
        if window in self._metas:
            return self._metas[window]
        storage = self._services.storage
        name = self._name(window, "json")
        if not listed and storage.stat(name) is None:
            return None
        try:
            meta = json.loads(storage.read_bytes(name))
        except (FileNotFoundError, ValueError):
            return None
        if isinstance(meta, dict):
            self._metas[window] = meta
            return meta
        return None

    def fetch(self, window: int, dest: Path) -> None:
        self._services.storage.fetch_to(self._name(window, "op_stats.pb"), dest)

    def held(self) -> list[int]:
        with self._lock:
            return sorted(self._held)

    def close(self) -> None:
        """Stop renewing, and let every window still held go (for another task to take)."""
        self._stopped.set()
        if self._beat is not None:
            self._beat.join(timeout=30)
        for window in self.held():
            self.give_up(window)

    def _keep_renewing(self) -> None:
        if self._beat is not None:
            return
        services = self._services

        def run() -> None:
            while not self._stopped.wait(self._lease / 3):
                for window in self.held():
                    try:
                        if not services.state.renew(self._key(window), services.owner,
                                                    self._lease, services.clock()):
                            log.warning("window %d's claim was taken over", window)
                            with self._lock:
                                self._held.discard(window)
                    except Exception:  # noqa: BLE001 - a missed beat only shortens the lease
                        log.warning("could not renew window %d's claim", window, exc_info=True)

        self._beat = threading.Thread(target=run, name="window claims", daemon=True)
        self._beat.start()


def window_count_of(services: Services, s: SessionRecord) -> int:
    """How many time windows collect cuts the session's host in (1: none, or many hosts):
    from the session's record alone, so every task of the collect job counts the same before
    it has the file."""
    arrived = [r for r in s.hosts.values() if r.status == "ARRIVED"]
    if len(arrived) != 1:
        return 1
    settings = services.settings
    return window_count(arrived[0].size, settings.memory_budget_bytes or default_budget_bytes(),
                        min_bytes=settings.window_min_bytes or None,
                        window_bytes=settings.window_bytes or None)


def window_exchange(services: Services, s: SessionRecord, analysis_dir: str
                    ) -> StoredWindows | None:
    """Where a large host's windows are shared, in a collect job of several tasks (None
    otherwise: one process converts them all). `analysis_dir` is the session's."""
    settings = services.settings
    windows = window_count_of(services, s)
    if not settings.in_job or settings.collect_job_tasks < 2 or windows < 2:
        return None
    return StoredWindows(services, prefix=f"{analysis_dir}/v{s.version}/windows",
                         claim_base=f"window:{s.run}/{s.session}#v{s.version}",
                         windows=windows, task=settings.job_task)
