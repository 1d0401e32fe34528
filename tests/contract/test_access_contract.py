"""The AccessStore port: SqliteAccessStore and FirestoreAccessStore (on the Firestore
emulator) keep one contract: records found by the hash of their secret, revocations, one-time
login codes that exactly one racing use consumes, idempotent role bindings, share links and
their access log."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mldiag.access import (
    AccessEntry,
    Grant,
    ShareLink,
    TokenRecord,
    hash_secret,
    new_id,
    new_secret,
)
from mldiag.adapters.local.access import SqliteAccessStore
from tests.contract.conftest import Subject, unique
from tests.emulators import Emulators
from tests.helpers.threads import contend


@pytest.fixture(params=["sqlite", pytest.param("firestore", marks=pytest.mark.emulator)])
def access(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    if request.param == "sqlite":
        yield Subject("SqliteAccessStore", SqliteAccessStore(tmp_path / "state.db"),
                      twin=SqliteAccessStore(tmp_path / "state.db"))
        return
    from mldiag.adapters.gcp.access import FirestoreAccessStore

    emu: Emulators = request.getfixturevalue("emu")
    database = unique("access-")
    yield Subject("FirestoreAccessStore",
                  FirestoreAccessStore(client=emu.firestore_client(database)),
                  twin=FirestoreAccessStore(client=emu.firestore_client(database)))


def token(secret: str, *, created_at: float = 1.0, expires_at: float = 0.0,
          kind: str = "api", principal: str = "ada@example.com") -> TokenRecord:
    return TokenRecord(id=new_id(), token_hash=hash_secret(secret), principal=principal,
                       role="viewer", run="r", kind=kind, label="ci", created_at=created_at,
                       expires_at=expires_at, created_by="admin@example.com")


def link(secret: str, run: str = "r", session: str = "s", *, created_at: float = 1.0,
         anyone: bool = False) -> ShareLink:
    return ShareLink(id=new_id(), token_hash=hash_secret(secret), run=run, session=session,
                     anyone=anyone, created_by="ada@example.com", created_at=created_at,
                     expires_at=created_at + 3600)


# Tokens


def test_a_token_is_found_by_the_hash_of_its_secret(access: Subject) -> None:
    s = access.adapter
    secret = new_secret("mld")
    record = token(secret)
    s.put_token(record)
    assert s.find_token(hash_secret(secret)) == record
    assert access.twin.find_token(hash_secret(secret)) == record, "seen by other instances"
    assert s.find_token(secret) is None, "the secret itself finds nothing"
    assert s.find_token(hash_secret("mld_unknown")) is None


def test_list_tokens_is_newest_first_and_keeps_revoked_and_expired(access: Subject) -> None:
    s = access.adapter
    old, expired, new = (token(new_secret("mld"), created_at=t, expires_at=e)
                         for t, e in ((1.0, 0.0), (2.0, 3.0), (5.0, 0.0)))
    for record in (expired, new, old):
        s.put_token(record)
    assert s.revoke_token(old.id, now=6.0)
    assert [t.id for t in s.list_tokens()] == [new.id, expired.id, old.id]
    assert [t.valid(10.0) for t in s.list_tokens()] == [True, False, False]


def test_revoke_token_by_id_once(access: Subject) -> None:
    s = access.adapter
    secret = new_secret("mld")
    record = token(secret)
    s.put_token(record)
    assert s.revoke_token(record.id, now=7.0)
    found = s.find_token(hash_secret(secret))
    assert found is not None and found.revoked_at == 7.0 and not found.valid(8.0)
    assert (found.principal, found.role, found.label) == (record.principal, "viewer", "ci")
    assert not s.revoke_token(record.id, now=9.0), "already revoked"
    assert s.find_token(hash_secret(secret)).revoked_at == 7.0  # type: ignore[union-attr]
    assert not s.revoke_token("no-such-id", now=9.0)


def test_a_browser_token_names_the_token_it_was_made_from(access: Subject) -> None:
    s = access.adapter
    api = token(new_secret("mld"), principal="token:x")
    s.put_token(api)
    browser = TokenRecord(id=new_id(), token_hash=hash_secret(new_secret("mld")),
                          principal="token:x", role="viewer", run="r", kind="browser",
                          created_at=2.0, expires_at=100.0, created_by=api.principal_id,
                          parent=api.id, parent_hash=api.token_hash)
    s.put_token(browser)
    found = access.twin.find_token(browser.token_hash)
    assert found == browser and found.principal_id == f"token:{api.id}"
    parent = access.twin.find_token(found.parent_hash)
    assert parent is not None and parent.id == found.parent and parent.valid(3.0)
    assert s.revoke_token(api.id, now=4.0)
    revoked = access.twin.find_token(found.parent_hash)
    assert revoked is not None and not revoked.valid(5.0)


def _put_raw_token(access: Subject, data: dict[str, Any]) -> None:
    """Store a token record as an older version wrote it (without today's fields)."""
    from mldiag.adapters.local.access import SqliteAccessStore

    s = access.adapter
    if isinstance(s, SqliteAccessStore):
        with sqlite3.connect(s.path) as db:
            db.execute("INSERT INTO tokens (token_hash, id, created_at, data) "
                       "VALUES (?, ?, ?, ?)", (data["token_hash"], data["id"],
                                               data["created_at"], json.dumps(data)))
        return
    s.client.collection("tokens").document(data["token_hash"]).set(data)


def test_a_token_stored_before_principal_ids_reads_as_its_own_principal(
        access: Subject) -> None:
    secret = new_secret("mld")
    old = {k: v for k, v in token(secret, principal="token:editor").to_dict().items()
           if k not in ("parent", "parent_hash")}
    _put_raw_token(access, old)
    found = access.twin.find_token(hash_secret(secret))
    assert found is not None and (found.parent, found.parent_hash) == ("", "")
    assert found.principal_id == f"token:{old['id']}"


def test_a_login_code_is_consumed_once(access: Subject) -> None:
    s = access.adapter
    code = new_secret("login")
    s.put_token(token(code, kind="login", expires_at=100.0))
    used = s.consume_token(hash_secret(code), now=50.0)
    assert used is not None and used.principal == "ada@example.com" and used.revoked_at == 50.0
    assert s.consume_token(hash_secret(code), now=51.0) is None, "second use"
    assert not s.find_token(hash_secret(code)).valid(52.0)  # type: ignore[union-attr]
    assert s.consume_token(hash_secret("login_unknown"), now=50.0) is None
    assert s.consume_token(code, now=50.0) is None, "the secret itself consumes nothing"


def test_an_expired_or_revoked_login_code_cannot_be_consumed(access: Subject) -> None:
    s = access.adapter
    late, revoked = new_secret("login"), new_secret("login")
    s.put_token(token(late, kind="login", expires_at=100.0))
    assert s.consume_token(hash_secret(late), now=100.0) is None
    assert s.find_token(hash_secret(late)).revoked_at == 0.0  # type: ignore[union-attr]
    record = token(revoked, kind="login", expires_at=100.0)
    s.put_token(record)
    s.revoke_token(record.id, now=10.0)
    assert s.consume_token(hash_secret(revoked), now=20.0) is None


def test_eight_racing_uses_of_one_login_code_have_one_winner(access: Subject) -> None:
    stores = (access.adapter, access.twin)
    # Several rounds: one race of a non-atomic store can still happen to come out right.
    for _ in range(3):
        code = new_secret("login")
        access.adapter.put_token(token(code, kind="login", expires_at=100.0))
        # Half the racers in each of two instances: the store's own locks cannot decide.
        used = contend(8, lambda i, code=code: stores[i % 2].consume_token(hash_secret(code),
                                                                          now=10.0 + i))
        winners = [u for u in used if u is not None]
        assert len(winners) == 1
        stored = access.adapter.find_token(hash_secret(code))
        assert stored is not None and stored.revoked_at == winners[0].revoked_at


# Role bindings


def test_granting_twice_keeps_one_binding_the_first(access: Subject) -> None:
    s = access.adapter
    s.grant(Grant("ada@example.com", "editor", "r", created_at=1.0, created_by="root"))
    s.grant(Grant("ada@example.com", "editor", "r", created_at=2.0, created_by="other"))
    assert s.list_grants() == [Grant("ada@example.com", "editor", "r", 1.0, "root")]
    s.grant(Grant("ada@example.com", "viewer"))  # another role: another binding
    assert [(g.role, g.run) for g in s.list_grants()] == [("viewer", "*"), ("editor", "r")]


def test_revoke_grant_removes_that_binding_alone(access: Subject) -> None:
    s = access.adapter
    s.grant(Grant("ada@example.com", "viewer"))
    s.grant(Grant("ada@example.com", "viewer", "r"))
    s.grant(Grant("bob@example.com", "viewer"))
    assert s.revoke_grant("ada@example.com", "viewer")  # run: every run by default
    assert not s.revoke_grant("ada@example.com", "viewer"), "already gone"
    assert not s.revoke_grant("ada@example.com", "admin", "r"), "never granted"
    assert [(g.principal, g.run) for g in s.list_grants()] == [
        ("ada@example.com", "r"), ("bob@example.com", "*")]


def test_list_grants_filters_by_principal(access: Subject) -> None:
    s = access.adapter
    # Principals and runs with characters a key or document id could confuse stay apart.
    names = [("token:ab12", "a/b"), ("token:ab12", "__x__"), ("a|viewer|b", "c"),
             ("a", "b|viewer|c"), ("ü~x", "..")]
    for principal, run in names:
        s.grant(Grant(principal, "viewer", run))
    assert sorted((g.principal, g.run) for g in s.list_grants()) == sorted(names)
    assert [g.run for g in s.list_grants("token:ab12")] == ["__x__", "a/b"]
    assert [g.run for g in s.list_grants("a")] == ["b|viewer|c"]
    assert s.list_grants("nobody@example.com") == []


# Share links


def test_a_link_is_found_by_the_hash_of_its_secret(access: Subject) -> None:
    s = access.adapter
    secret = new_secret("share")
    shared = link(secret, anyone=True)
    s.put_link(shared)
    assert s.find_link(hash_secret(secret)) == shared
    assert s.find_link(secret) is None
    assert s.find_link(hash_secret("share_unknown")) is None


def test_list_links_filters_by_run_and_session_newest_first(access: Subject) -> None:
    s = access.adapter
    a1, a2, b1, other = (link(new_secret("share"), run, session, created_at=t)
                         for run, session, t in (("r", "s1", 1.0), ("r", "s2", 3.0),
                                                 ("r", "s1", 2.0), ("q", "s1", 4.0)))
    for each in (a1, a2, b1, other):
        s.put_link(each)
    assert [x.id for x in s.list_links()] == [other.id, a2.id, b1.id, a1.id]
    assert [x.id for x in s.list_links(run="r")] == [a2.id, b1.id, a1.id]
    assert [x.id for x in s.list_links(run="r", session="s1")] == [b1.id, a1.id]
    assert [x.id for x in s.list_links(session="s1")] == [other.id, b1.id, a1.id]
    assert s.list_links(run="none") == []


def test_revoke_link_by_id_once(access: Subject) -> None:
    s = access.adapter
    secret = new_secret("share")
    shared = link(secret)
    s.put_link(shared)
    assert s.find_link(hash_secret(secret)).valid(100.0)  # type: ignore[union-attr]
    assert s.revoke_link(shared.id, now=100.0)
    found = s.find_link(hash_secret(secret))
    assert found is not None and found.revoked_at == 100.0 and not found.valid(101.0)
    assert not s.revoke_link(shared.id, now=102.0)
    assert not s.revoke_link("no-such-id", now=102.0)
    assert [x.revoked_at for x in s.list_links()] == [100.0], "revoked links are listed"


# Access log


def test_the_access_log_is_newest_first_limited_and_per_link(access: Subject) -> None:
    s = access.adapter
    assert s.list_access() == []
    for i in range(6):
        s.log_access(AccessEntry(link_id="L1" if i % 2 else "L2",
                                 principal="anonymous" if i < 3 else "ada@example.com",
                                 at=100.0 + i * 3600, path=f"/share/x/report#{i}"))
    assert [e.at for e in s.list_access()] == [100.0 + i * 3600 for i in range(5, -1, -1)]
    assert [e.at for e in s.list_access(limit=2)] == [18100.0, 14500.0]
    assert [(e.principal, e.at, e.path, e.count) for e in s.list_access("L1")] == [
        ("ada@example.com", 18100.0, "/share/x/report#5", 1),
        ("ada@example.com", 10900.0, "/share/x/report#3", 1),
        ("anonymous", 3700.0, "/share/x/report#1", 1)]
    assert [e.at for e in s.list_access("L2", limit=1)] == [14500.0]
    assert s.list_access("L3") == []


def test_uses_are_counted_per_principal_client_and_hour(access: Subject) -> None:
    s = access.adapter
    for i in range(200):  # 200 anonymous uses within one hour, from one network
        s.log_access(AccessEntry("L1", "anonymous", at=7200.0 + 3 * i, path=f"/p{i}",
                                 client="203.0.113.0/24"))
    s.log_access(AccessEntry("L1", "anonymous", at=7300.0, client="198.51.100.0/24"))
    s.log_access(AccessEntry("L1", "ada@example.com", at=7400.0, client="203.0.113.0/24"))
    s.log_access(AccessEntry("L1", "anonymous", at=10800.0, client="203.0.113.0/24",
                             count=5, first_at=10800.0))
    rows = access.twin.list_access("L1")
    assert [(e.principal, e.client, e.count, e.first_at, e.at) for e in rows] == [
        ("anonymous", "203.0.113.0/24", 5, 10800.0, 10800.0),  # the next hour: a new row
        ("anonymous", "203.0.113.0/24", 200, 7200.0, 7797.0),
        ("ada@example.com", "203.0.113.0/24", 1, 7400.0, 7400.0),
        ("anonymous", "198.51.100.0/24", 1, 7300.0, 7300.0)]
    assert rows[1].path == "/p199"


def test_a_link_keeps_its_newest_rows_up_to_the_cap(access: Subject) -> None:
    s = access.adapter
    s.max_access_rows = 3
    for i in range(6):  # six callers, each a row
        s.log_access(AccessEntry("L1", f"token:{i}", at=100.0 + i))
        s.log_access(AccessEntry("L2", f"token:{i}", at=100.0 + i))
    assert [e.principal for e in s.list_access("L1")] == ["token:5", "token:4", "token:3"]
    assert len(s.list_access("L2")) == 3


# Secrets


def test_no_record_carries_its_secret(access: Subject) -> None:
    s = access.adapter
    api, code, share = new_secret("mld"), new_secret("login"), new_secret("share")
    s.put_token(token(api))
    s.put_token(token(code, kind="login", expires_at=100.0))
    s.put_link(link(share))
    s.consume_token(hash_secret(code), now=1.0)
    listed: list[Any] = [*s.list_tokens(), *s.list_links()]
    text = json.dumps([r.to_dict() for r in listed])
    assert len(listed) == 3
    for secret in (api, code, share):
        assert secret not in text and hash_secret(secret) in text


def test_the_sqlite_file_holds_hashes_not_secrets(tmp_path: Path) -> None:
    store = SqliteAccessStore(tmp_path / "state.db")
    api, code, share = new_secret("mld"), new_secret("login"), new_secret("share")
    store.put_token(token(api))
    store.put_token(token(code, kind="login", expires_at=100.0))
    store.consume_token(hash_secret(code), now=1.0)
    store.put_link(link(share))
    dump = "\n".join(sqlite3.connect(tmp_path / "state.db").iterdump())
    for secret in (api, code, share):
        assert secret not in dump and hash_secret(secret) in dump
    raw = (tmp_path / "state.db").read_bytes() + b"".join(
        p.read_bytes() for p in tmp_path.glob("state.db-*"))
    assert not any(secret.encode() in raw for secret in (api, code, share))


def test_the_access_store_shares_the_state_database(tmp_path: Path) -> None:
    from mldiag.adapters.local.state import SqliteStateStore

    state = SqliteStateStore(tmp_path / "state.db")
    store = SqliteAccessStore(tmp_path / "state.db")
    store.grant(Grant("ada@example.com", "admin"))
    state.ensure_run("r", discovered=True)
    assert [r.name for r in state.list_runs()] == ["r"]
    assert [g.role for g in SqliteAccessStore(tmp_path / "state.db").list_grants()] == ["admin"]


# Indexes (Firestore needs a composite index for each filtered, ordered query)


@pytest.mark.parametrize("link_id", [None, "L1"])
def test_the_access_log_query_has_its_composite_index(link_id: str | None) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore

    from mldiag.adapters.gcp.access import INDEXES, FirestoreAccessStore

    # Building a query connects to nothing.
    client = firestore.Client(project="p", credentials=AnonymousCredentials())
    proto = FirestoreAccessStore(client=client).access_query(link_id, 10)._to_protobuf()
    where = proto.where
    equal = {where.field_filter.field.field_path} if "field_filter" in where else set()
    order = [(o.field.field_path, o.direction.name) for o in proto.order_by]
    assert equal == ({"link_id"} if link_id else set())
    assert order == [("at", "DESCENDING")]
    if equal:
        assert [(f["fieldPath"], f["order"]) for ix in INDEXES["indexes"]
                for f in ix["fields"]] == [("link_id", "ASCENDING"), ("at", "DESCENDING")]


def test_an_access_log_of_before_aggregation_stays_readable(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "state.db")
    db.executescript("""
        CREATE TABLE share_access (seq INTEGER PRIMARY KEY AUTOINCREMENT,
            link_id TEXT NOT NULL, at REAL NOT NULL, data TEXT NOT NULL);""")
    for at in (100.0, 101.0):
        db.execute("INSERT INTO share_access (link_id, at, data) VALUES (?, ?, ?)",
                   ("L1", at, json.dumps({"link_id": "L1", "principal": "anonymous",
                                          "at": at, "path": "/report"})))
    db.commit()
    db.close()
    s = SqliteAccessStore(tmp_path / "state.db")
    s.log_access(AccessEntry("L1", "anonymous", at=102.0))
    s.log_access(AccessEntry("L1", "anonymous", at=103.0))
    assert [(e.at, e.count) for e in SqliteAccessStore(tmp_path / "state.db").list_access()
            ] == [(103.0, 2), (101.0, 1), (100.0, 1)]
