"""Cloud Function `collect`: Pub/Sub `analysis-requests` → `mldiag.stages.collect`.

Runs the collection tools, writes health_snapshot.json and routes the session to
investigation or straight to the report.
A poison message is dead-lettered and acknowledged; a transient error fails the invocation
so Pub/Sub redelivers it.
"""

import functions_framework
from cloudevents.http import CloudEvent

from mldiag import entrypoints, stages
from mldiag.messages import AnalyzeSession


@functions_framework.cloud_event
def collect(event: CloudEvent) -> None:
    """Handle one `AnalyzeSession` message (`google.cloud.pubsub.topic.v1.messagePublished`)."""
    services = entrypoints.services()
    with entrypoints.dead_letters(event, services):
        stages.handle(entrypoints.pubsub_message(event, AnalyzeSession), services)
