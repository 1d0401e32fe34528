"""A workload's side of tenancy: the SDK's state and uploads through the `register` function.

With MLDIAG_REGISTRATION_URL set, `bootstrap.control_plane` gives the SDK these adapters
instead of Firestore and GCS, so a workload needs no role on either (DESIGN.md "Tenancy"):

- `RegistrationStateStore`: the state-store calls the SDK makes (register its run and
  auto-capture policy, register, heartbeat and list its targets, take their capture requests,
  create and join its programmatic sessions, record a failed upload), each one a request to
  the function;
- `SignedUrlStorage`: `write_bytes` of a profile asks the function for a signed URL for exactly
  that object, then `PUT`s the bytes to it.

Every request carries a Google ID token of the workload's service account for the function's
URL (the metadata server's, through `google.oauth2.id_token.fetch_id_token`). Anything else
the full ports offer is refused here with the reason: a workload has no such access.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mldiag.errors import MldiagError
from mldiag.model import (
    ControlRequest,
    HostRecord,
    MetricPoint,
    RunRecord,
    SessionRecord,
    TargetRecord,
    parse_object_name,
)
from mldiag.ports import ObjectInfo

# Google ID tokens last an hour; fetch a new one well before.
TOKEN_REUSE_S = 1800.0


class RegistrationRefused(MldiagError):
    """The registration function refused a request (not this workload's run, bad input).

    Permanent: a 4xx answer (5xx answers and network errors are retried before anything is
    raised).
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"registration refused ({status}): {message}")
        self.status = status


def _fetch_id_token(audience: str) -> str:
    from google.auth.transport.requests import Request
    from google.oauth2 import id_token

    return str(id_token.fetch_id_token(Request(), audience))


