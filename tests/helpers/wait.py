"""One way to wait in a test: poll a condition until a deadline, never a fixed sleep.

A test that means "nothing else happened" waits here for a positive sign that the system has
done its work (a later message processed, the bus drained, a state reached), then asserts
the absence.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until[T](condition: Callable[[], T], *, timeout: float = 30.0,
                  what: str | Callable[[], str] = "the condition",
                  interval: float = 0.02) -> T:
    """Poll `condition` until it returns something truthy, and return that value.

    After `timeout` seconds, fail naming `what`; a callable `what` is asked then, so the
    message can say the state it found.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g} s waiting for {said}")
        time.sleep(interval)
