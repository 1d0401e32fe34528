"""The Firestore client the GCP adapters share the way of building: on first use."""

from __future__ import annotations

import threading

from google.cloud import firestore


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
