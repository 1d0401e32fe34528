"""Ports: the small interfaces the stages depend on. Adapters need not inherit from them.

Each fits both the embedded adapter (local directory, SQLite, in-process bus) and its Google
Cloud counterpart (GCS, Firestore, Pub/Sub) without change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mldiag.analysis import FollowUps, Triage
from mldiag.listing import Page, RunQuery, SessionQuery
from mldiag.messages import Message
from mldiag.model import (
    ControlRequest,
    HostRecord,
    MetricPoint,
    RunRecord,
    SessionRecord,
    TargetRecord,
)


@dataclass(frozen=True)
class ObjectInfo:
    """Metadata of one stored object. `generation` changes on every rewrite."""

    name: str
    size: int
    generation: str
    updated: float


class Storage(Protocol):
    """The profile bucket: a local directory or a GCS bucket."""

    bucket: str

    def stat(self, name: str) -> ObjectInfo | None: ...

    def read_bytes(self, name: str) -> bytes: ...

    def write_bytes(
        self, name: str, data: bytes, *, content_type: str = "application/octet-stream",
        if_absent: bool = False,
    ) -> ObjectInfo:
        """Write an object; the write emits an object-finalize event like any other.

        With `if_absent`, only create it: FileExistsError when it exists already."""
        ...

    def list(self, prefix: str) -> list[ObjectInfo]: ...

    def content_hash(self, info: ObjectInfo) -> str:
        """`md5:<base64>` (or `crc32c:<base64>`) of the object at `info`'s generation; ""
        when it is no longer that generation or the hash cannot be had. Intake asks only
        when a host's object is rewritten at the same size (the same bytes again?)."""
        ...

    def fetch_to(self, name: str, path: Path) -> None:
        """Copy one object to a local file without holding it in memory (locally a hard
        link where it can be). FileNotFoundError when it does not exist."""
        ...

    def put_file(self, name: str, path: Path, *,
                 content_type: str = "application/octet-stream") -> ObjectInfo:
        """Write a local file as an object, streamed (a finalize event like any write)."""
        ...

    def uri(self, name: str) -> str:
        """A location users can open: `file:///...` locally, `gs://bucket/...` on GCP."""
        ...

    def supersede(self, name: str, at: float) -> None:
        """Mark an object superseded at `at` (nothing reads it any more): the bucket's
        lifecycle deletes it `superseded_retention_days` later (on GCS its customTime, which
        nothing else sets; locally `mldiag gc`). A mark is never moved later. Nothing
        happens when the object is gone."""
        ...

    def local_files(self, names: Sequence[str], *,
                    generations: Mapping[str, str] | None = None,
                    max_bytes: int | None = None) -> AbstractContextManager[Path]:
        """Materialise objects as local files in one directory, for xprof to read.

        The directory keeps the objects' base names; it is removed (or left alone, when it is
        the storage itself) on exit. With `generations`, exactly those generations are read
        (ProfileUnreadable when one was rewritten since); objects over `max_bytes` are refused
        before any byte is downloaded.
        """
        ...


