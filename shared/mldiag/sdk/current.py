"""The process's current run: the one slot that `run`, `metrics` and `profiler` share.

A leaf: it imports no other SDK module at run time, so that `metrics` reads the current run
without importing `run`, and the SDK's imports point one way (run → metrics → current).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # For the annotations only: `run` imports this module to fill the slot, so importing
    # `run` back at run time would be the circle this module exists to break.
    from mldiag.sdk.run import MLRun

_current: MLRun | None = None
_lock = threading.Lock()


def current_run() -> MLRun | None:
    """The run this process registered last (what `xprof()` and `metrics` use by default)."""
    return _current


def set_current(run: MLRun) -> None:
    """Make `run` the current run."""
    global _current
    with _lock:
        _current = run


def release(run: MLRun) -> None:
    """Empty the slot if `run` is still the current run (a closed run stops being current;
    a newer one stays)."""
    global _current
    with _lock:
        if _current is run:
            _current = None
