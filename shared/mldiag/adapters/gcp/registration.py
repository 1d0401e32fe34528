"""The registration function's side of tenancy: run owners in Firestore, signed upload URLs.

- `FirestoreRunOwners`: `run_owners/{run}` holds the service account that registered the run
  first, created with a conditional create (Firestore `create`), so two workloads racing for
  one name get one owner.
- `GcsUploadSigner`: V4 signed URLs for one `PUT` of one object. The URL carries the
  registration function's own authority, limited to that object, method and Content-Type, for
  its lifetime. With a service-account key (tests) it signs locally; on Cloud Run functions the
  runtime has no key, so it signs through the IAM Credentials `signBlob` API with its own
  identity (which needs `iam.serviceAccountTokenCreator` on itself, terraform/functions.tf).
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore

from mldiag.adapters.gcp.firestore_client import LazyFirestore
from mldiag.adapters.gcp.state import doc_id
from mldiag.adapters.gcp.storage import validate_object_name

RUN_OWNERS = "run_owners"


class FirestoreRunOwners(LazyFirestore):
    """The RunOwners port on Firestore (`run_owners/{run}`: `owner`, `bound_at`)."""

    def __init__(self, *, client: firestore.Client | None = None, project: str | None = None,
                 database: str = "(default)") -> None:
        super().__init__(client=client, project=project, database=database)

    def _ref(self, run: str) -> Any:
        return self.client.collection(RUN_OWNERS).document(doc_id(run))

    def bind(self, run: str, owner: str, now: float) -> str:
        """Make `owner` the owner of `run` unless it has one; returns the run's owner."""
        ref = self._ref(run)
        try:
            ref.create({"run": run, "owner": owner, "bound_at": now})
            return owner
        except gexc.AlreadyExists:
            found = self.owner(run)
            if found is None:  # deleted in between (by hand): bind again
                return self.bind(run, owner, now)
            return found

    def owner(self, run: str) -> str | None:
        snap = self._ref(run).get()
        return str(snap.get("owner")) if snap.exists else None


class GcsUploadSigner:
    """The UploadSigner port: V4 signed `PUT` URLs on one bucket.

    `client` is a `google.cloud.storage.Client` (its API endpoint is the URLs' host, so the
    emulator's when STORAGE_EMULATOR_HOST is set); `credentials` sign, the ambient ones when
    omitted.
    """

    def __init__(self, bucket: str, *, client: Any = None, project: str | None = None,
                 credentials: Any = None) -> None:
        self.bucket = bucket
        self._client = client
        self._project = project
        self._credentials = credentials
        self._lock = threading.Lock()

    def _setup(self) -> tuple[Any, Any]:
        with self._lock:
            if self._client is None:
                from google.cloud.storage import Client

                self._client = Client(project=self._project or None)
            if self._credentials is None:
                import google.auth

                self._credentials, _ = google.auth.default(
                    scopes=["https://www.googleapis.com/auth/cloud-platform"])
            return self._client, self._credentials

    def upload_url(self, name: str, *, content_type: str, expires_s: float) -> str:
        client, credentials = self._setup()
        blob = client.bucket(self.bucket).blob(validate_object_name(name))
        options: dict[str, Any] = {}
        if not hasattr(credentials, "sign_bytes"):
            # No private key (the functions' runtime identity): sign with IAM signBlob as the
            # service account itself, authorized by a fresh access token.
            from google.auth.transport.requests import Request

            if not credentials.valid:
                credentials.refresh(Request())
            options = {"service_account_email": credentials.service_account_email,
                       "access_token": credentials.token}
        else:
            options = {"credentials": credentials}
        return str(blob.generate_signed_url(
            version="v4", method="PUT", content_type=content_type,
            expiration=datetime.timedelta(seconds=expires_s), **options))
