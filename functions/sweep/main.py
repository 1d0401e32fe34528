"""Cloud Function `sweep`: Cloud Scheduler → Pub/Sub `sweep-ticks` → `stages.sweep`.

Settles sessions whose hosts stopped arriving and re-queues sessions stuck past their
deadline, then checks the plain profiler servers whose last check is old (`stages.liveness`,
bounded per run and in all). Safe at any rate; the message body is ignored.
"""

import logging

import functions_framework
from cloudevents.http import CloudEvent

from mldiag import entrypoints, stages

log = logging.getLogger(__name__)


@functions_framework.cloud_event
def sweep(event: CloudEvent) -> None:
    """Run one sweep."""
    services = entrypoints.services()
    done = stages.sweep(services)
    probed = stages.probe_targets(services)
    log.info("sweep %s: %s; targets checked: %s", event.get("id"), done, probed)
