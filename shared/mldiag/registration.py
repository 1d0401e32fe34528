"""The registration stage: what a workload may do to its own runs, and nothing else.

On Google Cloud a workload (the SDK inside a training job) holds no role on Firestore or the
profile bucket. It calls the IAM-authenticated `register` function instead, with a Google ID
token of its service account, and this stage decides (DESIGN.md "Tenancy"):

- the first identity that registers a run owns it (a conditional create, `RunOwners.bind`),
  whether the run is new, created by an admin (`mldiag runs create`) or discovered from the
  bucket; every later call about that run from another identity is refused;
- the owner may register and update its run, its auto-capture policy and its targets,
  heartbeat them, list its own targets, take the capture requests left for them (pull
  delivery, `take_requests`), create or join its programmatic sessions (every process of a
  job joins, whenever it starts), record that a host's upload failed and record its
  metrics;
- it uploads through signed URLs that allow one `PUT` of exactly
  `<prefix>/<run>/plugins/profile/<session>/<host>.xplane.pb` (`UploadSigner`), so a workload
  never reads, overwrites or deletes any other object.

`handle(request, caller, services)` takes the request body (a JSON object with `op`) and the
verified caller; it returns the JSON answer or raises a `RegistrationError` with its HTTP
status. `authenticate` turns the `Authorization` header into the caller.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mldiag.capture import pull
from mldiag.capture.targets import address_holders, check_target_cap
from mldiag.errors import MldiagError
from mldiag.model import (
    CAPTURING,
    AutoCapturePolicy,
    HostRecord,
    MetricPoint,
    RunRecord,
    SessionRecord,
    TargetRecord,
    check_name,
)
from mldiag.ports import RunOwners, StateStore, UploadSigner
from mldiag.settings import Settings

XPLANE_CONTENT_TYPE = "application/octet-stream"
# A signed upload URL lives this long: long enough for a 2 GiB upload on a slow link.
UPLOAD_URL_TTL_S = 3600.0
# What a workload may change on its own targets after registering them (`last_request` and
# `last_error` answer a pulled continuous start/stop).
TARGET_UPDATE_FIELDS = frozenset({"last_heartbeat", "pid", "continuous", "continuous_since",
                                  "last_request", "last_error"})
# What a workload's update may be conditional on: the process that owns the record.
TARGET_OWNER_FIELDS = frozenset({"pid", "registered_at"})
CONTINUOUS_STATES = frozenset({"OFF", "RING", "NATIVE"})


class RegistrationError(MldiagError):
    """A refused registration request; `status` is its HTTP status.

    Permanent: the same request is refused again.
    """

    status = 400


class NotAuthenticated(RegistrationError):
    """The request carries no valid Google ID token for this function (401).

    Permanent: the same token is refused again.
    """

    status = 401


class NotYourRun(RegistrationError):
    """The caller is not the run's owner (403). Permanent."""

    status = 403


@dataclass
class Registrar:
    """The registration stage's services: the state store, the run owners and the signer."""

    settings: Settings
    state: StateStore
    owners: RunOwners
    uploads: UploadSigner
    clock: Callable[[], float] = time.time


def authenticate(authorization: str, settings: Settings) -> str:
    """The service-account email of a `Bearer <Google ID token>` header minted for this
    function (MLDIAG_REGISTRATION_URL is its audience); NotAuthenticated otherwise.
    KeysUnavailable (Google's keys cannot be fetched) propagates: a transient error."""
    from mldiag.identity import InvalidToken, verify_google_id_token

    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise NotAuthenticated("send `Authorization: Bearer <Google ID token>` whose audience "
                               "is this function's URL")
    try:
        return verify_google_id_token(token.strip(), settings.registration_url,
                                      settings.id_token_certs_url)
    except InvalidToken as e:
        raise NotAuthenticated(f"Google ID token refused: {e}") from e


