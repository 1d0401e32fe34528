"""Cloud Function `collect_host`: Pub/Sub `host-analysis-requests` → `mldiag.stages.collect_host`.

One host of a fanned-out session: its timeline pass, memory profile and utilization, and the
reduced copy its converters read, written under analysis/v<N>/hosts/; the last host asks for
the combine step (analysis-requests).
A poison message is dead-lettered and acknowledged; a transient error fails the invocation
so Pub/Sub redelivers it.
"""

import functions_framework
from cloudevents.http import CloudEvent

from mldiag import entrypoints, stages
from mldiag.messages import CollectHost


@functions_framework.cloud_event
def collect_host(event: CloudEvent) -> None:
    """Handle one `CollectHost` message (`google.cloud.pubsub.topic.v1.messagePublished`)."""
    services = entrypoints.services()
    with entrypoints.dead_letters(event, services):
        stages.handle(entrypoints.pubsub_message(event, CollectHost), services)
