"""Maintenance: the sweeper (settle quiet sessions, re-queue stuck ones, fail those that never
got a profile, rescan the bucket for profiles whose finalize event was lost) and the end of a
dead-lettered message.
"""

from __future__ import annotations

import itertools
import json
import logging

from mldiag.messages import (
    AnalyzeSession,
    CaptureProfile,
    InvestigateSession,
    ProfileObjectFinalized,
)
from mldiag.model import (
    ANALYZING,
    CAPTURED,
    CAPTURING,
    FAILED,
    INVESTIGATING,
    REPORTED,
    HostRecord,
    SessionRecord,
    parse_object_name,
    short_reason,
)
from mldiag.settings import Settings
from mldiag.stages.intake import complete_session
from mldiag.stages.registry import handle
from mldiag.stages.services import Services, fail

log = logging.getLogger(__name__)


# Sweeper


def sweep(services: Services) -> dict[str, int]:
    """Complete settled sessions and re-queue stuck ones. Safe to run at any rate."""
    now = services.clock()
    settings = services.settings
    done = {"settled": 0, "requeued": 0, "failed": 0, "rescanned": 0}
    for s in services.state.list_sessions(state=CAPTURING):
        arrived = [h for h, r in s.hosts.items() if r.status == "ARRIVED"]
        last_moved = max(s.last_arrival_at, s.created_at, s.updated_at)
        quiet = now - last_moved
        if not arrived:
            # Nothing will come (a capture that died, an upload that failed): say so rather
            # than leave the session CAPTURING forever.
            if last_moved and quiet >= settings.stuck_after_s:
                failed = short_reason(*(r.reason for r in s.hosts.values()))
                fail(services, s.run, s.session,
                     f"no host's profile arrived within {settings.stuck_after_s:g} s"
                     + (f": {failed}" if failed else ""), s.version)
                done["failed"] += 1
            continue
        if s.expects():
            # The capture's targets or the job's processes say who comes: wait for them up
            # to the stuck window, then analyse who came.
            if quiet < settings.stuck_after_s:
                continue
            _record_missing(services, s, now)
        elif not settled(services, s, quiet):
            continue
        current = services.state.get_session(s.run, s.session)
        if current is not None and complete_session(services, current):
            done["settled"] += 1
    done["requeued"] = requeue_stuck(services, settings.stuck_after_s)
    # Records stored before the console's list queries get their fields (once per store).
    done["list_fields"] = services.state.fill_list_fields()
    interval = settings.rescan_interval_s
    # One rescan per interval across every sweeper instance: the claim of its time slot.
    if interval > 0 and services.state.claim(f"rescan:{int(now // interval)}",
                                             services.owner, interval, now):
        done["rescanned"] = rescan(services, window_s=settings.rescan_window_s, now=now)
    return done


# A session that does not know its hosts waits this many times the longest gap between two
# of its arrivals (bounded by settle_max_s): hosts uploading one after another keep it open.
SETTLE_GAP_FACTOR = 2.0


def settle_wait(s: SessionRecord, settings: Settings) -> float:
    """How long a session that does not know its hosts waits after its last arrival: the
    settle window, or SETTLE_GAP_FACTOR times the longest gap between two arrivals so far,
    whichever is longer, at most settle_max_s (never less than the settle window)."""
    times = sorted(r.arrived_at for r in s.hosts.values() if r.status == "ARRIVED")
    gap = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
    return min(max(settings.settle_s, SETTLE_GAP_FACTOR * gap),
               max(settings.settle_max_s, settings.settle_s))


def settled(services: Services, s: SessionRecord, quiet: float) -> bool:
    """Whether a session that does not know its hosts is done arriving, `quiet` seconds after
    its last arrival: it waited `settle_wait`, and no profile in its directory is still to be
    registered (a file still being written or copied, locally; an object whose finalize
    event is on its way). Past the stuck window it is done whatever the bucket shows."""
    settings = services.settings
    if quiet < settle_wait(s, settings):
        return False
    if quiet >= settings.stuck_after_s:
        return True
    return not unregistered(services, s)


def unregistered(services: Services, s: SessionRecord) -> list[str]:
    """The profiles in the session's directory that are still to be registered (being
    written, or their finalize event on its way): a host the session does not hold, or one
    written again after it was registered, at a generation the session does not hold."""
    anchor = next(iter(s.hosts.values())).object_name.rsplit("/", 1)[0]
    out = []
    for info in services.storage.list(f"{anchor}/"):
        try:
            name = parse_object_name(info.name)
        except ValueError:
            continue  # dead-lettered with its reason: never a host of this session
        if name is None or name.session_dir != anchor:
            continue
        host = s.hosts.get(name.host)
        if host is None or (host.generation != info.generation
                            and info.updated > host.arrived_at):
            out.append(info.name)
    return out


