"""Contenders released at once, for the races a port's contract decides."""

from __future__ import annotations

import threading
from collections.abc import Callable


def contend[T](n: int, fn: Callable[[int], T]) -> list[T]:
    """Run fn(0..n-1) in n threads released at once; their results, in any order."""
    barrier = threading.Barrier(n)
    results: list[T] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        barrier.wait()
        try:
            value = fn(i)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread below
            with lock:
                errors.append(e)
            return
        with lock:
            results.append(value)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    assert len(results) == n
    return results
