"""Cloud Function `on_profile_object`: GCS object finalize → `mldiag.stages.on_profile_object`.

Registers a finalized `<run>/plugins/profile/<session>/<host>.xplane.pb` in its session; other
objects are ignored. A malformed event is dead-lettered and acknowledged; a transient error
fails the invocation so Eventarc redelivers it.
"""

import functions_framework
from cloudevents.http import CloudEvent

from mldiag import entrypoints, stages


@functions_framework.cloud_event
def on_profile_object(event: CloudEvent) -> None:
    """Handle one `google.cloud.storage.object.v1.finalized` event."""
    services = entrypoints.services()
    with entrypoints.dead_letters(event, services):
        msg = entrypoints.profile_object_finalized(event)
        if not entrypoints.foreign_bucket(msg, services.settings):
            stages.handle(msg, services)
