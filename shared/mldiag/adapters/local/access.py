"""SqliteAccessStore: tokens, role bindings, share links and their access log, in the state
store's database file (`$MLDIAG_HOME/state.db`).

Records are kept whole as JSON in `data`, next to the columns their lookups and orderings
use. A secret is never stored: tokens and links are keyed by its hash. Read-modify-writes
(revocations, consuming a login code) run in `BEGIN IMMEDIATE` transactions.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from contextlib import AbstractContextManager
from pathlib import Path

from mldiag.access import (
    ACCESS_ROWS_PER_LINK,
    ALL_RUNS,
    AccessEntry,
    Grant,
    ShareLink,
    TokenRecord,
)
from mldiag.adapters.local.private import private_dir
from mldiag.adapters.local.sqlite import immediate, thread_connection

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (
    token_hash TEXT PRIMARY KEY, id TEXT NOT NULL UNIQUE, created_at REAL NOT NULL,
    data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS grants (
    principal TEXT NOT NULL, role TEXT NOT NULL, run TEXT NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (principal, role, run));
CREATE TABLE IF NOT EXISTS share_links (
    token_hash TEXT PRIMARY KEY, id TEXT NOT NULL UNIQUE, run TEXT NOT NULL,
    session TEXT NOT NULL, created_at REAL NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS share_links_by_session ON share_links (run, session, created_at);
CREATE TABLE IF NOT EXISTS share_access (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, link_id TEXT NOT NULL, at REAL NOT NULL,
    data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS share_access_by_link ON share_access (link_id, at);
"""
# Rows are counted by key (`AccessEntry.key`); those of before have none, one use each.
_ACCESS_KEY = """
ALTER TABLE share_access ADD COLUMN key TEXT;
CREATE UNIQUE INDEX IF NOT EXISTS share_access_by_key ON share_access (key);
"""