def _record_missing(services: Services, s: SessionRecord, now: float) -> None:
    """Past the stuck window: record each expected host that did not come as FAILED, and the
    job's processes that never joined in the session's note, so the report says what the
    analysis lacks."""
    settings = services.settings
    anchor = next(iter(s.hosts.values())).object_name.rsplit("/", 1)[0]
    for host in sorted((set(s.expected_hosts) | set(s.processes)) - set(s.hosts)):
        services.state.register_host(s.run, s.session, host, HostRecord(
            object_name=f"{anchor}/{host}.xplane.pb", generation="", size=0,
            arrived_at=now, status="FAILED",
            reason=f"{host}: did not arrive within {settings.stuck_after_s:g} s"), now)
    never = s.missing_processes()
    if never and len(s.hosts) < s.expected_count:
        several = len(never) > 1
        note = (f"process{'es' if several else ''} {', '.join(map(str, never))} of the job's "
                f"{s.process_count} did not join the session within "
                f"{settings.stuck_after_s:g} s: analysed without {'them' if several else 'it'}")
        services.state.transition(s.run, s.session, CAPTURING, expect=[CAPTURING],
                                  version=s.version, now=now,
                                  note=short_reason(s.note, note) if s.note else note)


# How old an object must be before the rescan registers it.
RESCAN_MIN_AGE_S = 300.0


def rescan(services: Services, *, window_s: float, now: float) -> int:
    """Register the profile objects written in the last `window_s` that no finalize event
    registered; returns how many it handed to on_profile_object.

    Eventarc gives up on a finalize event after 24 h of retries, and a notification can be
    lost, so a dropped-in profile would never be analysed. An object counts as registered
    when its session holds its host at that generation; anything else goes through
    on_profile_object as its event would have (claims make a late real event a no-op, and an
    unsafe name is dead-lettered once per generation).
    """
    handed = 0
    for info in services.storage.list(""):
        age = now - info.updated
        # A younger object's event may still be on its way (or, in a local directory, the
        # file still being written): the next rescan looks again.
        if not RESCAN_MIN_AGE_S <= age <= window_s or "/plugins/profile/" not in f"/{info.name}":
            continue
        try:
            name = parse_object_name(info.name)
        except ValueError:
            name = None
        else:
            if name is None:
                continue
        if name is not None:
            s = services.state.get_session(name.run, name.session)
            host = s.hosts.get(name.host) if s is not None else None
            if host is not None and host.generation == info.generation:
                continue
        log.warning("rescan: %s (generation %s) was never registered; registering it now",
                    info.name, info.generation)
        handle(ProfileObjectFinalized(bucket=services.storage.bucket, name=info.name,
                                      generation=info.generation, size=info.size), services)
        handed += 1
    return handed


def requeue_stuck(services: Services, stuck_after_s: float) -> int:
    """Re-publish the pending work of sessions that have not moved for `stuck_after_s`.

    The local runtime calls it with 0 at start: a crash between a stage's transition and its
    publish leaves a session with no message, and duplicates are harmless (claims).
    """
    now = services.clock()
    requeued = 0
    for state, make in ((CAPTURED, AnalyzeSession), (ANALYZING, AnalyzeSession),
                        (INVESTIGATING, InvestigateSession)):
        for s in services.state.list_sessions(state=state):
            if now - s.updated_at >= stuck_after_s:
                if stuck_after_s > 0 and s.requeues >= services.settings.max_attempts:
                    # The stage keeps dying without an error it could report (killed for
                    # memory, past its timeout): stop paying for it.
                    fail(services, s.run, s.session,
                         f"the {state.lower()} stage did not finish after {s.requeues + 1} "
                         "attempts (crashed, out of memory or past its timeout?)", s.version)
                    continue
                # Touch the session so it is re-queued once per deadline, not every sweep.
                services.state.transition(s.run, s.session, s.state, expect=[s.state],
                                          version=s.version, now=now,
                                          requeues=s.requeues + (1 if stuck_after_s > 0 else 0))
                services.bus.publish(make(run=s.run, session=s.session, version=s.version))
                requeued += 1
    return requeued


def dead_lettered(services: Services, topic: str, payload: str, reason: str) -> None:
    """A message was given up on (poison, or out of attempts): fail the session it names.

    Only while that session still waits on this version's work; a finished session keeps its
    report, and a stale message about an older version changes nothing.
    """
    try:
        data = json.loads(payload)
    except ValueError:
        return
    if not isinstance(data, dict):
        return
    run, session, version = data.get("run"), data.get("session"), data.get("version")
    if not isinstance(run, str) or not isinstance(session, str):
        return
    s = services.state.get_session(run, session)
    if s is None or s.state in (REPORTED, FAILED):
        return
    if data.get("kind") == CaptureProfile.kind and s.request_id != (
            data.get("request_id") or f"capture:{run}/{session}"):
        return  # a capture request whose name collided with another session
    if isinstance(version, int) and not isinstance(version, bool) and version != s.version:
        return
    if services.state.transition(run, session, FAILED, expect=[s.state], version=s.version,
                                 now=services.clock(), reason=reason) is not None:
        log.info("session %s/%s FAILED: %s", run, session, reason)
