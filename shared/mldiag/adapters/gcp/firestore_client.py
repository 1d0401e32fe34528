"""The Firestore client the GCP adapters share the way of building (on first use), and the
one way they read a single document (`read`)."""

from __future__ import annotations

import threading
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore
from google.cloud.firestore_v1 import _helpers
from google.cloud.firestore_v1.base_document import DocumentSnapshot


class LazyFirestore:
    """Holds a `google.cloud.firestore.Client`, given or built from `project` and `database`
    on first use (with the ambient credentials), so nothing connects at bootstrap. Safe to
    share between threads."""

    def __init__(self, *, client: firestore.Client | None = None, project: str | None = None,
                 database: str = "(default)") -> None:
        self._client = client
        self._project = project
        self._database = database
        self._lock = threading.Lock()

    @property
    def client(self) -> firestore.Client:
        with self._lock:
            if self._client is None:
                self._client = firestore.Client(project=self._project or None,
                                                database=self._database)
            return self._client


def read(ref: Any, transaction: Any = None) -> DocumentSnapshot:
    """One document, read with Firestore's unary GetDocument call (in `transaction` if given).

    The client's own `DocumentReference.get` streams (BatchGetDocuments), and gRPC serves a
    streaming call from a channel thread it starts when none runs. From Python 3.12 no thread
    starts once the interpreter is finalizing, which is when a workload's exit hooks (the
    SDK's run.close(), its last heartbeat) write their final records; a failed start leaves
    the channel counting a call that never ends, and every later streaming call on it waits
    forever, so the process never exits. A unary call needs no thread.
    """
    client = ref._client
    request: dict[str, Any] = {"name": ref._document_path}
    if transaction is not None:
        request["transaction"] = transaction.id
    try:
        doc = client._firestore_api.get_document(request=request,
                                                 metadata=client._rpc_metadata)
    except gexc.NotFound:
        return DocumentSnapshot(ref, None, exists=False, read_time=None, create_time=None,
                                update_time=None)
    return DocumentSnapshot(ref, _helpers.decode_dict(doc.fields, client), exists=True,
                            read_time=None, create_time=doc.create_time,
                            update_time=doc.update_time)
