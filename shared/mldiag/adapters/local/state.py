"""SqliteStateStore: runs, sessions, claims and dead letters in `$MLDIAG_HOME/state.db`.

Read-modify-write operations run in `BEGIN IMMEDIATE` transactions, where Firestore would use
transactions. The in-process bus keeps its durable queue in the same database file.
"""

from __future__ import annotations

import copy
import json
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mldiag.adapters.local.private import private_dir
from mldiag.adapters.local.sqlite import immediate, thread_connection
from mldiag.listing import Page, RunQuery, SessionQuery, decode_cursor, encode_cursor, search_terms
from mldiag.model import (
    MAX_PENDING_REQUESTS,
    ControlRequest,
    HostRecord,
    MetricPoint,
    RunRecord,
    SessionRecord,
    TargetRecord,
    newest_points,
    usable_targets,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (name TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    run TEXT NOT NULL, session TEXT NOT NULL, state TEXT NOT NULL, updated_at REAL NOT NULL,
    data TEXT NOT NULL, PRIMARY KEY (run, session));
CREATE INDEX IF NOT EXISTS sessions_by_state ON sessions (state, updated_at);
CREATE TABLE IF NOT EXISTS targets (
    run TEXT NOT NULL, host TEXT NOT NULL, port INTEGER NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (run, host, port));
CREATE TABLE IF NOT EXISTS claims (
    key TEXT PRIMARY KEY, owner TEXT NOT NULL, done INTEGER NOT NULL DEFAULT 0,
    expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS captures (run TEXT NOT NULL, at REAL NOT NULL,
    key TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS captures_by_run ON captures (run, at);
CREATE TABLE IF NOT EXISTS metrics (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run TEXT NOT NULL, name TEXT NOT NULL,
    t0 REAL NOT NULL, t1 REAL NOT NULL, points TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS metrics_by_run ON metrics (run, name, t1);
CREATE TABLE IF NOT EXISTS requests (
    run TEXT NOT NULL, host TEXT NOT NULL, id TEXT NOT NULL, created_at REAL NOT NULL,
    expires_at REAL NOT NULL, data TEXT NOT NULL, PRIMARY KEY (run, host, id));
CREATE TABLE IF NOT EXISTS failures (key TEXT PRIMARY KEY, count INTEGER NOT NULL,
    at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, payload TEXT NOT NULL,
    reason TEXT NOT NULL, attempts INTEGER NOT NULL, at REAL NOT NULL);
"""


# The columns list queries filter and sort on (`mldiag.listing`), added to a database made
# before them and filled from each row's record.
_LIST_COLUMNS = {
    "runs": (("created_at", "REAL NOT NULL DEFAULT 0"), ("terms", "TEXT NOT NULL DEFAULT ''")),
    "sessions": (("created_at", "REAL NOT NULL DEFAULT 0"),
                 ("verdict", "TEXT NOT NULL DEFAULT ''"),
                 ("trigger", "TEXT NOT NULL DEFAULT ''"), ("terms", "TEXT NOT NULL DEFAULT ''")),
}
_LIST_INDEXES = """
CREATE INDEX IF NOT EXISTS sessions_by_created ON sessions (created_at, run, session);
CREATE INDEX IF NOT EXISTS sessions_by_run_created ON sessions (run, created_at, session);
CREATE INDEX IF NOT EXISTS runs_by_created ON runs (created_at, name);
"""


def _terms(name: str) -> str:
    """search_terms as one string that `instr` searches: " t1 t2 ... "."""
    return " " + " ".join(search_terms(name)) + " "


# How long a failure counter is kept: longer than Pub/Sub retains a message (7 days).
FAILURE_RETENTION_S = 8 * 86400.0


class SqliteStateStore:
    """The embedded state store. Safe to share between threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        self._listeners: list[Callable[[SessionRecord], None]] = []
        private_dir(path.parent)
        # executescript commits on its own, so the schema is not wrapped in _tx.
        self.connection().executescript(_SCHEMA)
        self._add_list_columns()

    def _add_list_columns(self) -> None:
        """Give a database made before list queries their columns, filled from the records."""
        with self._tx() as db:
            for table, columns in _LIST_COLUMNS.items():
                have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
                missing = [(c, kind) for c, kind in columns if c not in have]
                for column, kind in missing:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
                if not missing:
                    continue
                if table == "runs":
                    for name, data in db.execute("SELECT name, data FROM runs").fetchall():
                        db.execute("UPDATE runs SET created_at = ?, terms = ? WHERE name = ?",
                                   (json.loads(data).get("created_at") or 0.0, _terms(name),
                                    name))
                else:
                    for (data,) in db.execute("SELECT data FROM sessions").fetchall():
                        self._save(db, SessionRecord.from_dict(json.loads(data)))
        self.connection().executescript(_LIST_INDEXES)

    def connection(self) -> sqlite3.Connection:
        return thread_connection(self._local, self.path)

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        return immediate(self.connection())

    def executescript(self, script: str) -> None:
        """Run DDL on this database (the bus creates its queue table this way)."""
        self.connection().executescript(script)

    def transaction(self) -> Any:
        """A write transaction on this database (used by the bus to share the file)."""
        return self._tx()

    def add_listener(self, listener: Callable[[SessionRecord], None]) -> None:
        """Call `listener` with the session after every committed change of its state."""
        self._listeners.append(listener)

    def _notify(self, before: str | None, after: SessionRecord) -> None:
        if before != after.state:
            for listener in self._listeners:
                listener(after)

    # Runs

    def ensure_run(self, name: str, *, discovered: bool, now: float = 0.0) -> RunRecord:
        with self._tx() as db:
            row = db.execute("SELECT data FROM runs WHERE name = ?", (name,)).fetchone()
            if row is not None:
                return RunRecord(**json.loads(row[0]))
            run = RunRecord(name=name, discovered=discovered, created_at=now)
            self._save_run(db, run)
            return run

    def get_run(self, name: str) -> RunRecord | None:
        row = self.connection().execute("SELECT data FROM runs WHERE name = ?",
                                         (name,)).fetchone()
        return RunRecord(**json.loads(row[0])) if row else None

    def list_runs(self) -> list[RunRecord]:
        rows = self.connection().execute("SELECT data FROM runs ORDER BY name").fetchall()
        return [RunRecord(**json.loads(r[0])) for r in rows]

    def register_run(self, run: RunRecord) -> RunRecord:
        with self._tx() as db:
            row = db.execute("SELECT data FROM runs WHERE name = ?", (run.name,)).fetchone()
            if row is None:
                stored = RunRecord(**{**run.to_dict(), "discovered": False})
            else:
                stored = RunRecord(**json.loads(row[0]))
                stored.run_group = run.run_group
                stored.configs = dict(run.configs)
                stored.storage_prefix = run.storage_prefix
                stored.on_demand = run.on_demand
                # A registration that names none (`runs create`) keeps what an SDK set.
                stored.rl_orchestrator = run.rl_orchestrator or stored.rl_orchestrator
                stored.discovered = False
            self._save_run(db, stored)
            return stored

    def set_auto_capture(self, run: str, policy: Mapping[str, Any]) -> RunRecord | None:
        return self._update_run(run, lambda r: setattr(r, "auto_capture", dict(policy)))

    def set_baseline(self, run: str, session: str) -> RunRecord | None:
        return self._update_run(run, lambda r: setattr(r, "baseline", session))

    def _update_run(self, run: str, change: Callable[[RunRecord], None]) -> RunRecord | None:
        """Apply `change` to the stored run, in one transaction; None when it is unknown."""
        with self._tx() as db:
            row = db.execute("SELECT data FROM runs WHERE name = ?", (run,)).fetchone()
            if row is None:
                return None
            stored = RunRecord(**json.loads(row[0]))
            change(stored)
            self._save_run(db, stored)
            return stored

    @staticmethod
    def _save_run(db: sqlite3.Connection, run: RunRecord) -> None:
        db.execute("INSERT INTO runs (name, data, created_at, terms) VALUES (?, ?, ?, ?) "
                   "ON CONFLICT (name) DO UPDATE SET data = excluded.data, "
                   "created_at = excluded.created_at, terms = excluded.terms",
                   (run.name, json.dumps(run.to_dict()), run.created_at, _terms(run.name)))

    def query_runs(self, query: RunQuery) -> Page[RunRecord]:
        column, desc = query.order
        where, args = ["1=1"], list[Any]()
        if query.term:
            where.append("instr(terms, ?) > 0")
            args.append(f" {query.term} ")
        rows = self._page("runs", ("name",), column, desc, where, args, query.cursor,
                          query.limit)
        items = [RunRecord(**json.loads(r[0])) for r in rows[:query.limit]]
        more = len(rows) > query.limit
        last = rows[query.limit - 1] if more else None
        return Page(items, encode_cursor(last[1], [last[2]]) if last else "")

    def _page(self, table: str, keys: tuple[str, ...], column: str, desc: bool,
              where: list[str], args: list[Any], cursor: str, limit: int) -> list[Any]:
        """Rows (data, sort value, *keys) of one page, and one more when there is a next."""
        order = [column, *keys]
        if cursor:
            value, key = decode_cursor(cursor, column, len(keys))
            marks = ", ".join("?" * len(order))
            where.append(f"({', '.join(order)}) {'<' if desc else '>'} ({marks})")
            args.extend([value, *key])
        direction = " DESC" if desc else ""
        sql = (f"SELECT data, {', '.join(order)} FROM {table} "  # noqa: S608
               f"WHERE {' AND '.join(where)} ORDER BY "
               + ", ".join(c + direction for c in order) + " LIMIT ?")
        return self.connection().execute(sql, [*args, limit + 1]).fetchall()

    def reserve_capture(self, run: str, now: float, *, cooldown_s: float,
                        max_per_hour: int, key: str = "") -> bool:
        with self._tx() as db:
            if key and db.execute("SELECT 1 FROM captures WHERE run = ? AND key = ?",
                                  (run, key)).fetchone():
                return True
            last = db.execute("SELECT MAX(at) FROM captures WHERE run = ?", (run,)).fetchone()[0]
            if last is not None and now - last < cooldown_s:
                return False
            (recent,) = db.execute("SELECT COUNT(*) FROM captures WHERE run = ? AND at > ? "
                                   "AND key NOT LIKE 'released:%'",
                                   (run, now - 3600.0)).fetchone()
            if recent >= max_per_hour:
                return False
            db.execute("INSERT INTO captures (run, at, key) VALUES (?, ?, ?)", (run, now, key))
            return True

    def release_capture(self, run: str, key: str) -> None:
        if not key:
            return
        with self._tx() as db:
            # Kept for the cooldown; out of the hourly count and no longer the key's.
            db.execute("UPDATE captures SET key = 'released:' || key WHERE run = ? AND key = ?",
                       (run, key))

    # Targets

    def update_target(self, run: str, host: str, port: int, *,
                      expect: Mapping[str, Any] | None = None,
                      **fields: Any) -> TargetRecord | None:
        with self._tx() as db:
            row = db.execute("SELECT data FROM targets WHERE run = ? AND host = ? AND port = ?",
                             (run, host, port)).fetchone()
            if row is None:
                return None
            stored = json.loads(row[0])
            if expect and any(stored.get(k) != v for k, v in expect.items()):
                return None
            target = TargetRecord(**{**stored, **fields})
            db.execute("UPDATE targets SET data = ? WHERE run = ? AND host = ? AND port = ?",
                       (json.dumps(target.to_dict()), run, host, port))
            return target

    def upsert_target(self, target: TargetRecord) -> None:
        if target.problem():
            raise ValueError(target.problem())
        with self._tx() as db:
            db.execute(
                "INSERT INTO targets (run, host, port, data) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (run, host, port) DO UPDATE SET data = excluded.data",
                (target.run, target.host, target.port, json.dumps(target.to_dict())))

    def list_targets(self, run: str) -> list[TargetRecord]:
        rows = self.connection().execute(
            "SELECT data FROM targets WHERE run = ? ORDER BY host, port", (run,)).fetchall()
        return usable_targets(TargetRecord(**json.loads(r[0])) for r in rows)

    def delete_run(self, name: str) -> bool:
        with self._tx() as db:
            for table in ("targets", "sessions", "requests", "captures", "metrics"):
                db.execute(f"DELETE FROM {table} WHERE run = ?", (name,))  # noqa: S608
            return db.execute("DELETE FROM runs WHERE name = ?", (name,)).rowcount > 0

    def delete_target(self, run: str, host: str, port: int | None = None) -> int:
        with self._tx() as db:
            if port is None:
                cur = db.execute("DELETE FROM targets WHERE run = ? AND host = ?", (run, host))
            else:
                cur = db.execute("DELETE FROM targets WHERE run = ? AND host = ? AND port = ?",
                                 (run, host, port))
            return int(cur.rowcount)

    # Pull targets' requests

    def put_request(self, request: ControlRequest, now: float) -> bool:
        if request.problem():
            raise ValueError(request.problem())
        with self._tx() as db:
            db.execute("DELETE FROM requests WHERE run = ? AND host = ? AND expires_at <= ?",
                       (request.run, request.host, now))
            if db.execute("SELECT 1 FROM requests WHERE run = ? AND host = ? AND id = ?",
                          (request.run, request.host, request.id)).fetchone():
                return True
            (pending,) = db.execute("SELECT COUNT(*) FROM requests WHERE run = ? AND host = ?",
                                    (request.run, request.host)).fetchone()
            if pending >= MAX_PENDING_REQUESTS:
                return False
            db.execute("INSERT INTO requests (id, run, host, created_at, expires_at, data) "
                       "VALUES (?, ?, ?, ?, ?, ?)",
                       (request.id, request.run, request.host, request.created_at,
                        request.expires_at, json.dumps(request.to_dict())))
            return True

    def take_requests(self, run: str, host: str, now: float) -> list[ControlRequest]:
        with self._tx() as db:
            rows = db.execute(
                "DELETE FROM requests WHERE run = ? AND host = ? RETURNING expires_at, "
                "created_at, id, data", (run, host)).fetchall()
        live = sorted((r for r in rows if r[0] > now), key=lambda r: (r[1], r[2]))
        return [ControlRequest.from_dict(json.loads(r[3])) for r in live]

    def withdraw_request(self, run: str, host: str, request_id: str) -> bool:
        with self._tx() as db:
            return db.execute("DELETE FROM requests WHERE run = ? AND host = ? AND id = ?",
                              (run, host, request_id)).rowcount > 0

    # Sessions

    def _load(self, db: sqlite3.Connection, run: str, session: str) -> SessionRecord | None:
        row = db.execute("SELECT data FROM sessions WHERE run = ? AND session = ?",
                         (run, session)).fetchone()
        return SessionRecord.from_dict(json.loads(row[0])) if row else None

    @staticmethod
    def _save(db: sqlite3.Connection, s: SessionRecord) -> None:
        db.execute(
            "INSERT INTO sessions (run, session, state, updated_at, data, created_at, verdict, "
            "trigger, terms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (run, session) DO UPDATE SET state = excluded.state, "
            "updated_at = excluded.updated_at, data = excluded.data, "
            "created_at = excluded.created_at, verdict = excluded.verdict, "
            "trigger = excluded.trigger, terms = excluded.terms",
            (s.run, s.session, s.state, s.updated_at, json.dumps(s.to_dict()), s.created_at,
             s.verdict or "", s.trigger, _terms(s.session)),
        )

    def register_host(
        self, run: str, session: str, host: str, record: HostRecord, now: float,
        expected_hosts: Sequence[str] = (),
    ) -> tuple[SessionRecord, bool]:
        with self._tx() as db:
            s = self._load(db, run, session)
            before = s.state if s else None
            if s is None:
                s = SessionRecord.arriving(run, session, now, expected_hosts)
            new = s.add_host(host, record, now)
            if new:
                self._save(db, s)
        if new:
            self._notify(before, s)
        return s, new

    def create_session(self, record: SessionRecord) -> tuple[SessionRecord, bool]:
        """Insert a session unless one of that name exists: (stored session, created)."""
        with self._tx() as db:
            s = self._load(db, record.run, record.session)
            if s is None:
                self._save(db, record)
                s = record
                created = True
            else:
                created = False
        if created:
            self._notify(None, s)
        return s, created

    def join_session(self, record: SessionRecord, host: str,
                     process_index: int) -> tuple[SessionRecord, bool]:
        with self._tx() as db:
            s = self._load(db, record.run, record.session)
            before = s.state if s else None
            created = s is None
            if s is None:
                s = copy.deepcopy(record)
            changed = s.join(host, process_index, record.process_count, record.process_indices)
            if created or changed:
                self._save(db, s)
        if created:
            self._notify(before, s)
        return s, created

    def transition(
        self,
        run: str,
        session: str,
        to: str,
        *,
        expect: Sequence[str] | None = None,
        version: int | None = None,
        now: float,
        **fields: Any,
    ) -> SessionRecord | None:
        with self._tx() as db:
            s = self._load(db, run, session)
            if s is None:
                return None
            before = s.state
            if not s.move(to, now, expect=expect, version=version, **fields):
                return None
            self._save(db, s)
        self._notify(before, s)
        return s

    def get_session(self, run: str, session: str) -> SessionRecord | None:
        return self._load(self.connection(), run, session)

    def list_sessions(
        self, run: str | None = None, state: str | None = None
    ) -> list[SessionRecord]:
        sql, args = "SELECT data FROM sessions WHERE 1=1", list[str]()
        if run is not None:
            sql, args = sql + " AND run = ?", [*args, run]
        if state is not None:
            sql, args = sql + " AND state = ?", [*args, state]
        rows = self.connection().execute(sql + " ORDER BY run, session", args).fetchall()
        return [SessionRecord.from_dict(json.loads(r[0])) for r in rows]

    def fill_list_fields(self) -> int:
        """Nothing to do: opening the database added and filled the list columns."""
        return 0

    def query_sessions(self, query: SessionQuery) -> Page[SessionRecord]:
        column, desc = query.order
        where, args = ["1=1"], list[Any]()
        for name, value in query.filters.items():
            where.append(f"{name} = ?")
            args.append(value)
        if query.term:
            where.append("instr(terms, ?) > 0")
            args.append(f" {query.term} ")
        if query.since is not None:
            where.append("created_at >= ?")
            args.append(query.since)
        if query.until is not None:
            where.append("created_at < ?")
            args.append(query.until)
        rows = self._page("sessions", ("run", "session"), column, desc, where, args,
                          query.cursor, query.limit)
        items = [SessionRecord.from_dict(json.loads(r[0])) for r in rows[:query.limit]]
        more = len(rows) > query.limit
        last = rows[query.limit - 1] if more else None
        return Page(items, encode_cursor(last[1], [last[2], last[3]]) if last else "")

    # Claims

    def claim(self, key: str, owner: str, lease_s: float, now: float) -> bool:
        with self._tx() as db:
            row = db.execute("SELECT owner, done, expires_at FROM claims WHERE key = ?",
                             (key,)).fetchone()
            if row is not None and (row[1] or row[2] > now):
                return False
            db.execute(
                "INSERT INTO claims (key, owner, done, expires_at) VALUES (?, ?, 0, ?) "
                "ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, done = 0, "
                "expires_at = excluded.expires_at", (key, owner, now + lease_s))
            return True

    def renew(self, key: str, owner: str, lease_s: float, now: float) -> bool:
        with self._tx() as db:
            return db.execute(
                "UPDATE claims SET expires_at = ? WHERE key = ? AND owner = ? AND done = 0",
                (now + lease_s, key, owner)).rowcount == 1

    def release(self, key: str, owner: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM claims WHERE key = ? AND owner = ? AND done = 0",
                       (key, owner))

    def complete(self, key: str, owner: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE claims SET done = 1 WHERE key = ? AND owner = ?", (key, owner))

    def release_all_held(self) -> int:
        """Drop every unfinished claim: used when the single local runtime restarts, since
        whoever held them died with the previous process."""
        with self._tx() as db:
            return db.execute("DELETE FROM claims WHERE done = 0").rowcount

    def count_failure(self, key: str, now: float) -> int:
        with self._tx() as db:
            # Counters of work that settled long ago are dropped as new ones come.
            db.execute("DELETE FROM failures WHERE at < ?", (now - FAILURE_RETENTION_S,))
            row = db.execute(
                "INSERT INTO failures (key, count, at) VALUES (?, 1, ?) ON CONFLICT (key) "
                "DO UPDATE SET count = count + 1, at = excluded.at RETURNING count",
                (key, now)).fetchone()
            return int(row[0])

    # Dead letters

    def record_dead_letter(
        self, topic: str, payload: str, reason: str, attempts: int, now: float
    ) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO dead_letters (topic, payload, reason, attempts, at) "
                "VALUES (?, ?, ?, ?, ?)", (topic, payload, reason, attempts, now))

    def list_dead_letters(self, since: float = 0.0) -> list[dict[str, Any]]:
        rows = self.connection().execute(
            "SELECT id, topic, payload, reason, attempts, at FROM dead_letters WHERE at > ? "
            "ORDER BY id", (since,)).fetchall()
        keys = ("id", "topic", "payload", "reason", "attempts", "at")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    # Metrics

    def record_metrics(self, run: str, points: Sequence[MetricPoint]) -> None:
        # One row per metric of the batch, its points a JSON array: a batch of a thousand
        # points is a few rows and one commit.
        groups: dict[str, list[MetricPoint]] = {}
        for p in points:
            groups.setdefault(p.name, []).append(p)
        rows = [(run, name, min(p.at for p in group), max(p.at for p in group),
                 json.dumps([p.to_dict() for p in group], allow_nan=False))
                for name, group in groups.items()]
        with self._tx() as db:
            db.executemany("INSERT INTO metrics (run, name, t0, t1, points) "
                           "VALUES (?, ?, ?, ?, ?)", rows)

    def list_metrics(self, run: str, name: str | None = None, since: float = 0.0,
                     limit: int | None = None) -> list[MetricPoint]:
        sql, args = "SELECT t1, points FROM metrics WHERE run = ? AND t1 > ?", [run, since]
        if name is not None:
            sql, args = sql + " AND name = ?", [*args, name]
        rows = self.connection().execute(sql + " ORDER BY t1 DESC, id DESC", args)
        return newest_points(((t1, json.loads(data)) for t1, data in rows), since, limit)


def session_summary(s: SessionRecord) -> dict[str, Any]:
    """A JSON-friendly view of a session for the CLI."""
    data = asdict(s)
    data["hosts"] = {h: asdict(r) for h, r in s.hosts.items()}
    return data
