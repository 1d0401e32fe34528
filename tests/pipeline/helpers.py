"""Polling and inspection helpers shared by the pipeline tests (no sleeps as assertions)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from mldiag.adapters.local.state import SqliteStateStore
from mldiag.bootstrap import LocalRuntime

# make_runtime(**settings): a runtime built by bootstrap on the test's home (see conftest).
MakeRuntime = Callable[..., LocalRuntime]


def wait_until[T](predicate: Callable[[], T], *, timeout: float = 30.0,
                  what: str = "condition", interval: float = 0.02) -> T:
    """Poll `predicate` until it returns something truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


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


def bus_messages(state: SqliteStateStore, topic: str | None = None) -> list[dict[str, Any]]:
    """The rows of the bus's durable queue (the in-process bus keeps them in state.db)."""
    sql = "SELECT id, topic, payload, state, attempts, last_error FROM messages"
    args: tuple[str, ...] = ()
    if topic is not None:
        sql, args = sql + " WHERE topic = ?", (topic,)
    rows = state.connection().execute(sql + " ORDER BY id", args).fetchall()
    keys = ("id", "topic", "payload", "state", "attempts", "last_error")
    out = [dict(zip(keys, r, strict=True)) for r in rows]
    for row in out:
        try:
            row["body"] = json.loads(row["payload"])
        except ValueError:
            row["body"] = None
    return out


def finalized_names(state: SqliteStateStore) -> list[str]:
    """Object names of every finalize event published so far, in order."""
    return [m["body"]["name"] for m in bus_messages(state, "profile-objects")
            if isinstance(m["body"], dict) and "name" in m["body"]]
