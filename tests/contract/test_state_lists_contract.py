"""The StateStore's list queries (the console's runs and sessions lists): SqliteStateStore
and FirestoreStateStore (on the Firestore emulator) page, filter, search and sort alike, and
every query Firestore would run has its composite indexes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from mldiag.listing import BadQuery, RunQuery, SessionQuery, encode_cursor
from mldiag.model import (
    CAPTURING,
    FAILED,
    REPORTED,
    REQUESTED,
    HostRecord,
    RunRecord,
    SessionRecord,
)
from tests.contract.conftest import Subject


def host(name: str) -> HostRecord:
    return HostRecord(object_name=f"r/plugins/profile/s/{name}.xplane.pb", generation="1",
                      size=10, arrived_at=0.0)


def _seed_sessions(s: Any) -> None:
    """Nine sessions of two runs: created at 10..90, states, verdicts and triggers mixed,
    and two created at the same time (a tie the cursor must not lose)."""
    rows = [("a", "ondemand-1", 10, REPORTED, "OPTIMAL", "manual"),
            ("a", "ondemand-2", 20, REPORTED, "NEEDS_ATTENTION", "alert"),
            ("a", "alert-storm", 30, FAILED, None, "alert"),
            ("b", "ondemand-3", 40, REPORTED, "OPTIMAL", "manual"),
            ("a", "nightly_x", 50, CAPTURING, None, "manual"),
            ("b", "nightly_y", 50, REPORTED, "NEEDS_ATTENTION", "manual"),
            ("a", "Prod.Step-Time", 70, REPORTED, "INSUFFICIENT_DATA", "alert"),
            ("b", "zeta", 80, REQUESTED, None, "manual"),
            ("a", "omega", 90, REPORTED, "OPTIMAL", "manual")]
    for run, name, at, st, verdict, trigger in rows:
        s.create_session(SessionRecord(run=run, session=name, state=st, created_at=at,
                                       updated_at=at, verdict=verdict, trigger=trigger))


def _all_pages(s: Any, query: SessionQuery) -> list[list[str]]:
    pages, cursor = [], ""
    while True:
        page = s.query_sessions(replace(query, cursor=cursor))
        pages.append([x.session for x in page.items])
        cursor = page.next_cursor
        if not cursor:
            return pages


def test_query_sessions_pages_through_every_match_once_in_order(state: Subject) -> None:
    s = state.adapter
    _seed_sessions(s)
    pages = _all_pages(s, SessionQuery(limit=2))
    assert [len(p) for p in pages] == [2, 2, 2, 2, 1]
    flat = [x for p in pages for x in p]
    assert flat[:2] == ["omega", "zeta"] and flat[-1] == "ondemand-1"
    # The two created at 50 are both there, once, between 70 and 40.
    assert sorted(flat[3:5]) == ["nightly_x", "nightly_y"] and len(set(flat)) == 9
    oldest = [x for p in _all_pages(s, SessionQuery(sort="oldest", limit=4)) for x in p]
    assert oldest[0] == "ondemand-1" and oldest[-1] == "omega" and len(set(oldest)) == 9
    by_name = [x for p in _all_pages(s, SessionQuery(sort="name", limit=3)) for x in p]
    assert by_name == sorted(flat)
    # An exact page: no empty page after it.
    assert [len(p) for p in _all_pages(s, SessionQuery(limit=3))] == [3, 3, 3]


def test_query_sessions_filters_combine(state: Subject) -> None:
    s = state.adapter
    _seed_sessions(s)

    def names(**kw: Any) -> list[str]:
        return [x.session for x in s.query_sessions(SessionQuery(**kw)).items]

    assert names(run="b") == ["zeta", "nightly_y", "ondemand-3"]
    assert names(state=REPORTED, verdict="OPTIMAL") == ["omega", "ondemand-3", "ondemand-1"]
    assert names(trigger="alert") == ["Prod.Step-Time", "alert-storm", "ondemand-2"]
    assert names(run="a", trigger="alert", state=REPORTED) == ["Prod.Step-Time", "ondemand-2"]
    assert names(since=20, until=50) == ["ondemand-3", "alert-storm", "ondemand-2"]
    assert names(run="a", since=50, sort="oldest") == ["nightly_x", "Prod.Step-Time", "omega"]
    # The search matches a word prefix of the name, in any case, and the whole name's.
    assert names(search="ondemand") == ["ondemand-3", "ondemand-2", "ondemand-1"]
    assert names(search="STEP") == ["Prod.Step-Time"]
    assert names(search="prod.step-t") == ["Prod.Step-Time"]
    assert names(search="x") == ["nightly_x"]
    assert names(search="tep") == []
    assert names(search="night", run="b") == ["nightly_y"]
    assert names(search="ondemand", verdict="OPTIMAL", since=20) == ["ondemand-3"]
    assert names(run="nope") == []
    filtered = [x for p in _all_pages(s, SessionQuery(run="a", state=REPORTED, limit=1))
                for x in p]
    assert filtered == ["omega", "Prod.Step-Time", "ondemand-2", "ondemand-1"]


def test_query_sessions_sees_state_changes(state: Subject) -> None:
    s = state.adapter
    s.register_host("r", "late", "h", host("h"), now=5)
    assert [x.session for x in s.query_sessions(SessionQuery(state=CAPTURING)).items] == ["late"]
    s.transition("r", "late", REPORTED, now=6, verdict="OPTIMAL")
    assert s.query_sessions(SessionQuery(state=CAPTURING)).items == []
    (got,) = s.query_sessions(SessionQuery(verdict="OPTIMAL")).items
    assert (got.key, got.state, got.created_at) == ("r/late", REPORTED, 5)


def test_a_list_query_refuses_what_it_cannot_run(state: Subject) -> None:
    s = state.adapter
    for bad in ({"sort": "size"}, {"state": "DONE"}, {"verdict": "GOOD"},
                {"trigger": "cron"}, {"limit": 0}, {"limit": 10_000},
                {"sort": "name", "since": 1.0}):
        with pytest.raises(BadQuery):
            SessionQuery(**bad)  # type: ignore[arg-type]
    for cursor in ("garbage!", encode_cursor("text", ["r", "s"]), encode_cursor(1.0, ["r"])):
        with pytest.raises(BadQuery):
            s.query_sessions(SessionQuery(cursor=cursor))
    with pytest.raises(BadQuery):
        s.query_runs(RunQuery(cursor=encode_cursor(1.0, ["a", "b"])))


def test_query_runs_searches_sorts_and_pages(state: Subject) -> None:
    s = state.adapter
    for i, name in enumerate(["llama-train", "gemma_eval", "llama-eval", "mixtral", "ZZ top"]):
        s.ensure_run(name, discovered=False, now=100 + i)
    page = s.query_runs(RunQuery(limit=2))
    assert [r.name for r in page.items] == ["ZZ top", "mixtral"] and page.next_cursor
    page2 = s.query_runs(RunQuery(limit=2, cursor=page.next_cursor))
    page3 = s.query_runs(RunQuery(limit=2, cursor=page2.next_cursor))
    assert [r.name for r in page2.items + page3.items] == [
        "llama-eval", "gemma_eval", "llama-train"] and not page3.next_cursor
    assert [r.name for r in s.query_runs(RunQuery(search="eval", sort="oldest")).items] == [
        "gemma_eval", "llama-eval"]
    assert [r.name for r in s.query_runs(RunQuery(search="LLAMA", sort="name")).items] == [
        "llama-eval", "llama-train"]
    assert [r.name for r in s.query_runs(RunQuery(search="top")).items] == ["ZZ top"]
    # A registration keeps the run where it was in the list.
    s.register_run(RunRecord(name="gemma_eval", run_group="g"))
    assert [r.name for r in s.query_runs(RunQuery(search="gemma")).items] == ["gemma_eval"]
    assert [r.name for r in s.query_runs(RunQuery(sort="oldest", limit=2)).items] == [
        "llama-train", "gemma_eval"]


@pytest.mark.parametrize("filters", [{}, {"run": "r"}, {"state": REPORTED, "verdict": "OPTIMAL"},
                                     {"trigger": "alert", "search": "x"},
                                     {"run": "r", "since": 1.0, "until": 2.0}])
@pytest.mark.parametrize("sort", ["newest", "oldest", "name"])
def test_every_list_query_has_an_index_for_each_filter(filters: dict[str, Any],
                                                       sort: str) -> None:
    """Firestore serves a list query by merging one index per equality filter, each ending
    in the query's order: every filter and sort needs its (filter, order) index."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore

    from mldiag.adapters.gcp.state import INDEXES, FirestoreStateStore

    if "since" in filters and sort == "name":
        return  # refused by SessionQuery
    client = firestore.Client(project="p", credentials=AnonymousCredentials())
    query = SessionQuery(sort=sort, **filters)
    proto = FirestoreStateStore(client=client).session_list_query(query)._to_protobuf()
    order = [(o.field.field_path, o.direction.name) for o in proto.order_by]
    assert order[-1][0] == "__name__"
    (field, direction), = order[:-1]
    indexes = {tuple((f["fieldPath"], f.get("order") or f["arrayConfig"]) for f in ix["fields"])
               for ix in INDEXES["indexes"] if ix["collectionGroup"] == "sessions"}
    for name in query.filters:
        assert ((name, "ASCENDING"), (field, direction)) in indexes, (name, field, direction)
    if query.term:
        assert (("terms", "CONTAINS"), (field, direction)) in indexes