class StateStore(Protocol):
    """Runs, sessions, idempotency claims and dead letters (SQLite or Firestore)."""

    def ensure_run(self, name: str, *, discovered: bool, now: float = 0.0) -> RunRecord: ...

    def get_run(self, name: str) -> RunRecord | None: ...

    def list_runs(self) -> list[RunRecord]: ...

    def query_runs(self, query: RunQuery) -> Page[RunRecord]:
        """One page of runs: those whose name `query.search` matches (a word prefix), in
        `query.sort` order (ties by name), after `query.cursor` (a page's `next_cursor`),
        at most `query.limit`. BadQuery for a cursor this store did not make."""
        ...

    def register_run(self, run: RunRecord) -> RunRecord:
        """Create a run, or update a run's registration (run_group, configs, storage_prefix,
        on_demand; `discovered` cleared), keeping its created_at, auto-capture policy and
        baseline."""
        ...

    def set_auto_capture(self, run: str, policy: Mapping[str, Any]) -> RunRecord | None:
        """Replace a run's auto-capture policy; None when the run does not exist."""
        ...

    def set_baseline(self, run: str, session: str) -> RunRecord | None:
        """Pin the session that the run's alert-triggered sessions are compared with ("" to
        unpin: the most recent OPTIMAL session then); None when the run does not exist."""
        ...

    def reserve_capture(self, run: str, now: float, *, cooldown_s: float,
                        max_per_hour: int, key: str = "") -> bool:
        """Atomically record an automatic capture of `run` at `now`, unless one was recorded
        less than `cooldown_s` ago or `max_per_hour` were recorded in the last 3600 s.

        A reservation already recorded under the same non-empty `key` (the alert) is granted
        again, so a redelivered alert whose first publish failed still gets its capture."""
        ...

    def release_capture(self, run: str, key: str) -> None:
        """Give back the reservation recorded under `key` (its capture failed): it no longer
        counts for the hourly cap, nor as `key`'s reservation. The cooldown still runs from it,
        so a storm against a failing target makes one attempt per cooldown. Nothing happens
        for an unknown key."""
        ...

    def upsert_target(self, target: TargetRecord) -> None: ...

    def update_target(self, run: str, host: str, port: int, *,
                      expect: Mapping[str, Any] | None = None,
                      **fields: Any) -> TargetRecord | None:
        """Change some fields of a target (heartbeat, continuous state) in one transaction;
        None when the target is not registered. With `expect`, only while the stored record's
        fields equal it (None otherwise): a process marking its own target stopped must not
        touch a newer process's record of the same host and port."""
        ...

    def list_targets(self, run: str) -> list[TargetRecord]: ...

    def delete_run(self, name: str) -> bool:
        """Forget a run and what the store keeps under it (targets, sessions, their pending
        requests, capture reservations, metrics); False when it was not registered. The
        profiles in the bucket stay."""
        ...

    def delete_target(self, run: str, host: str, port: int | None = None) -> int:
        """Forget the run's target `host` (on `port`, or on every port); how many records
        went (0: none was registered)."""
        ...

    def put_request(self, request: ControlRequest, now: float) -> bool:
        """Leave a request in its pull target's mailbox (`request.run`, `request.host`).

        Idempotent by `request.id`. Requests expired at `now` are dropped first; False, and
        nothing stored, when the mailbox still holds MAX_PENDING_REQUESTS live ones.
        ValueError on a request with a `problem()`."""
        ...

    def take_requests(self, run: str, host: str, now: float) -> list[ControlRequest]:
        """Remove and return the live requests of (run, host), oldest first, in one atomic
        step (expired ones are dropped): of concurrent takers, each request goes to exactly
        one, so a request is served once however many processes poll."""
        ...

    def withdraw_request(self, run: str, host: str, request_id: str) -> bool:
        """Remove one request nobody took yet (its asker stopped waiting); False when it is
        not pending (taken, expired and dropped, or never put)."""
        ...

    def create_session(self, record: SessionRecord) -> tuple[SessionRecord, bool]:
        """Insert a session unless one of that name exists: (stored session, created)."""
        ...

    def join_session(self, record: SessionRecord, host: str,
                     process_index: int) -> tuple[SessionRecord, bool]:
        """Create `record` unless its session exists, and record that process `process_index`
        of its job captures into it as `host` (`SessionRecord.join`, with the record's
        process count and indices), in one transaction: (stored session, created).

        A process of a job that starts after the others stopped joins the same session,
        whatever state it is in."""
        ...

    def register_host(
        self, run: str, session: str, host: str, record: HostRecord, now: float,
        expected_hosts: Sequence[str] = (),
    ) -> tuple[SessionRecord, bool]:
        """Add a host to a session, creating the session if needed, in one transaction.

        A session created here expects `expected_hosts` (the run's targets); one created
        earlier (by a capture request) keeps its own list.

        Returns the session and whether the host is new. A new host arriving once analysis
        has started (or after the report) starts the next analysis version.
        """
        ...

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
        """Move a session to state `to` if it is in one of `expect` (and at `version`).

        Returns the updated session, or None when the precondition does not hold, so that
        exactly one of several concurrent deliveries wins.
        """
        ...

    def get_session(self, run: str, session: str) -> SessionRecord | None: ...

    def list_sessions(
        self, run: str | None = None, state: str | None = None
    ) -> list[SessionRecord]: ...

    def fill_list_fields(self) -> int:
        """Give the runs and sessions stored before list queries existed the fields those
        filter and sort on, once per store (later calls cost one read); how many records it
        changed. A record rewritten meanwhile is left alone: its writer stored them."""
        ...

    def query_sessions(self, query: SessionQuery) -> Page[SessionRecord]:
        """One page of sessions matching every filter of `query` (run, state, verdict,
        trigger, a word prefix of the name, created_at in [since, until)), in `query.sort`
        order (ties in the store's own key order, the same on every page), after
        `query.cursor`, at most `query.limit`: a page reads `limit + 1` records however many
        match. BadQuery for a cursor this store did not make."""
        ...

    def claim(self, key: str, owner: str, lease_s: float, now: float) -> bool:
        """Conditionally create (or take over an expired) claim; False if held or done."""
        ...

    def renew(self, key: str, owner: str, lease_s: float, now: float) -> bool:
        """Extend a claim `owner` holds to `now + lease_s` (work that runs longer than a
        lease keeps it); False when it is no longer theirs (taken over, released or done)."""
        ...

    def release(self, key: str, owner: str) -> None:
        """Drop a claim after a failure, so a redelivery can take it."""
        ...

    def complete(self, key: str, owner: str) -> None:
        """Mark a claim done: later deliveries of the same key are duplicates."""
        ...

    def count_failure(self, key: str, now: float) -> int:
        """Count one more failed attempt at the work `key` (a delivery's event id) and
        return how many there have been. Lets a function tell its own failures from the
        platform's throttling, which redelivers without running it."""
        ...

    def record_dead_letter(
        self, topic: str, payload: str, reason: str, attempts: int, now: float
    ) -> None: ...

    def list_dead_letters(self, since: float = 0.0) -> list[dict[str, Any]]:
        """Dead letters recorded after `since` (all by default), oldest first."""
        ...

    def record_metrics(self, run: str, points: Sequence[MetricPoint]) -> None:
        """Append a batch of a run's recorded metrics in one write (the SDK batches them)."""
        ...

    def list_metrics(self, run: str, name: str | None = None, since: float = 0.0,
                     limit: int | None = None) -> list[MetricPoint]:
        """A run's metric points recorded after `since` (of one `name`, or all), oldest
        first; with `limit`, only the newest `limit` of them (read newest first, so a long
        run's chart does not read its whole history)."""
        ...


