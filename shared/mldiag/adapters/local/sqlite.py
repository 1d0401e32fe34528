"""What the SQLite adapters share: one connection per thread on a WAL database, and
`BEGIN IMMEDIATE` transactions (Firestore's transactions, locally)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mldiag.adapters.local.private import private_dir, private_file


def thread_connection(local: threading.local, path: Path) -> sqlite3.Connection:
    """This thread's connection to `path` (made on first use, kept in `local`). A new
    database file is owner-only, and SQLite gives its WAL and shared-memory files its mode."""
    conn: sqlite3.Connection | None = getattr(local, "conn", None)
    if conn is None:
        private_dir(path.parent)
        private_file(path)
        conn = sqlite3.connect(path, timeout=30.0, isolation_level=None,
                               check_same_thread=True)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
        local.conn = conn
    return conn


@contextmanager
def immediate(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction that takes the database lock at its start."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
