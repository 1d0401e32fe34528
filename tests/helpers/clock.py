"""A fake clock: time moves when the test says so, not after a sleep."""

from __future__ import annotations

import threading
import time


class SkewedClock:
    """Wall time plus an offset the test moves forward, to cross windows and deadlines
    (settle, stuck-after) at a moment it chooses rather than after a sleep."""

    def __init__(self) -> None:
        self._offset = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return time.time() + self._offset

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._offset += seconds