def test_records_stored_before_list_queries_are_listed_once_filled(state: Subject) -> None:
    s = state.adapter
    s.create_session(SessionRecord(run="r", session="old-1", state=REPORTED, created_at=5,
                                   verdict="OPTIMAL", trigger="alert"))
    s.ensure_run("old-run", discovered=True, now=3.0)
    if state.name == "FirestoreStateStore":
        # As an adapter before list queries stored them: without their list fields.
        from google.cloud import firestore

        s._session_ref("r", "old-1").update({  # noqa: SLF001 - the stored layout itself
            k: firestore.DELETE_FIELD for k in ("created_at", "verdict", "trigger", "terms")})
        s._run_ref("old-run").update({"terms": firestore.DELETE_FIELD})  # noqa: SLF001
        assert s.query_sessions(SessionQuery()).items == []
        assert s.query_runs(RunQuery(search="old")).items == []  # listed, not found
        assert s.fill_list_fields() == 2
    assert s.fill_list_fields() == 0  # done once; SQLite fills its columns when opened
    (got,) = s.query_sessions(SessionQuery(verdict="OPTIMAL", trigger="alert",
                                           search="old")).items
    assert (got.key, got.created_at) == ("r/old-1", 5)
    assert [r.name for r in s.query_runs(RunQuery(search="old")).items] == ["old-run"]
