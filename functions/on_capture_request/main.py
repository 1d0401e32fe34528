"""Cloud Function `on_capture_request`: Pub/Sub `capture-requests` → `stages.on_capture_request`.

Creates the session and captures every selected target in parallel (remote trace or a
snapshot of the continuous ring), or starts/stops continuous profiling.
"""

import functions_framework
from cloudevents.http import CloudEvent

from mldiag import entrypoints, stages
from mldiag.messages import CaptureProfile


@functions_framework.cloud_event
def on_capture_request(event: CloudEvent) -> None:
    """Handle one `CaptureProfile` or `ContinuousProfiling` message."""
    services = entrypoints.services()
    with entrypoints.dead_letters(event, services):
        stages.handle(entrypoints.pubsub_message(event, CaptureProfile), services)
