"""Cloud Function `render_report`: Pub/Sub `report-requests` → `mldiag.stages.render_report`.

Writes analysis.json and summary.html and marks the session REPORTED.
A poison message is dead-lettered and acknowledged; a transient error fails the invocation
so Pub/Sub redelivers it.
"""

import functions_framework
from cloudevents.http import CloudEvent

from mldiag import entrypoints, stages
from mldiag.messages import RenderReport


@functions_framework.cloud_event
def render_report(event: CloudEvent) -> None:
    """Handle one `RenderReport` message (`google.cloud.pubsub.topic.v1.messagePublished`)."""
    services = entrypoints.services()
    with entrypoints.dead_letters(event, services):
        stages.handle(entrypoints.pubsub_message(event, RenderReport), services)
