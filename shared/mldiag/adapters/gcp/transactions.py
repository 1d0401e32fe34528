"""Read-modify-writes of one Firestore document that survive contention.

The Firestore stores (state, access) run every read-modify-write through one
`DocumentTransactions`, so the way they queue, retry and give up is written once.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from google.cloud import firestore

T = TypeVar("T")

# Rounds of (client retries, then a jittered backoff) before a contended transaction fails.
CONTENDED_ROUNDS = 10


class DocumentTransactions:
    """Runs transactions on Firestore documents for one store instance; thread-safe.

    Contenders in this process queue on a lock per document (one of `stripes` locks, picked
    by the document's path) first: the client retries an aborted transaction only after a
    backoff that starts at about a second, so threads of one instance (a Cloud Function
    serving concurrent requests) would otherwise abort each other and sleep. The
    transaction still guards against other instances.
    """

    def __init__(self, stripes: int) -> None:
        self._locks = [threading.Lock() for _ in range(stripes)]

    def run(self, client: firestore.Client, ref: Any, fn: Callable[[Any], T], *,
            max_attempts: int) -> T:
        """Run `fn(transaction)`, a read-modify-write of `ref`, in a transaction of `client`
        that the client tries up to `max_attempts` times per round."""
        with self._locks[hash(ref.path) % len(self._locks)]:
            for attempt in range(CONTENDED_ROUNDS):
                transaction = client.transaction(max_attempts=max_attempts)
                try:
                    result: T = firestore.transactional(fn)(transaction)
                    return result
                except ValueError as e:
                    # The client retries an aborted commit at once, keeping its place in line;
                    # under heavy contention from other instances (a hot document) all its
                    # attempts can abort. Back off with jitter and try again before giving
                    # up, which would make the whole delivery be retried.
                    if "Failed to commit transaction" not in str(e) or (
                            attempt == CONTENDED_ROUNDS - 1):
                        raise
                    time.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")
