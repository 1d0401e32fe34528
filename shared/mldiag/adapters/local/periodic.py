"""A function called every few seconds in a daemon thread: the local stand-in for a scheduler."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Periodic:
    """Calls `fn` every `interval_s` seconds until stopped. A failing pass is logged and the
    next one runs: a watcher or sweeper must outlive one bad pass."""

    def __init__(self, name: str, fn: Callable[[], object], interval_s: float) -> None:
        self.name = name
        self.fn = fn
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.fn()
            except Exception:  # noqa: BLE001 - logged; the next pass retries
                log.exception("%s: pass failed; retrying in %.2f s", self.name, self.interval_s)
            self._stop.wait(self.interval_s)
