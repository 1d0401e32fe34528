"""The one registry from message type to stage, and the routing that uses it.

The same registry drives the in-process bus (`dispatch`), the Cloud Functions (each calls
`handle`) and the deployment's topic-to-function wiring. Every stage is idempotent: a transient
error propagates so the bus redelivers; a permanent one (unreadable profile, bad message)
marks the session FAILED with its reason and is acknowledged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mldiag.capture.alerts import parse_alert
from mldiag.errors import PermanentFailure, PoisonMessage
from mldiag.messages import (
    TOPIC_OF,
    AnalyzeSession,
    CaptureProfile,
    CollectHost,
    ContinuousProfiling,
    DegradationDetected,
    InvestigateSession,
    Message,
    PrebuildViewer,
    ProfileObjectFinalized,
    RenderReport,
    SessionMessage,
    parse,
)
from mldiag.stages.analysis import (
    collect,
    investigate,
    prebuild_viewer,
    render_report,
)
from mldiag.stages.capture import on_capture_request, on_degradation_alert
from mldiag.stages.fanout import collect_host
from mldiag.stages.intake import on_profile_object
from mldiag.stages.services import Services, fail

HANDLERS: dict[type[Message], Callable[[Any, Services], None]] = {
    DegradationDetected: on_degradation_alert,
    CaptureProfile: on_capture_request,
    ContinuousProfiling: on_capture_request,
    ProfileObjectFinalized: on_profile_object,
    AnalyzeSession: collect,
    CollectHost: collect_host,
    InvestigateSession: investigate,
    RenderReport: render_report,
    PrebuildViewer: prebuild_viewer,
}


def handle(message: Message, services: Services) -> None:
    """Route one message to its stage. Permanent failures end as FAILED, not as retries."""
    handler = HANDLERS[type(message)]
    try:
        handler(message, services)
    except PermanentFailure as e:
        run, session = getattr(message, "run", None), getattr(message, "session", None)
        if run and session and isinstance(message, SessionMessage):
            fail(services, run, session, str(e), getattr(message, "version", None))
            return
        raise PoisonMessage(str(e)) from e
    except PoisonMessage as e:
        # Record the reason on the session when the message names one that exists.
        run, session = getattr(message, "run", None), getattr(message, "session", None)
        # Only a message about an existing session's work fails it: a capture request whose
        # name collides with another session must not fail that session.
        if (run and session and isinstance(message, SessionMessage)
                and services.state.get_session(run, session) is not None):
            fail(services, run, session, f"poison message: {e}",
                 getattr(message, "version", None))
        raise


def dispatch(services: Services) -> Callable[[str, str, Mapping[str, str]], None]:
    """The bus callback: parse the payload (PoisonMessage on bad input) and handle it.

    `degradation-alerts` takes every documented alert shape (workload monitoring, Cloud
    Monitoring, ours) through the one alert parser, as the Cloud Function does.
    """

    def deliver(topic: str, payload: str, attributes: Mapping[str, str]) -> None:
        if topic == TOPIC_OF[DegradationDetected]:
            alert = parse_alert(payload, attributes)
            if alert is not None:  # None: a resolved incident, nothing detected
                handle(alert, services)
            return
        handle(parse(payload, topic), services)

    return deliver
