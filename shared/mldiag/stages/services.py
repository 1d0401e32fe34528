"""What every stage module shares: `Services` (the stages' dependencies) and the two moves of a
session that stages in several modules make, failing it and publishing what follows a
transition. A leaf: it imports no other stage module, so the imports inside the package point
one way (registry → stages → claims → here).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from mldiag.analysis import RuleBasedInvestigator
from mldiag.messages import Message
from mldiag.model import FAILED, SessionRecord, short_reason
from mldiag.ports import Bus, Investigator, JobRunner, StateStore, Storage
from mldiag.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class Services:
    """What the stages need, built once by the bootstrap."""

    settings: Settings
    storage: Storage
    state: StateStore
    bus: Bus
    investigator: Investigator = field(default_factory=RuleBasedInvestigator)
    clock: Callable[[], float] = time.time
    # Where sessions over a function instance's limits go (None: they fail with the reason).
    jobs: JobRunner | None = None
    owner: str = field(default_factory=lambda: f"{os.getpid()}-{uuid.uuid4().hex[:8]}")


def fail(services: Services, run: str, session: str, reason: str,
         version: int | None = None) -> None:
    """Mark the session FAILED; with `version`, only if no newer version has started."""
    reason = short_reason(reason, limit=8000) if len(reason) > 8000 else reason
    if services.state.transition(run, session, FAILED, version=version, now=services.clock(),
                                 reason=reason) is not None:
        log.info("session %s/%s FAILED: %s", run, session, reason)


def publish_or_undo(services: Services, moved: SessionRecord, back_to: str,
                    message: Message) -> None:
    """Publish the message that follows a transition; if publishing fails, undo the transition.

    Otherwise the session would sit in a state whose message was never sent, and nothing but
    the sweeper's deadline would move it: the redelivery of the current message sees the new
    state and takes itself for a duplicate.
    """
    try:
        services.bus.publish(message)
    except BaseException:
        services.state.transition(moved.run, moved.session, back_to, expect=[moved.state],
                                  version=moved.version, now=services.clock())
        raise
