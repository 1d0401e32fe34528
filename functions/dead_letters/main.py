"""Cloud Function `dead_letters`: the dead-letter topics → `stages.dead_lettered`.

Pub/Sub forwards a message here after its last delivery attempt; the session it names is
marked FAILED with the reason, and the message is recorded for `mldiag` to list.
"""

import functions_framework
from cloudevents.http import CloudEvent

from mldiag import entrypoints


@functions_framework.cloud_event
def dead_letters(event: CloudEvent) -> None:
    """Record one dead-lettered message (`google.cloud.pubsub.topic.v1.messagePublished`)."""
    entrypoints.record_dead_letter(event, entrypoints.services())
