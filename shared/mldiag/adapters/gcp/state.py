"""FirestoreStateStore: runs, targets, sessions, claims and dead letters in Firestore.

The semantics are SqliteStateStore's, with Firestore transactions where SQLite takes
`BEGIN IMMEDIATE`: every read-modify-write (host registration, transitions, claim takeover and
release, run registration, capture reservations, target updates) runs in one transaction, and
creates that must happen once (a claim, a run, a session) are conditional creates.

Layout (document ids are the natural keys, escaped by `doc_id`):

- `runs/{run}`: the RunRecord; `runs/{run}/targets/{host:port}`: its TargetRecords;
- `sessions/{run}~{session}`: the SessionRecord, with `run`, `state` and `session` as fields
  for the queries of `list_sessions` (see `INDEXES`);
- `claims/{sha256(key)}`: idempotency claims, the key itself kept as a field;
- `captures/{run}`: the times of a run's recent automatic captures, and under
  `captures/{run}/keys/{sha256(key)}` the alerts that reserved one;
- `dead_letters/{auto id}`: messages given up on, with the reason;
- `requests/{run}~{host}`: a pull target's mailbox, its pending ControlRequests as a JSON list
  in `data`, changed only by conditional writes (so a request is taken once);
- `runs/{run}/metrics/{auto id}`: the SDK's recorded metrics, one document per metric, host
  and written batch (up to `METRIC_CHUNK` points as JSON in `points`, with `name`, `host`,
  `t0` and `t1`), so a loop recording every step costs a few writes a second, not one per
  point.

Each record is stored whole as JSON in `data` (what the embedded store keeps too): user
configs may carry keys Firestore maps cannot (empty, `__x__`), and records round-trip exactly.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from google.api_core import exceptions as gexc
from google.cloud import firestore

from mldiag.adapters.gcp.firestore_client import LazyFirestore, read
from mldiag.adapters.gcp.transactions import DocumentTransactions
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

T = TypeVar("T")

RUNS, TARGETS, SESSIONS = "runs", "targets", "sessions"
CLAIMS, CAPTURES, DEAD_LETTERS = "claims", "captures", "dead_letters"
FAILURES = "failures"
REQUESTS = "requests"
METRICS = "metrics"
# `meta/list_fields`: written once the records stored before list queries got their fields.
META = "meta"
_SESSION_LIST_FIELDS = ("created_at", "verdict", "trigger", "terms")
# Points per metrics document: about 150 bytes each as JSON, well under the 1 MiB limit.
METRIC_CHUNK = 2000
# How long Firestore keeps claims and dead letters (the `purge_at` TTL field, see terraform).
CLAIM_RETENTION_S = 30 * 86400.0
DEAD_LETTER_RETENTION_S = 90 * 86400.0
# (collection, field) pairs with a TTL policy: terraform's firestore.tf mirrors this.
TTL_FIELDS = ((CLAIMS, "purge_at"), (DEAD_LETTERS, "purge_at"), (FAILURES, "purge_at"),
              (REQUESTS, "purge_at"))
# A pull target's mailbox outlives its last request by this long, then Firestore deletes it.
MAILBOX_RETENTION_S = 7 * 86400.0
# Longer than Pub/Sub retains a message (7 days): no redelivery outlives its counter.
FAILURE_RETENTION_S = 8 * 86400.0


def _purge_at(now: float, keep_s: float) -> datetime:
    return datetime.fromtimestamp(now + keep_s, UTC)

# The orderings of list_sessions, by which filters it has: (by run, by state) -> order fields.
# Each filtered shape needs the composite index of INDEXES with the same fields.
SESSION_QUERIES: dict[tuple[bool, bool], tuple[str, ...]] = {
    (False, False): ("run", "session"),
    (True, False): ("session",),
    (False, True): ("run", "session"),
    (True, True): ("session",),
}


def _field(path: str, order: str = "ASCENDING") -> dict[str, str]:
    if order == "CONTAINS":
        return {"fieldPath": path, "arrayConfig": "CONTAINS"}
    return {"fieldPath": path, "order": order}


# The console's list queries (`query_sessions`, `query_runs`): each equality filter (and the
# search, an array-contains on `terms`) has an index with each sort order, and Firestore
# merges them when several filters are given (its zig-zag merge join of equality indexes).
_SESSION_ORDERS = (("created_at", "DESCENDING"), ("created_at", "ASCENDING"),
                   ("session", "ASCENDING"))
_RUN_ORDERS = (("created_at", "DESCENDING"), ("created_at", "ASCENDING"), ("name", "ASCENDING"))
_LIST_INDEXES = [
    *({"collectionGroup": SESSIONS, "queryScope": "COLLECTION",
       "fields": [_field(f, "CONTAINS" if f == "terms" else "ASCENDING"), _field(o, d)]}
      for f in ("run", "state", "verdict", "trigger", "terms") for o, d in _SESSION_ORDERS
      if (f, o) != ("run", "session")),
    *({"collectionGroup": RUNS, "queryScope": "COLLECTION",
       "fields": [_field("terms", "CONTAINS"), _field(o, d)]} for o, d in _RUN_ORDERS),
]


# The database's indexes, in `firestore.indexes.json` form (terraform creates them). The
# composite ones serve list_sessions; the overrides keep the large JSON fields out of the
# automatic single-field indexes (an indexed string over 1500 bytes is wasted work).
INDEXES: dict[str, list[dict[str, Any]]] = {
    "indexes": [
        {"collectionGroup": SESSIONS, "queryScope": "COLLECTION",
         "fields": [_field("run"), _field("session")]},
        {"collectionGroup": SESSIONS, "queryScope": "COLLECTION",
         "fields": [_field("state"), _field("run"), _field("session")]},
        {"collectionGroup": SESSIONS, "queryScope": "COLLECTION",
         "fields": [_field("run"), _field("state"), _field("session")]},
        *_LIST_INDEXES,
    ],
    "fieldOverrides": [
        {"collectionGroup": group, "fieldPath": path, "indexes": []}
        for group, path in ((RUNS, "data"), (TARGETS, "data"), (SESSIONS, "data"),
                            (DEAD_LETTERS, "payload"), (CAPTURES, "times"),
                            (CAPTURES, "keys"), (METRICS, "points"), (REQUESTS, "data"))
    ],
}

# A Firestore document holds at most 1 MiB; a Pub/Sub message may hold 10 MB.
MAX_DEAD_LETTER_PAYLOAD = 512 * 1024
# A document id is at most 1500 bytes.
_MAX_ID_BYTES = 1500


def doc_id(value: str) -> str:
    """A Firestore document id for `value`, one-to-one.

    "%", "/" and "~" are percent-escaped ("/" separates path segments, "~" joins a session's
    run and name), as is the first character of ".", ".." and `__x__`, which Firestore
    reserves. Every other name, the usual case, is its own id, readable in the console.
    """
    if not value:
        raise ValueError("empty name")
    out = value.replace("%", "%25").replace("/", "%2F").replace("~", "%7E")
    if out in (".", "..") or (out.startswith("__") and out.endswith("__")):
        out = f"%{ord(out[0]):02X}{out[1:]}"
    if len(out.encode()) > _MAX_ID_BYTES:
        raise ValueError(f"name too long for a Firestore id ({len(out.encode())} bytes)")
    return out


def claim_id(key: str) -> str:
    """The document id of a claim: keys such as `object:bucket/a/b#gen` are not valid ids."""
    return hashlib.sha256(key.encode()).hexdigest()


def _dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, allow_nan=False)


# Conditional writes tried on a contended session document before giving up.
_SWAP_ATTEMPTS = 200
# How long a reservation's alert key is remembered (Pub/Sub redelivers for up to 7 days).
_RESERVATION_KEY_S = 7 * 86400.0


class FirestoreStateStore(LazyFirestore):
    """The state port on a Firestore database (Native mode). Safe to share between threads.

    `client` is a `google.cloud.firestore.Client` (built from `project` and `database` when
    omitted, which uses the ambient credentials). `max_attempts` bounds the retries of a
    contended transaction.
    """

    def __init__(self, *, client: firestore.Client | None = None, project: str | None = None,
                 database: str = "(default)", max_attempts: int = 20) -> None:
        super().__init__(client=client, project=project, database=database)
        self.max_attempts = max_attempts
        self._listeners: list[Callable[[SessionRecord], None]] = []
        self._transactions = DocumentTransactions(stripes=64)

    def _tx(self, ref: Any, fn: Callable[[Any], T]) -> T:
        """Run `fn(transaction)`, a read-modify-write of `ref`, in a transaction."""
        return self._transactions.run(self.client, ref, fn, max_attempts=self.max_attempts)

    def add_listener(self, listener: Callable[[SessionRecord], None]) -> None:
        """Call `listener` with the session after every committed change of its state (in
        this process: other instances' changes are not seen)."""
        self._listeners.append(listener)

    def _notify(self, before: str | None, after: SessionRecord) -> None:
        if before != after.state:
            for listener in self._listeners:
                listener(after)

    # References

    def _run_ref(self, name: str) -> Any:
        return self.client.collection(RUNS).document(doc_id(name))

    def _target_ref(self, run: str, host: str, port: int) -> Any:
        return self._run_ref(run).collection(TARGETS).document(doc_id(f"{host}:{port}"))

    def _session_ref(self, run: str, session: str) -> Any:
        return self.client.collection(SESSIONS).document(f"{doc_id(run)}~{doc_id(session)}")

    def _claim_ref(self, key: str) -> Any:
        return self.client.collection(CLAIMS).document(claim_id(key))

    # Runs

    @staticmethod
    def _run_doc(run: RunRecord) -> dict[str, Any]:
        return {"name": run.name, "discovered": run.discovered, "created_at": run.created_at,
                "terms": search_terms(run.name), "data": _dumps(run.to_dict())}

    @staticmethod
    def _run(snap: Any) -> RunRecord:
        return RunRecord(**json.loads(snap.get("data")))

    def ensure_run(self, name: str, *, discovered: bool, now: float = 0.0) -> RunRecord:
        ref = self._run_ref(name)
        run = RunRecord(name=name, discovered=discovered, created_at=now)
        try:
            # A conditional create is atomic on its own: no transaction (and no contention)
            # for the common case of many files arriving in one run.
            ref.create(self._run_doc(run))
            return run
        except gexc.AlreadyExists:
            return self._run(read(ref))

    def get_run(self, name: str) -> RunRecord | None:
        snap = read(self._run_ref(name))
        return self._run(snap) if snap.exists else None

    def list_runs(self) -> list[RunRecord]:
        runs = [self._run(s) for s in self.client.collection(RUNS).stream()]
        return sorted(runs, key=lambda r: r.name)

    def runs_query(self, query: RunQuery) -> Any:
        """The Firestore query of query_runs (its index is in INDEXES)."""
        ref: Any = self.client.collection(RUNS)
        if query.term:
            ref = ref.where(filter=firestore.FieldFilter("terms", "array_contains", query.term))
        return self._ordered(ref, query.order, query.cursor, 1,
                             lambda key: doc_id(key[0]), query.limit)

    def query_runs(self, query: RunQuery) -> Page[RunRecord]:
        snaps = list(self.runs_query(query).stream())
        items = [self._run(s) for s in snaps[:query.limit]]
        column = query.order[0]
        last = items[-1] if len(snaps) > query.limit else None
        return Page(items, encode_cursor(getattr(last, column), [last.name]) if last else "")

    @staticmethod
    def _ordered(ref: Any, order: tuple[str, bool], cursor: str, key_len: int,
                 name_of: Callable[[list[str]], str], limit: int) -> Any:
        """`ref` ordered on the sort's field, then the document id (the cursor's tie-break),
        after the cursor's row, one row more than a page (to tell whether there is a next)."""
        column, desc = order
        direction = firestore.Query.DESCENDING if desc else firestore.Query.ASCENDING
        ref = ref.order_by(column, direction=direction).order_by("__name__",
                                                                 direction=direction)
        if cursor:
            value, key = decode_cursor(cursor, column, key_len)
            ref = ref.start_after({column: value, "__name__": name_of(key)})
        return ref.limit(limit + 1)

    def register_run(self, run: RunRecord) -> RunRecord:
        ref = self._run_ref(run.name)

        def tx(transaction: Any) -> RunRecord:
            snap = read(ref, transaction)
            if not snap.exists:
                stored = RunRecord(**{**run.to_dict(), "discovered": False})
            else:
                stored = self._run(snap)
                stored.run_group = run.run_group
                stored.configs = dict(run.configs)
                stored.storage_prefix = run.storage_prefix
                stored.on_demand = run.on_demand
                # A registration that names none (`runs create`) keeps what an SDK set.
                stored.rl_orchestrator = run.rl_orchestrator or stored.rl_orchestrator
                stored.discovered = False
            transaction.set(ref, self._run_doc(stored))
            return stored

        return self._tx(ref, tx)

    def set_auto_capture(self, run: str, policy: Mapping[str, Any]) -> RunRecord | None:
        return self._update_run(run, lambda r: setattr(r, "auto_capture", dict(policy)))

    def set_baseline(self, run: str, session: str) -> RunRecord | None:
        return self._update_run(run, lambda r: setattr(r, "baseline", session))

    def _update_run(self, run: str, change: Callable[[RunRecord], None]) -> RunRecord | None:
        """Apply `change` to the stored run, in one transaction; None when it is unknown."""
        ref = self._run_ref(run)

        def tx(transaction: Any) -> RunRecord | None:
            snap = read(ref, transaction)
            if not snap.exists:
                return None
            stored = self._run(snap)
            change(stored)
            transaction.set(ref, self._run_doc(stored))
            return stored

        return self._tx(ref, tx)

    def reserve_capture(self, run: str, now: float, *, cooldown_s: float,
                        max_per_hour: int, key: str = "") -> bool:
        ref = self.client.collection(CAPTURES).document(doc_id(run))
        digest = claim_id(key) if key else ""

        def change(snap: Any) -> tuple[bool, dict[str, Any] | None]:
            times = [float(t) for t in (snap.get("times") if snap.exists else None) or []]
            # Keys of recent reservations (an alert redelivered within a week finds its own).
            keys = {k: float(v) for k, v in
                    ((snap.get("keys") if snap.exists else None) or {}).items()}
            # Given back by failed captures: the cooldown counts them, the hourly cap does not.
            released = [float(t) for t in (snap.get("released") if snap.exists else None) or []]
            if digest and digest in keys:
                return True, None  # the same alert again: its reservation stands
            if (times or released) and now - max(times + released) < cooldown_s:
                return False, None
            if sum(t > now - 3600.0 for t in times) >= max_per_hour:
                return False, None
            # Keep the last hour (the rate limit) and the newest (the cooldown may be longer).
            kept = {t for t in times if t > now - 3600.0} | {max(times, default=now)}
            keys = {k: v for k, v in keys.items() if v > now - _RESERVATION_KEY_S}
            if digest:
                keys[digest] = now
            return True, {"run": run, "times": sorted({*kept, now}), "keys": keys,
                          "released": [max(released)] if released else []}

        # Conditional on the document as read: a storm's racers cannot both reserve.
        return self._swap(ref, change, f"captures of run {run}")

    def release_capture(self, run: str, key: str) -> None:
        if not key:
            return
        ref = self.client.collection(CAPTURES).document(doc_id(run))
        digest = claim_id(key)

        def change(snap: Any) -> tuple[None, dict[str, Any] | None]:
            keys = {k: float(v) for k, v in
                    ((snap.get("keys") if snap.exists else None) or {}).items()}
            if digest not in keys:
                return None, None
            at = keys.pop(digest)
            times = [float(t) for t in snap.get("times") or [] if float(t) != at]
            released = [float(t) for t in snap.get("released") or []]
            return None, {"run": run, "times": times, "keys": keys,
                          "released": [max([*released, at])]}

        self._swap(ref, change, f"captures of run {run}")

    # Targets

    @staticmethod
    def _target_doc(t: TargetRecord) -> dict[str, Any]:
        return {"run": t.run, "host": t.host, "port": t.port, "data": _dumps(t.to_dict())}

    def upsert_target(self, target: TargetRecord) -> None:
        if target.problem():
            raise ValueError(target.problem())
        self._target_ref(target.run, target.host, target.port).set(self._target_doc(target))

    def update_target(self, run: str, host: str, port: int, *,
                      expect: Mapping[str, Any] | None = None,
                      **fields: Any) -> TargetRecord | None:
        ref = self._target_ref(run, host, port)

        def tx(transaction: Any) -> TargetRecord | None:
            snap = read(ref, transaction)
            if not snap.exists:
                return None
            stored = json.loads(snap.get("data"))
            if expect and any(stored.get(k) != v for k, v in expect.items()):
                return None
            target = TargetRecord(**{**stored, **fields})
            transaction.set(ref, self._target_doc(target))
            return target

        return self._tx(ref, tx)

    def list_targets(self, run: str) -> list[TargetRecord]:
        docs = self._run_ref(run).collection(TARGETS).stream()
        targets = usable_targets(TargetRecord(**json.loads(d.get("data"))) for d in docs)
        return sorted(targets, key=lambda t: (t.host, t.port))

    def delete_run(self, name: str) -> bool:
        ref = self._run_ref(name)
        existed = bool(read(ref).exists)
        for target in ref.collection(TARGETS).stream():
            self._mailbox_ref(name, target.get("host")).delete()
            target.reference.delete()
        for point in ref.collection(METRICS).stream():
            point.reference.delete()
        for session in self.client.collection(SESSIONS).where(
                filter=firestore.FieldFilter("run", "==", name)).stream():
            session.reference.delete()
        self.client.collection(CAPTURES).document(doc_id(name)).delete()
        ref.delete()
        return existed

    def delete_target(self, run: str, host: str, port: int | None = None) -> int:
        if port is not None:
            ref = self._target_ref(run, host, port)
            if not read(ref).exists:
                return 0
            ref.delete()
            return 1
        gone = 0
        for d in self._run_ref(run).collection(TARGETS).stream():
            if d.get("host") == host:
                d.reference.delete()
                gone += 1
        return gone

    # Pull targets' requests

    def _mailbox_ref(self, run: str, host: str) -> Any:
        return self.client.collection(REQUESTS).document(f"{doc_id(run)}~{doc_id(host)}")

    @staticmethod
    def _pending(snap: Any) -> list[ControlRequest]:
        if not snap.exists:
            return []
        return [ControlRequest.from_dict(d) for d in json.loads(snap.get("data") or "[]")]

    def _mailbox_doc(self, run: str, host: str, pending: Sequence[ControlRequest],
                     now: float) -> dict[str, Any]:
        return {"run": run, "host": host, "n": len(pending),
                "data": json.dumps([r.to_dict() for r in pending], sort_keys=True,
                                   allow_nan=False),
                "purge_at": _purge_at(now, MAILBOX_RETENTION_S)}

    def put_request(self, request: ControlRequest, now: float) -> bool:
        if request.problem():
            raise ValueError(request.problem())
        ref = self._mailbox_ref(request.run, request.host)

        def change(snap: Any) -> tuple[bool, dict[str, Any] | None]:
            pending = [r for r in self._pending(snap) if r.expires_at > now]
            if any(r.id == request.id for r in pending):
                return True, None
            if len(pending) >= MAX_PENDING_REQUESTS:
                return False, None
            return True, self._mailbox_doc(request.run, request.host, [*pending, request], now)

        return self._swap(ref, change, f"requests of {request.run}/{request.host}")

    def take_requests(self, run: str, host: str, now: float) -> list[ControlRequest]:
        ref = self._mailbox_ref(run, host)

        def change(snap: Any) -> tuple[list[ControlRequest], dict[str, Any] | None]:
            pending = self._pending(snap)
            if not pending:
                return [], None  # the usual poll: one read, no write
            live = sorted((r for r in pending if r.expires_at > now),
                          key=lambda r: (r.created_at, r.id))
            return live, self._mailbox_doc(run, host, [], now)

        return self._swap(ref, change, f"requests of {run}/{host}")

    def withdraw_request(self, run: str, host: str, request_id: str) -> bool:
        ref = self._mailbox_ref(run, host)

        def change(snap: Any) -> tuple[bool, dict[str, Any] | None]:
            pending = self._pending(snap)
            kept = [r for r in pending if r.id != request_id]
            if len(kept) == len(pending):
                return False, None
            return True, self._mailbox_doc(run, host, kept, time.time())

        return self._swap(ref, change, f"requests of {run}/{host}")

    # Sessions

    @staticmethod
    def _session_doc(s: SessionRecord) -> dict[str, Any]:
        return {"run": s.run, "session": s.session, "state": s.state, "version": s.version,
                "updated_at": s.updated_at, "created_at": s.created_at,
                "verdict": s.verdict or "", "trigger": s.trigger,
                "terms": search_terms(s.session), "data": _dumps(s.to_dict())}

    @staticmethod
    def _session(snap: Any) -> SessionRecord:
        return SessionRecord.from_dict(json.loads(snap.get("data")))

    def create_session(self, record: SessionRecord) -> tuple[SessionRecord, bool]:
        """Insert a session unless one of that name exists: (stored session, created)."""
        ref = self._session_ref(record.run, record.session)
        try:
            ref.create(self._session_doc(record))
        except gexc.AlreadyExists:
            return self._session(read(ref)), False
        self._notify(None, record)
        return record, True

    def _swap(self, ref: Any, change: Callable[[Any], tuple[T, dict[str, Any] | None]],
              what: str) -> T:
        """Compare-and-swap on one document; returns change's result.

        `change(snapshot)` returns (result, new document), or (result, None) to leave the
        document as it is. The write is conditional on the document being as read (created
        when it was absent, else unchanged since its update time); after a lost race the
        document is read again. The documents many deliveries touch at once (sessions while
        hosts arrive, claims, a storm's capture reservations) change this way: a conditional
        write takes no lock, where a transaction's read lock makes contenders wait on each
        other and abort.
        """
        for attempt in range(_SWAP_ATTEMPTS):
            snap = read(ref)
            result, doc = change(snap)
            if doc is None:
                return result
            try:
                if snap.exists:
                    ref.update(doc, option=self.client.write_option(
                        last_update_time=snap.update_time))
                else:
                    ref.create(doc)
                return result
            except (gexc.FailedPrecondition, gexc.AlreadyExists, gexc.Aborted, gexc.NotFound):
                # Someone wrote in between: read again (jittered, so racers spread out).
                time.sleep(min(0.5, 0.01 * 2 ** min(attempt, 6)) * random.random())
        raise RuntimeError(f"{what}: still contended after {_SWAP_ATTEMPTS} conditional writes")

    def _swap_session(
        self, run: str, session: str,
        change: Callable[[SessionRecord | None], SessionRecord | None],
    ) -> tuple[SessionRecord | None, SessionRecord | None]:
        """`_swap` on a session: (stored, changed), changed None when left as it was."""

        def on_snapshot(snap: Any) -> tuple[tuple[SessionRecord | None, SessionRecord | None],
                                            dict[str, Any] | None]:
            stored = self._session(snap) if snap.exists else None
            changed = change(copy.deepcopy(stored))
            return (stored, changed), None if changed is None else self._session_doc(changed)

        return self._swap(self._session_ref(run, session), on_snapshot,
                          f"session {run}/{session}")

    def join_session(self, record: SessionRecord, host: str,
                     process_index: int) -> tuple[SessionRecord, bool]:
        def change(s: SessionRecord | None) -> SessionRecord | None:
            s = s or copy.deepcopy(record)
            changed = s.join(host, process_index, record.process_count, record.process_indices)
            return s if changed else None

        before, after = self._swap_session(record.run, record.session, change)
        if after is None:
            assert before is not None  # a new session always changes (its first process)
            return before, False
        if before is None:
            self._notify(None, after)
        return after, before is None

    def register_host(
        self, run: str, session: str, host: str, record: HostRecord, now: float,
        expected_hosts: Sequence[str] = (),
    ) -> tuple[SessionRecord, bool]:
        def change(s: SessionRecord | None) -> SessionRecord | None:
            s = s or SessionRecord.arriving(run, session, now, expected_hosts)
            return s if s.add_host(host, record, now) else None

        before, after = self._swap_session(run, session, change)
        if after is None:
            assert before is not None  # unchanged only when this generation is registered
            return before, False
        self._notify(before.state if before else None, after)
        return after, True

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
        def change(s: SessionRecord | None) -> SessionRecord | None:
            if s is None or not s.move(to, now, expect=expect, version=version, **fields):
                return None
            return s

        before, after = self._swap_session(run, session, change)
        if after is None:
            return None
        assert before is not None
        self._notify(before.state, after)
        return after

    def get_session(self, run: str, session: str) -> SessionRecord | None:
        snap = read(self._session_ref(run, session))
        return self._session(snap) if snap.exists else None

    def sessions_query(self, run: str | None = None, state: str | None = None) -> Any:
        """The query list_sessions runs (each filtered shape has its index in INDEXES)."""
        query: Any = self.client.collection(SESSIONS)
        if run is not None:
            query = query.where(filter=firestore.FieldFilter("run", "==", run))
        if state is not None:
            query = query.where(filter=firestore.FieldFilter("state", "==", state))
        for path in SESSION_QUERIES[(run is not None, state is not None)]:
            query = query.order_by(path)
        return query

    def list_sessions(
        self, run: str | None = None, state: str | None = None
    ) -> list[SessionRecord]:
        return [self._session(s) for s in self.sessions_query(run, state).stream()]

    def fill_list_fields(self) -> int:
        # Documents without the list fields are left out of every ordered query, so they
        # cannot be asked for: one pass over both collections, then a marker says it is done.
        marker = self.client.collection(META).document("list_fields")
        if read(marker).exists:
            return 0
        changed = 0
        for collection, derive in (
                (SESSIONS, lambda snap: {k: v for k, v in self._session_doc(
                    self._session(snap)).items() if k in _SESSION_LIST_FIELDS}),
                (RUNS, lambda snap: {"terms": search_terms(snap.get("name")),
                                     "created_at": self._run(snap).created_at})):
            for snap in self.client.collection(collection).stream():
                if "terms" in (snap.to_dict() or {}):
                    continue
                try:
                    snap.reference.update(derive(snap), option=self.client.write_option(
                        last_update_time=snap.update_time))
                    changed += 1
                except (gexc.FailedPrecondition, gexc.NotFound):
                    pass  # rewritten (with the fields) or deleted meanwhile
        marker.set({"done_at": time.time(), "changed": changed})
        return changed

    def session_list_query(self, query: SessionQuery) -> Any:
        """The Firestore query of query_sessions (its indexes are in INDEXES)."""
        FieldFilter = firestore.FieldFilter  # noqa: N806
        ref: Any = self.client.collection(SESSIONS)
        for name, value in query.filters.items():
            ref = ref.where(filter=FieldFilter(name, "==", value))
        if query.term:
            ref = ref.where(filter=FieldFilter("terms", "array_contains", query.term))
        if query.since is not None:
            ref = ref.where(filter=FieldFilter("created_at", ">=", query.since))
        if query.until is not None:
            ref = ref.where(filter=FieldFilter("created_at", "<", query.until))
        return self._ordered(ref, query.order, query.cursor, 2,
                             lambda key: f"{doc_id(key[0])}~{doc_id(key[1])}", query.limit)

    def query_sessions(self, query: SessionQuery) -> Page[SessionRecord]:
        snaps = list(self.session_list_query(query).stream())
        items = [self._session(s) for s in snaps[:query.limit]]
        column = query.order[0]
        last = items[-1] if len(snaps) > query.limit else None
        return Page(items, encode_cursor(getattr(last, column), [last.run, last.session])
                    if last else "")

    # Claims

    def claim(self, key: str, owner: str, lease_s: float, now: float) -> bool:
        ref = self._claim_ref(key)
        doc = {"key": key, "owner": owner, "done": False, "expires_at": now + lease_s,
               # Firestore's TTL policy (terraform) deletes claims once no redelivery of
               # their event can still come (Pub/Sub keeps messages at most 7 days).
               "purge_at": _purge_at(now, CLAIM_RETENTION_S)}
        try:
            # The conditional create: of concurrent first deliveries, exactly one succeeds.
            ref.create(doc)
            return True
        except gexc.AlreadyExists:
            pass

        # Take over an expired claim: of several takers one write lands; the others read the
        # claim again, find it held, and lose.
        def take_over(snap: Any) -> tuple[bool, dict[str, Any] | None]:
            if snap.exists and (snap.get("done") or snap.get("expires_at") > now):
                return False, None
            return True, doc

        return self._swap(ref, take_over, f"claim {key}")

    def renew(self, key: str, owner: str, lease_s: float, now: float) -> bool:
        ref = self._claim_ref(key)

        def extend(snap: Any) -> tuple[bool, dict[str, Any] | None]:
            if not snap.exists or snap.get("owner") != owner or snap.get("done"):
                return False, None
            return True, {"expires_at": now + lease_s}

        return self._swap(ref, extend, f"renew claim {key}")

    def release(self, key: str, owner: str) -> None:
        ref = self._claim_ref(key)

        def tx(transaction: Any) -> None:
            snap = read(ref, transaction)
            if snap.exists and snap.get("owner") == owner and not snap.get("done"):
                transaction.delete(ref)

        self._tx(ref, tx)

    def complete(self, key: str, owner: str) -> None:
        ref = self._claim_ref(key)

        def tx(transaction: Any) -> None:
            snap = read(ref, transaction)
            if snap.exists and snap.get("owner") == owner:
                transaction.update(ref, {"done": True})

        self._tx(ref, tx)

    # Dead letters

    def count_failure(self, key: str, now: float) -> int:
        ref = self.client.collection(FAILURES).document(claim_id(key))

        def tx(transaction: Any) -> int:
            snap = read(ref, transaction)
            count = (snap.get("count") if snap.exists else 0) + 1
            transaction.set(ref, {"key": key, "count": count, "at": now,
                                  "purge_at": _purge_at(now, FAILURE_RETENTION_S)})
            return int(count)

        return self._tx(ref, tx)

    def record_dead_letter(
        self, topic: str, payload: str, reason: str, attempts: int, now: float
    ) -> None:
        truncated = len(payload.encode()) > MAX_DEAD_LETTER_PAYLOAD
        if truncated:
            payload = payload.encode()[:MAX_DEAD_LETTER_PAYLOAD].decode(errors="ignore")
        self.client.collection(DEAD_LETTERS).add({
            "topic": topic, "payload": payload, "reason": reason[:4096], "attempts": attempts,
            "at": now, "payload_truncated": truncated,
            "purge_at": _purge_at(now, DEAD_LETTER_RETENTION_S),
            # The order of recording; `at` is the caller's clock, which tests may skew.
            "recorded_at": firestore.SERVER_TIMESTAMP,
        })

    def list_dead_letters(self, since: float = 0.0) -> list[dict[str, Any]]:
        collection = self.client.collection(DEAD_LETTERS)
        if since:
            from google.cloud.firestore_v1.base_query import FieldFilter

            docs = collection.where(filter=FieldFilter("at", ">", since)).order_by("at").stream()
        else:
            docs = collection.order_by("recorded_at").stream()
        keys = ("topic", "payload", "reason", "attempts", "at")
        return [{"id": d.id, **{k: d.get(k) for k in keys}} for d in docs]

    # Metrics

    def record_metrics(self, run: str, points: Sequence[MetricPoint]) -> None:
        groups: dict[tuple[str, str], list[MetricPoint]] = {}
        for p in points:
            groups.setdefault((p.name, p.host), []).append(p)
        docs = []
        for (name, host), group in groups.items():
            for i in range(0, len(group), METRIC_CHUNK):
                chunk = group[i:i + METRIC_CHUNK]
                docs.append({"name": name, "host": host, "t0": min(p.at for p in chunk),
                             "t1": max(p.at for p in chunk), "n": len(chunk),
                             "points": json.dumps([p.to_dict() for p in chunk],
                                                  allow_nan=False)})
        collection = self._run_ref(run).collection(METRICS)
        for i in range(0, len(docs), 500):  # a batched write holds at most 500 writes
            batch = self.client.batch()
            for doc in docs[i:i + 500]:
                batch.set(collection.document(), doc)
            batch.commit()

    def list_metrics(self, run: str, name: str | None = None, since: float = 0.0,
                     limit: int | None = None) -> list[MetricPoint]:
        # Newest first on `t1` alone, which its automatic single-field index serves; the name
        # is matched here, since an equality on it next to that order would need a composite
        # index. Documents stream in pages, so a `limit` stops the reading early.
        docs = self._run_ref(run).collection(METRICS).order_by(
            "t1", direction=firestore.Query.DESCENDING).stream()
        chunks = ((snap.get("t1"), json.loads(snap.get("points")))
                  for snap in itertools.takewhile(lambda d: d.get("t1") > since, docs)
                  if name is None or snap.get("name") == name)
        return newest_points(chunks, since, limit)
