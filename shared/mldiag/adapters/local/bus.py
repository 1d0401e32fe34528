"""InProcessBus: topics served by worker threads, at-least-once, persisted in SQLite.

Every published message is a row in `state.db` before `publish` returns, so a crash loses
nothing: on restart, messages that were in flight go back to pending and are delivered again.
A handler that raises is retried with exponential backoff up to `max_attempts`, then the message
is dead-lettered with the reason. A `PoisonMessage` is dead-lettered at once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from mldiag.adapters.local.state import SqliteStateStore
from mldiag.errors import PoisonMessage
from mldiag.messages import Message, topic_of

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, payload TEXT NOT NULL,
    attributes TEXT NOT NULL DEFAULT '{}', state TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0, available_at REAL NOT NULL, last_error TEXT,
    created_at REAL NOT NULL, finished_at REAL);
CREATE INDEX IF NOT EXISTS messages_ready ON messages (state, available_at);
"""

Dispatch = Callable[[str, str, Mapping[str, str]], None]
# Told about every dead letter: (topic, payload, reason).
DeadLetterFn = Callable[[str, str, str], None]


class InProcessBus:
    """The embedded bus. `publish` is durable; `start` runs the delivery workers."""

    def __init__(
        self,
        store: SqliteStateStore,
        *,
        max_attempts: int = 5,
        backoff_s: float = 0.5,
        workers: int = 2,
        poll_s: float = 0.1,
        clock: Callable[[], float] = time.time,
        on_dead: DeadLetterFn | None = None,
        priorities: Mapping[str, int] | None = None,
    ) -> None:
        self._store = store
        self.on_dead = on_dead
        # Topics with a lower number are delivered first; within one, oldest first.
        self._order = ""
        self._order_args: tuple[Any, ...] = ()
        if priorities:
            cases = " ".join("WHEN ? THEN ?" for _ in priorities)
            self._order = f"CASE topic {cases} ELSE {max(priorities.values()) + 1} END, "
            self._order_args = tuple(x for kv in priorities.items() for x in kv)
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.workers = workers
        self.poll_s = poll_s
        self._clock = clock
        self._stop = threading.Event()
        self._wake = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._dispatch: Dispatch | None = None
        store.executescript(_SCHEMA)

    def publish(self, message: Message, attributes: Mapping[str, str] | None = None) -> str:
        return self.publish_raw(topic_of(message), message.to_json(), attributes)

    def publish_raw(
        self, topic: str, payload: str, attributes: Mapping[str, str] | None = None
    ) -> str:
        """Publish an already-serialised payload (used for messages from outside)."""
        now = self._clock()
        with self._store.transaction() as db:
            cur = db.execute(
                "INSERT INTO messages (topic, payload, attributes, available_at, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (topic, payload, json.dumps(dict(attributes or {})), now, now))
            message_id = str(cur.lastrowid)
        with self._wake:
            self._wake.notify()
        return message_id

    def recover(self) -> int:
        """Return messages left in flight by a dead process to the queue.

        A message the process died on `max_attempts` times is dead-lettered instead: an input
        that crashes the runtime (a native fault in a parser, an OOM kill) must not crash it
        again at every restart.
        """
        with self._store.transaction() as db:
            fatal = db.execute(
                "SELECT id, topic, payload, attempts FROM messages WHERE state = 'inflight' "
                "AND attempts >= ?", (self.max_attempts,)).fetchall()
            recovered = db.execute(
                "UPDATE messages SET state = 'pending' WHERE state = 'inflight' "
                "AND attempts < ?", (self.max_attempts,)).rowcount
        for msg_id, topic, payload, attempts in fatal:
            self._dead(msg_id, topic, payload,
                       f"the runtime stopped {attempts} times while handling it "
                       "(a crash or a kill)", attempts)
        return recovered

    def start(self, dispatch: Dispatch) -> None:
        self._dispatch = dispatch
        self._stop.clear()
        for i in range(self.workers):
            t = threading.Thread(target=self._work, name=f"mldiag-bus-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking messages and wait, `timeout` seconds in all, for the ones in progress.

        One deadline for every worker, not one each: with each busy worker waited for in turn,
        `mldiag up` could take workers × timeout to stop after Ctrl-C. A message still in
        progress at the deadline stays in flight, and the next start puts it back (`recover`).
        """
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._threads.clear()

    def _take(self) -> tuple[int, str, str, dict[str, str], int] | None:
        now = self._clock()
        with self._store.transaction() as db:
            row = db.execute(
                "SELECT id, topic, payload, attributes, attempts FROM messages "
                f"WHERE state = 'pending' AND available_at <= ? ORDER BY {self._order}"
                "available_at, id LIMIT 1", (now, *self._order_args)).fetchone()
            if row is None:
                return None
            db.execute("UPDATE messages SET state = 'inflight', attempts = attempts + 1 "
                       "WHERE id = ?", (row[0],))
        return row[0], row[1], row[2], json.loads(row[3]), row[4] + 1

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._take()
                if item is not None:
                    self._deliver(*item)
                    continue
            except Exception:  # noqa: BLE001 - a dead worker would stop the bus silently
                # The queue itself failed (e.g. the database stayed locked past its timeout).
                # A message taken stays in flight until recover() at the next start.
                log.exception("bus worker: queue operation failed; retrying")
            with self._wake:
                self._wake.wait(self.poll_s)

    def _deliver(
        self, msg_id: int, topic: str, payload: str, attrs: dict[str, str], attempt: int
    ) -> None:
        assert self._dispatch is not None
        try:
            self._dispatch(topic, payload, attrs)
        except PoisonMessage as e:
            self._dead(msg_id, topic, payload, f"poison message: {e}", attempt)
        except Exception as e:  # noqa: BLE001 - any failure is retried, then dead-lettered
            reason = f"{type(e).__name__}: {e}".splitlines()[0][:500]
            log.warning("delivery %s on %s failed (attempt %d/%d): %s", msg_id, topic, attempt,
                        self.max_attempts, reason)
            log.debug("%s", traceback.format_exc())
            if attempt >= self.max_attempts:
                self._dead(msg_id, topic, payload,
                           f"failed {attempt} times, last error: {reason}", attempt)
            else:
                delay = self.backoff_s * 2 ** (attempt - 1)
                with self._store.transaction() as db:
                    db.execute("UPDATE messages SET state = 'pending', available_at = ?, "
                               "last_error = ? WHERE id = ?",
                               (self._clock() + delay, reason, msg_id))
        else:
            with self._store.transaction() as db:
                db.execute("UPDATE messages SET state = 'done', finished_at = ? WHERE id = ?",
                           (self._clock(), msg_id))

    def _dead(self, msg_id: int, topic: str, payload: str, reason: str, attempts: int) -> None:
        now = self._clock()
        with self._store.transaction() as db:
            db.execute("UPDATE messages SET state = 'dead', last_error = ?, finished_at = ? "
                       "WHERE id = ?", (reason, now, msg_id))
        self._store.record_dead_letter(topic, payload, reason, attempts, now)
        log.warning("dead-lettered message %s on %s: %s", msg_id, topic, reason)
        if self.on_dead is not None:
            try:
                self.on_dead(topic, payload, reason)
            except Exception:  # noqa: BLE001 - the letter is recorded; the worker must live on
                log.exception("dead-letter hook failed for message %s", msg_id)

    def pending(self) -> int:
        """Messages not yet delivered (pending or in flight)."""
        row = self._store.connection().execute(
            "SELECT COUNT(*) FROM messages WHERE state IN ('pending', 'inflight')").fetchone()
        return int(row[0])

    def stats(self) -> dict[str, Any]:
        rows = self._store.connection().execute(
            "SELECT state, COUNT(*) FROM messages GROUP BY state").fetchall()
        return {str(k): int(v) for k, v in rows}