class SqliteAccessStore:
    """The embedded access store. Safe to share between threads."""

    def __init__(self, path: Path, *, max_access_rows: int = ACCESS_ROWS_PER_LINK) -> None:
        self.path = path
        self.max_access_rows = max_access_rows
        self._local = threading.local()
        private_dir(path.parent)
        db = self._connection()
        db.executescript(_SCHEMA)
        with self._tx() as tx:
            columns = {r[1] for r in tx.execute("PRAGMA table_info(share_access)")}
            if "key" not in columns:
                for statement in filter(str.strip, _ACCESS_KEY.split(";")):
                    tx.execute(statement)

    def _connection(self) -> sqlite3.Connection:
        return thread_connection(self._local, self.path)

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        return immediate(self._connection())

    # Tokens

    def put_token(self, record: TokenRecord) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO tokens (token_hash, id, created_at, data) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (token_hash) DO UPDATE SET id = excluded.id, "
                "created_at = excluded.created_at, data = excluded.data",
                (record.token_hash, record.id, record.created_at,
                 json.dumps(record.to_dict())))

    def find_token(self, token_hash: str) -> TokenRecord | None:
        row = self._connection().execute("SELECT data FROM tokens WHERE token_hash = ?",
                                          (token_hash,)).fetchone()
        return TokenRecord(**json.loads(row[0])) if row else None

    def list_tokens(self) -> list[TokenRecord]:
        rows = self._connection().execute(
            "SELECT data FROM tokens ORDER BY created_at DESC, rowid DESC").fetchall()
        return [TokenRecord(**json.loads(r[0])) for r in rows]

    def _set_token(self, db: sqlite3.Connection, record: TokenRecord) -> None:
        db.execute("UPDATE tokens SET data = ? WHERE token_hash = ?",
                   (json.dumps(record.to_dict()), record.token_hash))

    def revoke_token(self, token_id: str, now: float) -> bool:
        with self._tx() as db:
            row = db.execute("SELECT data FROM tokens WHERE id = ?", (token_id,)).fetchone()
            record = TokenRecord(**json.loads(row[0])) if row else None
            if record is None or record.revoked_at:
                return False
            record.revoked_at = now
            self._set_token(db, record)
            return True

    def consume_token(self, token_hash: str, now: float) -> TokenRecord | None:
        with self._tx() as db:
            row = db.execute("SELECT data FROM tokens WHERE token_hash = ?",
                             (token_hash,)).fetchone()
            record = TokenRecord(**json.loads(row[0])) if row else None
            if record is None or not record.valid(now):
                return None
            record.revoked_at = now
            self._set_token(db, record)
            return record

    # Role bindings

    def grant(self, grant: Grant) -> None:
        with self._tx() as db:
            # An existing binding is kept as it was (who made it, and when).
            db.execute(
                "INSERT INTO grants (principal, role, run, data) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (principal, role, run) DO NOTHING",
                (grant.principal, grant.role, grant.run, json.dumps(grant.to_dict())))

    def revoke_grant(self, principal: str, role: str, run: str = ALL_RUNS) -> bool:
        with self._tx() as db:
            deleted = db.execute(
                "DELETE FROM grants WHERE principal = ? AND role = ? AND run = ?",
                (principal, role, run)).rowcount
        return deleted > 0

    def list_grants(self, principal: str | None = None) -> list[Grant]:
        sql, args = "SELECT data FROM grants", list[str]()
        if principal is not None:
            sql, args = sql + " WHERE principal = ?", [principal]
        rows = self._connection().execute(sql + " ORDER BY principal, run, role",
                                          args).fetchall()
        return [Grant(**json.loads(r[0])) for r in rows]

    # Share links

    def put_link(self, link: ShareLink) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO share_links (token_hash, id, run, session, created_at, data) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (token_hash) DO UPDATE SET "
                "id = excluded.id, run = excluded.run, session = excluded.session, "
                "created_at = excluded.created_at, data = excluded.data",
                (link.token_hash, link.id, link.run, link.session, link.created_at,
                 json.dumps(link.to_dict())))

    def find_link(self, token_hash: str) -> ShareLink | None:
        row = self._connection().execute("SELECT data FROM share_links WHERE token_hash = ?",
                                          (token_hash,)).fetchone()
        return ShareLink(**json.loads(row[0])) if row else None

    def list_links(self, run: str | None = None, session: str | None = None
                   ) -> list[ShareLink]:
        sql, args = "SELECT data FROM share_links WHERE 1=1", list[str]()
        if run is not None:
            sql, args = sql + " AND run = ?", [*args, run]
        if session is not None:
            sql, args = sql + " AND session = ?", [*args, session]
        rows = self._connection().execute(sql + " ORDER BY created_at DESC, rowid DESC",
                                          args).fetchall()
        return [ShareLink(**json.loads(r[0])) for r in rows]

    def revoke_link(self, link_id: str, now: float) -> bool:
        with self._tx() as db:
            row = db.execute("SELECT data FROM share_links WHERE id = ?",
                             (link_id,)).fetchone()
            link = ShareLink(**json.loads(row[0])) if row else None
            if link is None or link.revoked_at:
                return False
            link.revoked_at = now
            db.execute("UPDATE share_links SET data = ? WHERE id = ?",
                       (json.dumps(link.to_dict()), link_id))
            return True

    # Access log

    def log_access(self, entry: AccessEntry) -> None:
        key = entry.key
        with self._tx() as db:
            row = db.execute("SELECT data FROM share_access WHERE key = ?", (key,)).fetchone()
            if row is not None:
                entry = AccessEntry(**json.loads(row[0])).merged(entry)
                db.execute("UPDATE share_access SET at = ?, data = ? WHERE key = ?",
                           (entry.at, json.dumps(entry.to_dict()), key))
                return
            db.execute("INSERT INTO share_access (link_id, at, data, key) VALUES (?, ?, ?, ?)",
                       (entry.link_id, entry.at, json.dumps(entry.to_dict()), key))
            db.execute("DELETE FROM share_access WHERE link_id = ? AND seq NOT IN (SELECT seq "
                       "FROM share_access WHERE link_id = ? ORDER BY at DESC, seq DESC "
                       "LIMIT ?)", (entry.link_id, entry.link_id, self.max_access_rows))

    def list_access(self, link_id: str | None = None, limit: int = 1000) -> list[AccessEntry]:
        sql, args = "SELECT data FROM share_access", list[str | int]()
        if link_id is not None:
            sql, args = sql + " WHERE link_id = ?", [link_id]
        rows = self._connection().execute(sql + " ORDER BY at DESC, seq DESC LIMIT ?",
                                          [*args, limit]).fetchall()
        return [AccessEntry(**json.loads(r[0])) for r in rows]