def _record[R](kind: type[R], data: Any, what: str) -> R:
    """A model record from a JSON object, refusing fields the record does not have."""
    if not isinstance(data, Mapping):
        raise RegistrationError(f"{what} must be a JSON object")
    known = {f.name for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise RegistrationError(f"{what}: unknown field(s) {', '.join(unknown)}")
    try:
        return kind(**data)
    except (TypeError, ValueError) as e:
        raise RegistrationError(f"{what}: {e}") from e


def _name(kind: str, value: Any) -> str:
    try:
        return check_name(kind, value)
    except ValueError as e:
        raise RegistrationError(str(e)) from e


def _field(body: Mapping[str, Any], key: str, kind: type, what: str = "") -> Any:
    value = body.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise RegistrationError(f"{what or key} must be a {kind.__name__}")
    return value


def _owned(services: Registrar, run: str, caller: str) -> RunRecord:
    """The run, when `caller` owns it; NotYourRun otherwise (also for unknown runs, so that
    a caller learns nothing about runs that are not its own)."""
    owner = services.owners.owner(run)
    record = services.state.get_run(run) if owner == caller else None
    if record is None:
        raise NotYourRun(f"run {run!r} is not registered by {caller}")
    return record


def _register_run(body: Mapping[str, Any], caller: str, services: Registrar) -> dict[str, Any]:
    run = _record(RunRecord, body.get("run"), "run")
    _name("run", run.name)
    # The prefix comes before the run in every object name the function signs.
    for segment in run.storage_prefix.split("/") if run.storage_prefix else ():
        _name("storage prefix segment", segment)
    owner = services.owners.bind(run.name, caller, services.clock())
    if owner != caller:
        raise NotYourRun(f"run {run.name!r} is not registered by {caller}")
    stored = services.state.register_run(dataclasses.replace(
        run, discovered=False, auto_capture={}, created_at=run.created_at or services.clock()))
    return {"run": stored.to_dict()}


def _set_auto_capture(body: Mapping[str, Any], caller: str,
                      services: Registrar) -> dict[str, Any]:
    run = _name("run", body.get("run"))
    _owned(services, run, caller)
    policy = body.get("policy")
    try:
        checked = AutoCapturePolicy.from_dict(dict(policy) if isinstance(policy, Mapping)
                                              else None)
    except (TypeError, ValueError) as e:
        raise RegistrationError(f"policy: {e}") from e
    stored = services.state.set_auto_capture(run, checked.to_dict())
    assert stored is not None  # _owned found it
    return {"run": stored.to_dict()}


def _upsert_target(body: Mapping[str, Any], caller: str, services: Registrar) -> dict[str, Any]:
    """Register one of the caller's targets. A push target's address belongs to one run: an
    address that another run holds is refused unless the caller owns that run too; a run
    holds at most `max_targets_per_run` targets; liveness is the prober's to record."""
    target = _record(TargetRecord, body.get("target"), "target")
    _owned(services, _name("run", target.run), caller)
    _name("host", target.host)
    # What the background prober records is not the workload's to claim.
    target = dataclasses.replace(target, probe_state="", probe_reason="", probed_at=0.0)
    targets = services.state.list_targets(target.run)
    try:
        check_target_cap(services.settings, target.run,
                         len({t.host for t in targets} | {target.host}))
    except MldiagError as e:
        raise RegistrationError(str(e)) from e
    if not target.pulls:
        now = services.clock()
        for other in address_holders(services.state, services.settings, target.address,
                                     target.port, exclude=target.run, now=now):
            if services.owners.owner(other) != caller:
                raise NotYourRun(
                    f"{target.address}:{target.port} is the profiler of another run, which "
                    f"holds it as a push target: registering it on run {target.run!r} needs "
                    "rights on that run (its owner, or an admin)")
    services.state.upsert_target(target)
    return {"target": target.to_dict()}


def _update_target(body: Mapping[str, Any], caller: str, services: Registrar) -> dict[str, Any]:
    run = _name("run", body.get("run"))
    _owned(services, run, caller)
    host = _name("host", body.get("host"))
    port = _field(body, "port", int)
    fields = body.get("fields")
    if not isinstance(fields, Mapping) or not fields:
        raise RegistrationError("fields must be a non-empty JSON object")
    refused = sorted(set(fields) - TARGET_UPDATE_FIELDS)
    if refused:
        raise RegistrationError(f"a workload may not change {', '.join(refused)} (only "
                                f"{', '.join(sorted(TARGET_UPDATE_FIELDS))})")
    if "continuous" in fields and fields["continuous"] not in CONTINUOUS_STATES:
        raise RegistrationError(f"continuous must be one of {', '.join(sorted(CONTINUOUS_STATES))}")
    expect = body.get("expect") or {}
    if not isinstance(expect, Mapping) or set(expect) - TARGET_OWNER_FIELDS:
        raise RegistrationError("expect must be a JSON object of "
                                f"{', '.join(sorted(TARGET_OWNER_FIELDS))}")
    updated = services.state.update_target(run, host, port, expect=dict(expect),
                                           **dict(fields))
    return {"target": updated.to_dict() if updated is not None else None}


def _take_requests(body: Mapping[str, Any], caller: str, services: Registrar) -> dict[str, Any]:
    """The capture requests waiting for one of the caller's targets, taken (pull delivery:
    mldiag.capture.pull); each goes to exactly one caller."""
    run = _owned(services, _name("run", body.get("run")), caller)
    host = _name("host", body.get("host"))
    taken = pull.take_requests(services.state, run.name, host, services.clock())
    return {"requests": [r.to_dict() for r in taken]}


def _list_targets(body: Mapping[str, Any], caller: str, services: Registrar) -> dict[str, Any]:
    run = _name("run", body.get("run"))
    _owned(services, run, caller)
    return {"targets": [t.to_dict() for t in services.state.list_targets(run)]}


def _workload_session(body: Mapping[str, Any], caller: str,
                      services: Registrar) -> SessionRecord:
    """The body's `session`, of a run the caller owns, with valid names."""
    data = body.get("session")
    if not isinstance(data, Mapping):
        raise RegistrationError("session must be a JSON object")
    try:
        record = SessionRecord.from_dict(dict(data))
    except (TypeError, ValueError, KeyError) as e:
        raise RegistrationError(f"session: {e}") from e
    _owned(services, _name("run", record.run), caller)
    _name("session", record.session)
    return record


def _create_session(body: Mapping[str, Any], caller: str,
                    services: Registrar) -> dict[str, Any]:
    record = _workload_session(body, caller, services)
    # A workload announces its own programmatic captures; the pipeline does the rest.
    if record.kind != "programmatic" or record.state != CAPTURING or record.hosts:
        raise RegistrationError("a workload creates only programmatic sessions, CAPTURING, "
                                "with no hosts yet")
    for host in record.expected_hosts:
        _name("host", host)
    stored, created = services.state.create_session(record)
    return {"session": stored.to_dict(), "created": created}


# The most processes a job may say it has (a pod of 256 hosts of 4 processes is 1024).
MAX_JOB_PROCESSES = 65536


def _join_session(body: Mapping[str, Any], caller: str, services: Registrar) -> dict[str, Any]:
    """A process of a job captures into a programmatic session: created by the first process
    of the job that gets here, joined by every other, at any time (one that starts after
    the others finished joins the same session)."""
    record = _workload_session(body, caller, services)
    host = _name("host", body.get("host"))
    index = _field(body, "process_index", int)
    if record.kind != "programmatic" or record.state != CAPTURING or record.hosts or (
            record.processes or record.superseded):
        raise RegistrationError("a workload joins only programmatic sessions, CAPTURING, "
                                "with no hosts or processes yet")
    for name in record.expected_hosts:
        _name("host", name)
    count, indices = record.process_count, record.process_indices
    if (not isinstance(count, int) or isinstance(count, bool)
            or not 0 <= count <= MAX_JOB_PROCESSES):
        raise RegistrationError(f"process_count must be an int in [0, {MAX_JOB_PROCESSES}]")
    if not isinstance(indices, list) or any(
            not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < max(count, 1)
            for i in indices):
        raise RegistrationError("process_indices must be a list of process indices in "
                                "[0, process_count)")
    if not 0 <= index < max(count, 1):
        raise RegistrationError(f"process_index {index} is not in [0, {max(count, 1)})")
    stored, created = services.state.join_session(record, host, index)
    return {"session": stored.to_dict(), "created": created}


def _object_name(run: RunRecord, session: str, host: str) -> str:
    parts = [run.storage_prefix, run.name, "plugins", "profile", session, f"{host}.xplane.pb"]
    return "/".join(p for p in parts if p)


def _host_failed(body: Mapping[str, Any], caller: str, services: Registrar) -> dict[str, Any]:
    run = _owned(services, _name("run", body.get("run")), caller)
    session = _name("session", body.get("session"))
    host = _name("host", body.get("host"))
    reason = _field(body, "reason", str)
    now = services.clock()
    stored, new = services.state.register_host(run.name, session, host, HostRecord(
        object_name=_object_name(run, session, host), generation="", size=0, arrived_at=now,
        status="FAILED", reason=reason[:2000]), now)
    return {"session": stored.to_dict(), "new": new}


# Points of one record_metrics request (the SDK's writer sends at most 1000 a batch).
MAX_METRIC_POINTS = 5000


def _record_metrics(body: Mapping[str, Any], caller: str,
                    services: Registrar) -> dict[str, Any]:
    run = _owned(services, _name("run", body.get("run")), caller)
    raw = body.get("points")
    if not isinstance(raw, list) or len(raw) > MAX_METRIC_POINTS:
        raise RegistrationError(f"points must be a list of at most {MAX_METRIC_POINTS} "
                                "metric points")
    points = [_record(MetricPoint, p, "metric point") for p in raw]
    services.state.record_metrics(run.name, points)
    return {"recorded": len(points)}


def _upload_url(body: Mapping[str, Any], caller: str, services: Registrar) -> dict[str, Any]:
    run = _owned(services, _name("run", body.get("run")), caller)
    name = _object_name(run, _name("session", body.get("session")),
                        _name("host", body.get("host")))
    url = services.uploads.upload_url(name, content_type=XPLANE_CONTENT_TYPE,
                                      expires_s=UPLOAD_URL_TTL_S)
    return {"object": name, "url": url, "method": "PUT",
            "headers": {"Content-Type": XPLANE_CONTENT_TYPE},
            "expires_at": services.clock() + UPLOAD_URL_TTL_S}


OPERATIONS: dict[str, Callable[[Mapping[str, Any], str, Registrar], dict[str, Any]]] = {
    "create_session": _create_session,
    "host_failed": _host_failed,
    "join_session": _join_session,
    "list_targets": _list_targets,
    "record_metrics": _record_metrics,
    "register_run": _register_run,
    "set_auto_capture": _set_auto_capture,
    "take_requests": _take_requests,
    "update_target": _update_target,
    "upload_url": _upload_url,
    "upsert_target": _upsert_target,
}


def handle(request: Any, caller: str, services: Registrar) -> dict[str, Any]:
    """Carry out one registration request of `caller` (a verified service-account email)."""
    if not isinstance(request, Mapping):
        raise RegistrationError("the request body must be a JSON object with `op`")
    op = request.get("op")
    handler = OPERATIONS.get(op) if isinstance(op, str) else None
    if handler is None:
        raise RegistrationError(f"unknown op {op!r}; one of {', '.join(OPERATIONS)}")
    return handler(request, caller, services)