class RegistrationClient:
    """POSTs JSON requests to the registration function as this workload's identity.

    `token_source(audience)` returns a Google ID token (default: the ambient credentials').
    A 4xx answer raises RegistrationRefused; a 5xx or a network error is retried, then raises.
    """

    def __init__(self, url: str, *, token_source: Callable[[str], str] | None = None,
                 timeout_s: float = 30.0, attempts: int = 3) -> None:
        if not url:
            raise MldiagError("the registration client needs MLDIAG_REGISTRATION_URL")
        self.url = url
        self._token_source = token_source or _fetch_id_token
        self.timeout_s = timeout_s
        self.attempts = attempts
        self._token: tuple[float, str] | None = None
        self._lock = threading.Lock()

    def _id_token(self) -> str:
        with self._lock:
            if self._token is None or time.monotonic() - self._token[0] > TOKEN_REUSE_S:
                self._token = (time.monotonic(), self._token_source(self.url))
            return self._token[1]

    def call(self, op: str, **body: Any) -> dict[str, Any]:
        """One request; the function's JSON answer."""
        data = json.dumps({"op": op, **body}).encode()
        for attempt in range(self.attempts):
            request = urllib.request.Request(self.url, data=data, method="POST", headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {self._id_token()}"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as f:  # noqa: S310
                    answer: dict[str, Any] = json.loads(f.read())
                    return answer
            except urllib.error.HTTPError as e:
                text = e.read().decode(errors="replace")
                try:
                    message = str(json.loads(text).get("error", text))
                except ValueError:
                    message = text
                if e.code < 500 or attempt == self.attempts - 1:
                    raise RegistrationRefused(e.code, message.strip() or e.reason) from e
            except (urllib.error.URLError, OSError) as e:
                if attempt == self.attempts - 1:
                    raise MldiagError(f"registration function {self.url} unreachable: "
                                      f"{e}") from e
            time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")


class WorkloadRefused(MldiagError, AttributeError):
    """An operation a workload may not do (it is not an attribute of the workload's ports).

    Permanent: a workload never has this access.
    """


def _refused(what: str) -> WorkloadRefused:
    return WorkloadRefused(f"{what}: a workload registers and uploads through the registration "
                       "function, and has no other access to mldiag's state or bucket")


class RegistrationStateStore:
    """The state-store calls the SDK makes, as requests to the registration function."""

    def __init__(self, client: RegistrationClient) -> None:
        self.client = client

    def register_run(self, run: RunRecord) -> RunRecord:
        answer = self.client.call("register_run", run=run.to_dict())
        return RunRecord(**answer["run"])

    def set_auto_capture(self, run: str, policy: Mapping[str, Any]) -> RunRecord | None:
        answer = self.client.call("set_auto_capture", run=run, policy=dict(policy))
        return RunRecord(**answer["run"])

    def upsert_target(self, target: TargetRecord) -> None:
        self.client.call("upsert_target", target=target.to_dict())

    def update_target(self, run: str, host: str, port: int, *,
                      expect: Mapping[str, Any] | None = None,
                      **fields: Any) -> TargetRecord | None:
        answer = self.client.call("update_target", run=run, host=host, port=port,
                                  fields=fields, expect=dict(expect or {}))
        found = answer.get("target")
        return TargetRecord(**found) if found else None

    def list_targets(self, run: str) -> list[TargetRecord]:
        answer = self.client.call("list_targets", run=run)
        return [TargetRecord(**t) for t in answer["targets"]]

    def take_requests(self, run: str, host: str, now: float) -> list[ControlRequest]:
        """This target's capture requests (pull delivery), taken; `now` is the function's."""
        answer = self.client.call("take_requests", run=run, host=host)
        return [ControlRequest.from_dict(r) for r in answer["requests"]]

    def create_session(self, record: SessionRecord) -> tuple[SessionRecord, bool]:
        answer = self.client.call("create_session", session=record.to_dict())
        return SessionRecord.from_dict(answer["session"]), bool(answer["created"])

    def join_session(self, record: SessionRecord, host: str,
                     process_index: int) -> tuple[SessionRecord, bool]:
        answer = self.client.call("join_session", session=record.to_dict(), host=host,
                                  process_index=process_index)
        return SessionRecord.from_dict(answer["session"]), bool(answer["created"])

    def register_host(self, run: str, session: str, host: str, record: HostRecord,
                      now: float, expected_hosts: Any = ()) -> tuple[SessionRecord, bool]:
        """Only a failed upload is recorded by the workload; an upload itself registers its
        host through the bucket's finalize event."""
        if record.status != "FAILED":
            raise _refused(f"registering host {host} of {run}/{session} as {record.status}")
        answer = self.client.call("host_failed", run=run, session=session, host=host,
                                  reason=record.reason)
        return SessionRecord.from_dict(answer["session"]), bool(answer["new"])

    def record_metrics(self, run: str, points: Sequence[MetricPoint]) -> None:
        self.client.call("record_metrics", run=run, points=[p.to_dict() for p in points])

    def __getattr__(self, name: str) -> Any:
        raise _refused(f"state store operation {name}")


class SignedUrlStorage:
    """Profile uploads through signed URLs from the registration function."""

    def __init__(self, client: RegistrationClient, bucket: str, *,
                 timeout_s: float = 600.0) -> None:
        self.client = client
        self.bucket = bucket
        self.timeout_s = timeout_s

    def write_bytes(self, name: str, data: bytes, *,
                    content_type: str = "application/octet-stream",
                    if_absent: bool = False) -> ObjectInfo:
        """Upload one host's xplane, `<prefix>/<run>/plugins/profile/<session>/<host>.xplane.pb`."""
        profile = parse_object_name(name)
        if profile is None or profile.suffix != ".xplane.pb":
            raise _refused(f"writing {name!r}")
        grant = self.client.call("upload_url", run=profile.run, session=profile.session,
                                 host=profile.host)
        if grant["object"] != name:
            raise MldiagError(f"the registration function signed {grant['object']!r} for "
                              f"{name!r}: is gcs_path's prefix the run's storage prefix?")
        request = urllib.request.Request(grant["url"], data=data, method=grant["method"],
                                         headers=dict(grant["headers"]))
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as f:  # noqa: S310
                generation = f.headers.get("x-goog-generation", "")
        except urllib.error.HTTPError as e:
            raise MldiagError(f"upload of {name} refused ({e.code}): "
                              f"{e.read().decode(errors='replace')[:500]}") from e
        return ObjectInfo(name=name, size=len(data), generation=str(generation),
                          updated=time.time())

    def uri(self, name: str) -> str:
        return f"gs://{self.bucket}/{name}"

    def __getattr__(self, name: str) -> Any:
        raise _refused(f"storage operation {name}")
