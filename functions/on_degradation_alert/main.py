"""Cloud Function `on_degradation_alert`: Pub/Sub `degradation-alerts` → auto-capture.

Accepts a workload-monitoring PERFORMANCE_DEGRADATION event, a Cloud Monitoring incident
notification, or mldiag's own `DegradationDetected`; applies the run's auto-capture policy
and publishes at most one capture request per alert storm.
"""

import functions_framework
from cloudevents.http import CloudEvent

from mldiag import entrypoints, stages
from mldiag.capture.alerts import parse_alert


@functions_framework.cloud_event
def on_degradation_alert(event: CloudEvent) -> None:
    """Handle one alert (`google.cloud.pubsub.topic.v1.messagePublished`)."""
    services = entrypoints.services()
    with entrypoints.dead_letters(event, services):
        delivery = entrypoints.PubSubDelivery.from_cloud_event(event)
        alert = parse_alert(delivery.data, delivery.attributes)
        if alert is not None:  # None: a resolved incident, nothing detected
            stages.handle(alert, services)
