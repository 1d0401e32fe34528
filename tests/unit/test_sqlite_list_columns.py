"""A state database made before the console's list queries gets their columns, filled from
its records, so its runs and sessions show in the lists (and in searches) at once."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from mldiag.adapters.local.state import SqliteStateStore
from mldiag.listing import RunQuery, SessionQuery
from mldiag.model import REPORTED, RunRecord, SessionRecord


def test_an_older_database_is_listed_and_searched(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE runs (name TEXT PRIMARY KEY, data TEXT NOT NULL);"
        "CREATE TABLE sessions (run TEXT NOT NULL, session TEXT NOT NULL, state TEXT NOT NULL,"
        " updated_at REAL NOT NULL, data TEXT NOT NULL, PRIMARY KEY (run, session));")
    db.execute("INSERT INTO runs VALUES (?, ?)",
               ("old-run", json.dumps(RunRecord(name="old-run", created_at=5.0).to_dict())))
    s = SessionRecord(run="old-run", session="nightly-7", state=REPORTED, created_at=7.0,
                      updated_at=8.0, verdict="OPTIMAL", trigger="alert")
    db.execute("INSERT INTO sessions VALUES (?, ?, ?, ?, ?)",
               (s.run, s.session, s.state, s.updated_at, json.dumps(s.to_dict())))
    db.commit()
    db.close()

    store = SqliteStateStore(path)
    (got,) = store.query_sessions(SessionQuery(search="nightly", verdict="OPTIMAL",
                                               trigger="alert", since=6.0)).items
    assert got.key == "old-run/nightly-7"
    assert [r.name for r in store.query_runs(RunQuery(search="old")).items] == ["old-run"]
    # Opening it again changes nothing.
    again = SqliteStateStore(path)
    assert len(again.query_sessions(SessionQuery()).items) == 1
