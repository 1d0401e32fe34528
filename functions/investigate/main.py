"""Cloud Function `investigate`: Pub/Sub `investigation-requests` → `mldiag.stages.investigate`.

Runs the investigator and its follow-up calls, writes investigation.json and asks for
the report.
A poison message is dead-lettered and acknowledged; a transient error fails the invocation
so Pub/Sub redelivers it.
"""

import functions_framework
from cloudevents.http import CloudEvent

from mldiag import entrypoints, stages
from mldiag.messages import InvestigateSession


@functions_framework.cloud_event
def investigate(event: CloudEvent) -> None:
    """Handle one `InvestigateSession` message (`google.cloud.pubsub.topic.v1.messagePublished`)."""
    services = entrypoints.services()
    with entrypoints.dead_letters(event, services):
        stages.handle(entrypoints.pubsub_message(event, InvestigateSession), services)
