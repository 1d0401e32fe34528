"""Intake: a finalized xplane registers its host in its session (creating run and session when
the file came from outside); a complete session moves to CAPTURED and gets one AnalyzeSession.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from mldiag import limits
from mldiag.capture.targets import liveness
from mldiag.messages import AnalyzeSession, ProfileObjectFinalized
from mldiag.model import (
    CAPTURED,
    CAPTURING,
    XPLANE_SUFFIXES,
    HostRecord,
    SessionRecord,
    TargetRecord,
    misplaced_profile,
    parse_object_name,
)
from mldiag.ports import ObjectInfo
from mldiag.stages.claims import claimed
from mldiag.stages.services import Services, fail, publish_or_undo

log = logging.getLogger(__name__)


# on_profile_object


def on_profile_object(msg: ProfileObjectFinalized, services: Services) -> None:
    """Register a finalized xplane in its session; publish the analysis when complete."""
    try:
        name = parse_object_name(msg.name)
    except ValueError as e:
        _reject_object(services, msg, str(e))
        return
    if name is None:
        if msg.name.endswith(XPLANE_SUFFIXES):
            # A profile in the wrong place would vanish without a word: say where it belongs.
            _reject_object(services, msg, misplaced_profile(msg.name))
        return  # not a profile: artifacts, notes, anything else in the bucket
    existing = services.state.get_session(name.run, name.session)
    if existing is not None and existing.hosts:
        home = next(iter(existing.hosts.values())).object_name.rsplit("/", 1)[0]
        if home != name.session_dir:
            _reject_object(services, msg, (
                f"session {name.run}/{name.session} already lives in {home}/; "
                f"{msg.name} is in another directory ({name.session_dir}/): rename its run or "
                "session"))
            return
    key = f"object:{msg.event_key}"
    with claimed(services, key) as mine:
        if not mine:
            return
        now = services.clock()
        services.state.ensure_run(name.run, discovered=True, now=now)
        status, reason = "ARRIVED", ""
        if msg.size == 0:
            status, reason = "FAILED", f"{name.host}: empty file (0 bytes)"
        elif msg.size > services.settings.max_host_bytes:
            try:
                limits.check_host_bytes(name.host, msg.size, services.settings.max_host_bytes)
            except ValueError as e:
                status, reason = "FAILED", str(e)
        elif name.suffix == ".xplane.riegeli":
            status, reason = "FAILED", (
                f"{name.host}: cannot analyse .xplane.riegeli (continuous-profiling snapshot): "
                "xprof 2.24.2's reader parses only .xplane.pb, and its converters answer an "
                "empty profile rather than an error for input they cannot read, so no result "
                "would be trustworthy; save the snapshot as .xplane.pb")
        record = HostRecord(object_name=msg.name, generation=msg.generation, size=msg.size,
                            arrived_at=now, status=status, reason=reason,
                            content_hash=msg.content_hash)
        prior = existing.hosts.get(name.host) if existing is not None else None
        if status == "ARRIVED" and prior is not None:
            record.content_hash = _rewrite_hash(services, name.run, name.session, name.host,
                                                record, prior, now)
        # The run's registered profiler targets are the hosts a new session waits for.
        expected = sorted({t.host for t in live_targets(services, name.run)})
        session, new = services.state.register_host(name.run, name.session, name.host, record,
                                                    now, expected_hosts=expected)
        if status == "FAILED" and new:
            fail(services, name.run, name.session, reason, session.version)
        elif session.complete():
            # Also on a redelivery (not new): the first delivery may have died before this.
            complete_session(services, session)


def _rewrite_hash(services: Services, run: str, session: str, host: str, record: HostRecord,
                  prior: HostRecord, now: float) -> str:
    """The content hash of a host's rewrite that may hold the same bytes (the same size as
    the generation registered), so that `SessionRecord.add_host` keeps the version when it
    does. Local finalize events come unhashed (registering never waits for a hash): the
    hashes are asked of the storage then, only for such a rewrite, and the registered
    generation's is recorded on its host first."""
    if (prior.status != "ARRIVED" or prior.generation == record.generation
            or prior.size != record.size):
        return record.content_hash
    before = prior.content_hash or services.storage.content_hash(ObjectInfo(
        name=prior.object_name, size=prior.size, generation=prior.generation,
        updated=prior.arrived_at))
    if not before:
        return record.content_hash
    if not prior.content_hash:
        services.state.register_host(run, session, host,
                                     dataclasses.replace(prior, content_hash=before), now)
    return record.content_hash or services.storage.content_hash(ObjectInfo(
        name=record.object_name, size=record.size, generation=record.generation,
        updated=now))


def _reject_object(services: Services, msg: ProfileObjectFinalized, reason: str) -> None:
    """Dead-letter an object that can never join a session, once per object generation."""
    with claimed(services, f"object:{msg.event_key}") as mine:
        if not mine:
            return
        services.state.record_dead_letter("profile-objects", msg.to_json(),
                                          f"poison message: {reason}", 1, services.clock())
    log.warning("ignored %s: %s", msg.name, reason)


def complete_session(services: Services, session: SessionRecord) -> bool:
    """CAPTURING → CAPTURED and one AnalyzeSession per version; False if another won."""
    moved = services.state.transition(session.run, session.session, CAPTURED,
                                      expect=[CAPTURING], version=session.version,
                                      now=services.clock())
    if moved is None:
        return False
    publish_or_undo(services, moved, CAPTURING,
                    AnalyzeSession(run=moved.run, session=moved.session, version=moved.version))
    return True


# Here rather than in capture (which imports this module): a new session waits for these hosts,
# and an alert captures them.
def live_targets(services: Services, run: str, hosts: Sequence[str] = ()) -> list[TargetRecord]:
    """The run's targets (those named in `hosts`, when given) that look alive: a fresh
    heartbeat, and (locally) a process that still exists (see capture.targets.liveness)."""
    now = services.clock()
    return [t for t in services.state.list_targets(run)
            if (not hosts or t.host in hosts) and not liveness(t, services.settings, now)]
