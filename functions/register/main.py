"""Cloud Function `register` (HTTP, IAM-authenticated): workloads' registrations and uploads.

A workload's SDK calls it with a Google ID token of its service account instead of writing
Firestore and the bucket: it registers its runs and targets, heartbeats, and gets signed URLs
for its own profile uploads (`mldiag.registration`). A refused request gets its 4xx and the
reason; a transient error a 500, which the SDK retries.
"""

import flask
import functions_framework

from mldiag import entrypoints


@functions_framework.http
def register(request: flask.Request) -> tuple[dict[str, object], int]:
    """Handle one JSON request (`{"op": ..., ...}`) of the calling workload."""
    return entrypoints.register(request.headers.get("Authorization", ""), request.get_data(),
                                entrypoints.registrar())