class Bus(Protocol):
    """Topics with at-least-once delivery (the in-process bus or Pub/Sub)."""

    def publish(self, message: Message, attributes: Mapping[str, str] | None = None) -> str: ...


class JobRunner(Protocol):
    """Starts a stage on a bigger engine than a function instance: the collect job (a Cloud
    Run job on GCP, a separate process locally), which runs the same stage code."""

    def run(self, message: Message) -> str:
        """Start the job on `message`; returns the execution's name. Raises if it cannot."""
        ...


class Investigator(Protocol):
    """Turns a health snapshot and its triage into findings, with at most 4 follow-up calls.

    Returns the investigation.json document: `investigator`, `hypotheses`, `follow_ups`,
    `findings` and `summary`.
    """

    name: str

    def investigate(
        self, snapshot: Mapping[str, Any], triage: Triage, follow_ups: FollowUps
    ) -> dict[str, Any]: ...



class RunOwners(Protocol):
    """Which workload identity a run belongs to (the registration function's tenancy)."""

    def bind(self, run: str, owner: str, now: float) -> str:
        """Make `owner` the run's owner unless it has one (a conditional create); returns the
        run's owner, `owner` or whoever bound it first."""
        ...

    def owner(self, run: str) -> str | None: ...


class UploadSigner(Protocol):
    """Grants one upload of one object without any other access to the bucket."""

    def upload_url(self, name: str, *, content_type: str, expires_s: float) -> str:
        """A URL that accepts one `PUT` of object `name` with that Content-Type, and nothing
        else, until it expires."""
        ...


Clock = Callable[[], float]
Listener = Callable[[SessionRecord], None]
