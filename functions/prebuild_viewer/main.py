"""Cloud Function `prebuild_viewer`: Pub/Sub `viewer-requests` → `mldiag.stages.prebuild_viewer`.

Builds the XProf viewer's caches (trace viewer, overview) of a REPORTED session into the bucket
under the session, so that a person's first open in the console is a warm hit.
A poison message is dead-lettered and acknowledged; a transient error fails the invocation
so Pub/Sub redelivers it.
"""

import functions_framework
from cloudevents.http import CloudEvent

from mldiag import entrypoints, stages
from mldiag.messages import PrebuildViewer


@functions_framework.cloud_event
def prebuild_viewer(event: CloudEvent) -> None:
    """Handle one `PrebuildViewer` message (`google.cloud.pubsub.topic.v1.messagePublished`)."""
    services = entrypoints.services()
    with entrypoints.dead_letters(event, services):
        stages.handle(entrypoints.pubsub_message(event, PrebuildViewer), services)
