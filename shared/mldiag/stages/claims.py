"""Idempotency claims around a stage's work, and the keep-alive that renews a long one.

A claim keyed by the event (or by session and version) makes duplicates no-ops; it is released
when the work raises, so a redelivery can take it, and completed when the work ends.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from mldiag.stages.services import Services

log = logging.getLogger(__name__)


@contextmanager
def claimed(services: Services, key: str, *, lease_s: float | None = None,
            keep_alive: Callable[[float], object] | None = None) -> Iterator[bool]:
    """Hold the idempotency claim `key` around a stage's work; yields whether this delivery
    got it (False: a duplicate, or another delivery is on it, so do nothing).

    The claim is released if the work raises, so a redelivery can take it, and completed
    when the work ends (returning early included), so later duplicates stop at once.

    With `keep_alive(now)` (which touches the session), long work renews its claim and
    touches its session every third of a lease while it runs: a collection that takes longer
    than a lease, or than the sweeper's deadline (the collect job runs up to an hour), is not
    taken over by a redelivery or started again; one that dies stops renewing, and is.
    """
    lease = services.settings.lease_s if lease_s is None else lease_s
    if not services.state.claim(key, services.owner, lease, services.clock()):
        yield False
        return
    beat = _KeepAlive(services, key, lease, keep_alive) if keep_alive is not None else None
    try:
        yield True
    except BaseException:
        if beat is not None:
            beat.stop()
        services.state.release(key, services.owner)
        raise
    if beat is not None:
        beat.stop()
    services.state.complete(key, services.owner)


class _KeepAlive:
    """A daemon thread that renews a claim and touches its session until stopped."""

    def __init__(self, services: Services, key: str, lease_s: float,
                 touch: Callable[[float], object]) -> None:
        self._stopped = threading.Event()
        every = max(0.05, lease_s / 3)

        def run() -> None:
            while not self._stopped.wait(every):
                try:
                    now = services.clock()
                    if not services.state.renew(key, services.owner, lease_s, now):
                        log.warning("claim %s was taken over while its work ran", key)
                        return
                    touch(now)
                except Exception:  # noqa: BLE001 - a missed beat only shortens the lease
                    log.warning("could not renew claim %s", key, exc_info=True)

        self._thread = threading.Thread(target=run, name=f"keep-alive {key}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=30)


def toucher(services: Services, run: str, session: str, version: int,
            state: str) -> Callable[[float], object]:
    """keep_alive for `claimed`: mark the session as moving while its stage works on it."""
    def touch(now: float) -> object:
        return services.state.transition(run, session, state, expect=[state], version=version,
                                         now=now)

    return touch
