"""The pipeline stages: plain functions `handle(message, services)`, one registry.

- on_profile_object: a finalized xplane registers its host in its session (creating run and
  session when the file came from outside); a complete session gets one AnalyzeSession.
- collect: the 15-tool health snapshot, then triage: OPTIMAL goes straight to the report,
  anything else to investigation.
- investigate: the investigator and its follow-up calls.
- render_report: analysis.json and summary.html; the session is REPORTED.

Every stage is idempotent. Claims keyed by the event (or by session and version) make
duplicates no-ops; a transient error propagates so the bus redelivers; a permanent one
(unreadable profile, bad message) marks the session FAILED with its reason and is acknowledged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from mldiag import limits, regression
from mldiag.analysis.collection.collect import SessionTooLarge
from mldiag.analysis.collection.collect import collect as collect_snapshot
from mldiag.analysis.collection.collect import collect_host as collect_host_parts
from mldiag.analysis.collection.profile_input import ProfileSession, validate_xplane
from mldiag.analysis.engine import build_analysis
from mldiag.analysis.engine import investigate as run_investigator
from mldiag.analysis.html import render_summary_html
from mldiag.analysis.judgement.investigator import RuleBasedInvestigator
from mldiag.analysis.judgement.triage import OPTIMAL, triage
from mldiag.capture import pull
from mldiag.capture.alerts import parse_alert
from mldiag.capture.egress import EgressPolicy
from mldiag.capture.remote import CaptureFailed, ProfilerBusy
from mldiag.capture.targets import capture as capture_target
from mldiag.capture.targets import liveness, set_continuous
from mldiag.errors import MldiagError, PermanentFailure, PoisonMessage, ProfileUnreadable
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
from mldiag.model import (
    ANALYZING,
    CAPTURED,
    CAPTURING,
    FAILED,
    INVESTIGATING,
    MAX_PENDING_REQUESTS,
    REPORTED,
    XPLANE_SUFFIXES,
    ControlRequest,
    HostRecord,
    SessionRecord,
    TargetRecord,
    check_name,
    parse_object_name,
    session_dir,
    short_reason,
)
from mldiag.ports import Bus, Investigator, JobRunner, StateStore, Storage
from mldiag.settings import Settings

log = logging.getLogger(__name__)

# A capture runs inside one Cloud Functions invocation: waits for a busy target fit in it.
INVOCATION_S = 540.0

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


def _fail(services: Services, run: str, session: str, reason: str,
          version: int | None = None) -> None:
    """Mark the session FAILED; with `version`, only if no newer version has started."""
    reason = short_reason(reason, limit=8000) if len(reason) > 8000 else reason
    if services.state.transition(run, session, FAILED, version=version, now=services.clock(),
                                 reason=reason) is not None:
        log.info("session %s/%s FAILED: %s", run, session, reason)


@contextmanager
def claimed(services: Services, key: str, *, lease_s: float | None = None,
            keep_alive: Callable[[float], object] | None = None) -> Iterator[bool]:
    """Hold the idempotency claim `key` around a stage's work; yields whether this delivery
    got it (False: a duplicate, or another delivery is on it, so do nothing).

    The claim is released if the work raises, so a redelivery can take it, and completed
    when the work ends (returning early included), so later duplicates stop at once.

    With `keep_alive(now)` (which touches the session), long work renews its claim and
    touches its session every third of a lease while it runs: a collection that takes longer
    than a lease, or than the sweeper's deadline (the collect job runs up to an hour), is not
    taken over by a redelivery or started again; one that dies stops renewing, and is.
    """
    lease = services.settings.lease_s if lease_s is None else lease_s
    if not services.state.claim(key, services.owner, lease, services.clock()):
        yield False
        return
    beat = _KeepAlive(services, key, lease, keep_alive) if keep_alive is not None else None
    try:
        yield True
    except BaseException:
        if beat is not None:
            beat.stop()
        services.state.release(key, services.owner)
        raise
    if beat is not None:
        beat.stop()
    services.state.complete(key, services.owner)


class _KeepAlive:
    """A daemon thread that renews a claim and touches its session until stopped."""

    def __init__(self, services: Services, key: str, lease_s: float,
                 touch: Callable[[float], object]) -> None:
        self._stopped = threading.Event()
        every = max(0.05, lease_s / 3)

        def run() -> None:
            while not self._stopped.wait(every):
                try:
                    now = services.clock()
                    if not services.state.renew(key, services.owner, lease_s, now):
                        log.warning("claim %s was taken over while its work ran", key)
                        return
                    touch(now)
                except Exception:  # noqa: BLE001 - a missed beat only shortens the lease
                    log.warning("could not renew claim %s", key, exc_info=True)

        self._thread = threading.Thread(target=run, name=f"keep-alive {key}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=30)


def _toucher(services: Services, run: str, session: str, version: int,
             state: str) -> Callable[[float], object]:
    """keep_alive for `claimed`: mark the session as moving while its stage works on it."""
    def touch(now: float) -> object:
        return services.state.transition(run, session, state, expect=[state], version=version,
                                         now=now)

    return touch


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
            _reject_object(services, msg, (
                f"{msg.name} is not in a session directory: a profile is analysed at "
                "<run>/plugins/profile/<session>/<host>.xplane.pb (move it there)"))
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
        # The run's registered profiler targets are the hosts a new session waits for.
        expected = sorted({t.host for t in live_targets(services, name.run)})
        session, new = services.state.register_host(name.run, name.session, name.host, record,
                                                    now, expected_hosts=expected)
        if status == "FAILED" and new:
            _fail(services, name.run, name.session, reason, session.version)
        elif session.complete():
            # Also on a redelivery (not new): the first delivery may have died before this.
            complete_session(services, session)


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
    _publish_or_undo(services, moved, CAPTURING,
                     AnalyzeSession(run=moved.run, session=moved.session, version=moved.version))
    return True


def _publish_or_undo(services: Services, moved: SessionRecord, back_to: str,
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


# collect


def _stage_key(stage: str, msg: SessionMessage) -> str:
    return f"{stage}:{msg.run}/{msg.session}#v{msg.version}"


def _current(services: Services, msg: SessionMessage,
             states: tuple[str, ...]) -> SessionRecord | None:
    """The session if this message is still its current work, else None (a duplicate)."""
    if services.state.get_run(msg.run) is None:
        raise PoisonMessage(f"unknown run {msg.run!r}")
    s = services.state.get_session(msg.run, msg.session)
    if s is None:
        raise PoisonMessage(f"unknown session {msg.run}/{msg.session}")
    if s.version != msg.version or s.state not in states:
        return None
    return s


def _profile_session(s: SessionRecord, local_dir: Path) -> ProfileSession:
    hosts = sorted(h for h, r in s.hosts.items() if r.status == "ARRIVED")
    paths = tuple(local_dir / s.hosts[h].object_name.rsplit("/", 1)[1] for h in hosts)
    return ProfileSession(run=s.run, name=s.session, path=local_dir, xplanes=paths)


def _generations(s: SessionRecord) -> dict[str, str]:
    """object name -> the generation registered for this version (what it must read)."""
    return {r.object_name: r.generation for r in s.hosts.values() if r.generation}


def _analysis_dir(s: SessionRecord) -> str:
    any_host = next(iter(s.hosts.values()))
    return f"{any_host.object_name.rsplit('/', 1)[0]}/analysis"


def _write_json(services: Services, s: SessionRecord, filename: str,
                obj: Mapping[str, Any]) -> str:
    data = json.dumps(obj, indent=2, default=str).encode()
    return _write_artifact(services, s, filename, data, "application/json")


def _write_artifact(services: Services, s: SessionRecord, filename: str, data: bytes,
                    content_type: str) -> str:
    base = _analysis_dir(s)
    # The latest version at analysis/<file>; every version also keeps analysis/v<n>/<file>.
    services.storage.write_bytes(f"{base}/v{s.version}/{filename}", data,
                                 content_type=content_type)
    name = f"{base}/{filename}"
    current = services.state.get_session(s.run, s.session)
    if current is not None and current.version != s.version:
        # A host arrived meanwhile and a newer version owns the latest copies.
        return name
    services.storage.write_bytes(name, data, content_type=content_type)
    return name


def collect(msg: AnalyzeSession, services: Services) -> None:
    """Run the collection tools, write health_snapshot.json, triage, route onwards.

    A session over this instance's limits goes to the collect job; a large or many-host one
    fans out (one `collect_host` per host) and is combined here when every host is done.
    """
    s = _current(services, msg, (CAPTURED, ANALYZING))
    if s is None:
        return
    if s.progress.startswith("collected:"):
        _route_after_collect(services, msg, s.progress.split(":", 1)[1])
        return
    arrived = {h: r for h, r in s.hosts.items() if r.status == "ARRIVED"}
    if not arrived:
        _fail(services, msg.run, msg.session, "no host's profile arrived: " + short_reason(
            *(r.reason or h for h, r in s.hosts.items())), msg.version)
        return
    settings = services.settings
    sizes = [r.size for r in arrived.values()]
    try:
        # Checked before anything is downloaded: /tmp is memory on a Cloud Function.
        limits.check_session_bytes({h: r.size for h, r in arrived.items()},
                                   settings.max_session_bytes)
    except ValueError as e:
        _fail(services, msg.run, msg.session, str(e), msg.version)
        return
    over = _over_function_limits(settings, sizes)
    if over and not settings.in_job:
        _hand_to_job(services, msg, s, over)
        return
    host_parts = None
    if _fans_out(settings, sizes):
        host_parts = _host_parts(services, s, sorted(arrived))
        if host_parts is None:
            _fan_out(services, msg, s, sorted(arrived))
            return
    key = "combine" if host_parts is not None else "collect"
    try:
        with claimed(services, _stage_key(key, msg), keep_alive=_toucher(
                services, msg.run, msg.session, msg.version, ANALYZING)) as mine:
            if not mine:
                return
            _collect_claimed(services, msg, host_parts)
    except _TooLargeHere as e:
        # The claim was released: the collect job takes the session with its own.
        _hand_to_job(services, msg, s, str(e))


class _TooLargeHere(Exception):
    """The session does not fit this instance's memory budget, and a collect job exists."""


def _collect_claimed(services: Services, msg: AnalyzeSession,
                     host_parts: Mapping[str, Mapping[str, Any]] | None) -> None:
    s = services.state.transition(msg.run, msg.session, ANALYZING,
                                  expect=[CAPTURED, ANALYZING], version=msg.version,
                                  now=services.clock())
    if s is None:
        return
    try:
        snapshot = _collect_snapshot(services, s, host_parts)
    except SessionTooLarge as e:
        if services.jobs is not None and not services.settings.in_job:
            raise _TooLargeHere(str(e)) from e
        _fail(services, msg.run, msg.session, str(e), msg.version)
        return
    except ProfileUnreadable as e:
        # Bad input: FAILED with the reason, acknowledged.
        _fail(services, msg.run, msg.session, str(e), msg.version)
        return
    snapshot["session"]["path"] = services.storage.uri(_analysis_dir(s).rsplit("/", 1)[0])
    snapshot["session"]["version"] = s.version
    failed = {h: r.reason for h, r in sorted(s.hosts.items()) if r.status == "FAILED"}
    failed |= {h: str(p["failed"]) for h, p in (host_parts or {}).items() if "failed" in p}
    snapshot["session"]["capture"] = {
        "kind": s.kind, "trigger": s.trigger, "note": s.note, "failed_hosts": failed}
    if services.settings.in_job:
        # The big-session path: the report says where the collection ran and why.
        snapshot["collection"]["collect_job"] = _job_note(services, s) or {
            "why": "the session was handed to the collect job"}
    _write_json(services, s, "health_snapshot.json", snapshot)
    status = triage(snapshot).status
    services.state.transition(msg.run, msg.session, ANALYZING, expect=[ANALYZING],
                              version=msg.version, now=services.clock(),
                              progress=f"collected:{status}")
    _route_after_collect(services, msg, status)


def _collect_snapshot(services: Services, s: SessionRecord,
                      host_parts: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    settings = services.settings
    options: dict[str, Any] = {"max_host_bytes": settings.max_host_bytes,
                               "memory_budget_bytes": settings.memory_budget_bytes,
                               "tool_timeout_s": settings.tool_timeout_s}
    if host_parts is None:
        names = [r.object_name for r in s.hosts.values() if r.status == "ARRIVED"]
        with services.storage.local_files(names, generations=_generations(s),
                                          max_bytes=settings.max_host_bytes) as local:
            return collect_snapshot(_profile_session(s, local), **options)
    ok = {h: p for h, p in host_parts.items() if "failed" not in p}
    if not ok:
        raise ProfileUnreadable("no host could be analysed: " + short_reason(
            *(f"{h}: {p['failed']}" for h, p in sorted(host_parts.items()))))
    # The converters read each host's reduced copy where collect_host made one.
    base = _analysis_dir(s)
    inputs = {h: (f"{base}/v{s.version}/hosts/{h}.converter-input.pb"
                  if p["parts"].get("converter_input") == "reduced" else s.hosts[h].object_name)
              for h, p in ok.items()}
    with services.storage.local_files(list(inputs.values())) as local:
        view = Path(tempfile.mkdtemp(prefix="mldiag-combine-"))
        try:
            for h, name in inputs.items():
                (view / f"{h}.xplane.pb").symlink_to(local / name.rsplit("/", 1)[1])
            session = ProfileSession(run=s.run, name=s.session, path=view, xplanes=tuple(
                view / f"{h}.xplane.pb" for h in sorted(ok)))
            snapshot = collect_snapshot(session, host_parts=ok, **options)
        finally:
            shutil.rmtree(view, ignore_errors=True)
    snapshot["collection"]["fanned_out"] = {
        "hosts": len(host_parts), "failed": sorted(h for h in host_parts if h not in ok),
        "per_host_ms": {h: p.get("elapsed_ms") for h, p in sorted(host_parts.items())}}
    return snapshot


def _over_function_limits(settings: Settings, sizes: Sequence[int]) -> str:
    if settings.function_max_host_bytes and max(sizes) > settings.function_max_host_bytes:
        return (f"its largest host is {max(sizes) / 1024**3:.2f} GiB, over the collect "
                f"function's {settings.function_max_host_bytes / 1024**3:.2f} GiB per host")
    if settings.function_max_hosts and len(sizes) > settings.function_max_hosts:
        return (f"it has {len(sizes)} hosts, over the collect function's "
                f"{settings.function_max_hosts} per session")
    return ""


def _hand_to_job(services: Services, msg: AnalyzeSession, s: SessionRecord,
                 why: str) -> None:
    """Start the collect job on the session, once per lease (a job that dies is started
    again when the sweeper re-queues the session after the lease)."""
    if services.jobs is None:
        _fail(services, msg.run, msg.session, f"session too large for the collect function: "
              f"{why}, and no collect job is configured (MLDIAG_COLLECT_JOB)", msg.version)
        return
    key = _stage_key("job", msg)
    if not services.state.claim(key, services.owner, services.settings.stuck_after_s,
                                services.clock()):
        return
    try:
        # Why the session left the function, for the job to put in the report.
        services.storage.write_bytes(
            _job_note_name(s), json.dumps({"why": why, "at": services.clock()}).encode(),
            content_type="application/json")
        execution = services.jobs.run(msg)
    except BaseException:
        services.state.release(key, services.owner)
        raise
    services.state.transition(msg.run, msg.session, ANALYZING, expect=[CAPTURED, ANALYZING],
                              version=msg.version, now=services.clock(),
                              progress=f"job:{execution}")
    log.info("session %s/%s handed to the collect job (%s): %s", msg.run, msg.session,
             execution, why)


def _job_note_name(s: SessionRecord) -> str:
    return f"{_analysis_dir(s)}/v{s.version}/collect-job.json"


def _job_note(services: Services, s: SessionRecord) -> dict[str, Any] | None:
    """In the collect job: why the collect function handed the session over, if it said."""
    try:
        note = json.loads(services.storage.read_bytes(_job_note_name(s)))
    except (FileNotFoundError, ValueError):
        return None
    return {"why": str(note.get("why", ""))} if isinstance(note, dict) else None


def _fans_out(settings: Settings, sizes: Sequence[int]) -> bool:
    return len(sizes) >= max(settings.fanout_min_hosts, 2) or (
        len(sizes) >= 2 and sum(sizes) >= settings.fanout_min_bytes)


def _host_part_name(s: SessionRecord, host: str) -> str:
    return f"{_analysis_dir(s)}/v{s.version}/hosts/{host}.json"


def _hosts_done(services: Services, s: SessionRecord, hosts: Sequence[str]) -> set[str]:
    """The hosts whose collect_host result is written."""
    present = {o.name for o in services.storage.list(f"{_analysis_dir(s)}/v{s.version}/hosts/")}
    return {h for h in hosts if _host_part_name(s, h) in present}


def _host_parts(services: Services, s: SessionRecord,
                hosts: Sequence[str]) -> dict[str, dict[str, Any]] | None:
    """Every host's collect_host result, or None while any is missing."""
    if len(_hosts_done(services, s, hosts)) < len(hosts):
        return None
    return {h: _read_json(services, _host_part_name(s, h)) for h in hosts}


def _fan_out(services: Services, msg: AnalyzeSession, s: SessionRecord,
             hosts: Sequence[str]) -> None:
    """Ask for every host's collect_host. Once fanned out, a repeat of the request (the
    sweeper's, for a session stuck past its deadline) asks again for the hosts still missing:
    a host whose instance died is retried, and the claims keep the others from running twice.
    """
    if not s.progress.startswith("fanout:"):
        moved = services.state.transition(msg.run, msg.session, ANALYZING,
                                          expect=[CAPTURED, ANALYZING], version=msg.version,
                                          now=services.clock(), progress=f"fanout:{len(hosts)}")
        if moved is None:
            return
    done = _hosts_done(services, s, hosts)
    for host in hosts:
        if host not in done:
            services.bus.publish(CollectHost(run=msg.run, session=msg.session,
                                             version=msg.version, host=host))


def collect_host(msg: CollectHost, services: Services) -> None:
    """One host of a fanned-out session: its per-host jobs, written to analysis/v<N>/hosts/;
    the host that completes the set asks for the combine step."""
    s = _current(services, msg, (ANALYZING,))
    if s is None or msg.host not in s.hosts or s.hosts[msg.host].status != "ARRIVED":
        return
    with claimed(services, f"collect_host:{msg.run}/{msg.session}#v{msg.version}/"
                           f"{msg.host}", keep_alive=_toucher(
                               services, msg.run, msg.session, msg.version, ANALYZING)) as mine:
        if not mine:
            return
        settings = services.settings
        record = s.hosts[msg.host]
        with services.storage.local_files(
                [record.object_name], generations=_generations(s),
                max_bytes=settings.max_host_bytes) as local, \
                tempfile.TemporaryDirectory(prefix="mldiag-host-") as out:
            xplane = local / record.object_name.rsplit("/", 1)[1]
            try:
                result = collect_host_parts(
                    xplane, msg.host, Path(out), tool_timeout_s=settings.tool_timeout_s,
                    max_host_bytes=settings.max_host_bytes,
                    memory_budget_bytes=settings.memory_budget_bytes)
            except ProfileUnreadable as e:
                # This host is left out of the report, which names it and says why.
                result = {"host": msg.host, "failed": str(e)}
            reduced = Path(out) / f"{msg.host}.xplane.pb"
            if reduced.exists():
                services.storage.write_bytes(
                    f"{_analysis_dir(s)}/v{s.version}/hosts/{msg.host}.converter-input.pb",
                    reduced.read_bytes(), content_type="application/octet-stream")
        services.storage.write_bytes(_host_part_name(s, msg.host),
                                     json.dumps(result, default=str).encode(),
                                     content_type="application/json")
    hosts = sorted(h for h, r in s.hosts.items() if r.status == "ARRIVED")
    if len(_hosts_done(services, s, hosts)) == len(hosts):
        services.bus.publish(AnalyzeSession(run=msg.run, session=msg.session,
                                            version=msg.version))


def _route_after_collect(services: Services, msg: AnalyzeSession, status: str) -> None:
    if status == OPTIMAL:
        services.bus.publish(RenderReport(run=msg.run, session=msg.session, version=msg.version))
        return
    message = InvestigateSession(run=msg.run, session=msg.session, version=msg.version)
    moved = services.state.transition(msg.run, msg.session, INVESTIGATING, expect=[ANALYZING],
                                      version=msg.version, now=services.clock())
    if moved is None:
        # A concurrent duplicate moved it first; one more request is harmless (claims).
        services.bus.publish(message)
        return
    _publish_or_undo(services, moved, ANALYZING, message)


def _read_json(services: Services, name: str) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(services.storage.read_bytes(name)))


def investigate(msg: InvestigateSession, services: Services) -> None:
    """Run the investigator on the snapshot and write investigation.json."""
    s = _current(services, msg, (INVESTIGATING,))
    if s is None:
        return
    if s.progress == "investigated":
        services.bus.publish(RenderReport(run=msg.run, session=msg.session, version=msg.version))
        return
    with claimed(services, _stage_key("investigate", msg), keep_alive=_toucher(
            services, msg.run, msg.session, msg.version, INVESTIGATING)) as mine:
        if not mine:
            return
        base = _analysis_dir(s)
        snapshot = _read_json(services, f"{base}/v{s.version}/health_snapshot.json")
        result = triage(snapshot)
        names = [r.object_name for r in s.hosts.values() if r.status == "ARRIVED"]
        # The follow-ups read the generations collect analysed, each under the per-host cap.
        with services.storage.local_files(names, generations=_generations(s),
                                          max_bytes=services.settings.max_host_bytes) as local:
            investigation = run_investigator(snapshot, result, services.investigator,
                                             session=_profile_session(s, local))
        _write_json(services, s, "investigation.json",
                    {**investigation, "triage": result.to_dict()})
        services.state.transition(msg.run, msg.session, INVESTIGATING, expect=[INVESTIGATING],
                                  version=msg.version, now=services.clock(),
                                  progress="investigated")
        services.bus.publish(RenderReport(run=msg.run, session=msg.session,
                                          version=msg.version))


def render_report(msg: RenderReport, services: Services) -> None:
    """Write analysis.json and summary.html; mark the session REPORTED."""
    s = _current(services, msg, (ANALYZING, INVESTIGATING))
    if s is None:
        return
    with claimed(services, _stage_key("render", msg)) as mine:
        if not mine:
            return
        base = f"{_analysis_dir(s)}/v{s.version}"
        snapshot = _read_json(services, f"{base}/health_snapshot.json")
        result = triage(snapshot)
        if services.storage.stat(f"{base}/investigation.json") is not None:
            investigation = _read_json(services, f"{base}/investigation.json")
        else:
            # Only an OPTIMAL triage comes here without an investigation: the engine then makes
            # no follow-up call, so no profile files are needed.
            investigation = run_investigator(
                snapshot, result, services.investigator,
                session=ProfileSession(run=s.run, name=s.session, path=Path("."), xplanes=()))
            _write_json(services, s, "investigation.json",
                    {**investigation, "triage": result.to_dict()})
        analysis = build_analysis(snapshot, result, investigation)
        analysis["session"]["version"] = s.version
        if s.trigger == "alert":
            _what_changed(services, s, snapshot, analysis, investigation)
        _write_json(services, s, "analysis.json", analysis)
        html_name = _write_artifact(services, s, "summary.html",
                                    render_summary_html(analysis, snapshot).encode(),
                                    "text/html; charset=utf-8")
        reported = services.state.transition(
            msg.run, msg.session, REPORTED, expect=[ANALYZING, INVESTIGATING],
            version=msg.version, now=services.clock(), verdict=analysis["status"],
            report_path=services.storage.uri(html_name))
    if reported is not None and services.settings.prebuild_viewer:
        # After the report, not before: the viewer's caches never delay a verdict.
        services.bus.publish(PrebuildViewer(run=msg.run, session=msg.session,
                                            version=msg.version))


def _what_changed(services: Services, s: SessionRecord, snapshot: Mapping[str, Any],
                  analysis: dict[str, Any], investigation: Mapping[str, Any]) -> None:
    """An alert-triggered session is compared with the run's healthy baseline: diff.json and
    diff.html beside its report, a "What changed" block in analysis.json (the report's first
    section) and the diff's one sentence at the head of the verdict summary."""
    block, doc = regression.regression(services.state, services.storage, s, snapshot,
                                       analysis, investigation)
    analysis["regression"] = block
    if doc is None:
        return
    data, page = regression.diff_artifacts(doc)
    _write_artifact(services, s, regression.DIFF_JSON, data, "application/json")
    _write_artifact(services, s, regression.DIFF_HTML, page, "text/html; charset=utf-8")
    analysis["summary"] = f"{doc['headline']} {analysis.get('summary') or ''}".strip()


# prebuild_viewer


def prebuild_viewer(msg: PrebuildViewer, services: Services) -> None:
    """Build the XProf viewer's caches of a REPORTED session into the bucket, once per
    version, so that the first open in the console is warm (see mldiag.viewer)."""
    s = services.state.get_session(msg.run, msg.session)
    if s is None or s.state != REPORTED or s.version != msg.version:
        return  # a newer version (or none) supersedes it: nothing to build
    if not any(h.status == "ARRIVED" for h in s.hosts.values()):
        return
    from mldiag import viewer

    if services.storage.stat(f"{viewer.cache_prefix(s)}/{viewer.MANIFEST}") is not None:
        return
    with claimed(services, f"viewer:{msg.run}/{msg.session}/v{msg.version}") as mine:
        if not mine:
            return
        manifest = viewer.prebuild(s, services.storage)
        log.info("viewer caches of %s/%s v%d built in %.1f s (%d files)", msg.run, msg.session,
                 msg.version, manifest["elapsed_ms"] / 1000, len(manifest["files"]))


# on_degradation_alert


def live_targets(services: Services, run: str, hosts: Sequence[str] = ()) -> list[TargetRecord]:
    """The run's targets (those named in `hosts`, when given) that look alive: a fresh
    heartbeat, and (locally) a process that still exists (see capture.targets.liveness)."""
    now = services.clock()
    return [t for t in services.state.list_targets(run)
            if (not hosts or t.host in hosts) and not liveness(t, services.settings, now)]


def on_degradation_alert(msg: DegradationDetected, services: Services) -> None:
    """Apply the run's auto-capture policy to an alert: at most one capture per storm."""
    run = services.state.get_run(msg.run)
    if run is None:
        raise PoisonMessage(f"alert {msg.alert_id}: unknown run {msg.run!r}")
    policy = run.policy
    if not policy.enabled:
        log.info("alert %s on run %s: auto-capture is off", msg.alert_id, msg.run)
        return
    key = f"alert:{msg.alert_id}"
    with claimed(services, key) as mine:
        if not mine:
            return
        now = services.clock()
        # The whole job, not only the alerting host: a synchronous job slows down together.
        targets = live_targets(services, run.name)
        if not targets:
            log.warning("alert %s on run %s: no live profiler target to capture", msg.alert_id,
                        run.name)
        elif services.state.reserve_capture(run.name, now, cooldown_s=policy.cooldown_s,
                                            max_per_hour=policy.max_per_hour, key=key):
            kind = policy.kind
            if kind == "auto":
                kind = "snapshot" if any(t.continuous != "OFF" for t in targets) else "on_demand"
            # Named after the alert alone, so a redelivery after a lost publish asks for the
            # same session (the capture stage then treats it as a duplicate).
            digest = hashlib.sha256(msg.alert_id.encode()).hexdigest()[:10]
            session = f"auto-{digest}"
            services.bus.publish(CaptureProfile(
                run=run.name, session=session, capture=kind,
                targets=sorted({t.host for t in targets}), duration_s=policy.duration_s,
                trigger="alert", request_id=f"alert:{msg.alert_id}",
                note=f"{msg.source} alert: {msg.summary or msg.alert_id}"[:1000]))
            log.info("alert %s on run %s: %s capture %s (%s)", msg.alert_id, run.name, kind,
                     session, msg.summary)
        else:
            log.info("alert %s on run %s: suppressed by the cooldown (%.0f s) or the hourly cap "
                     "(%d)", msg.alert_id, run.name, policy.cooldown_s, policy.max_per_hour)


# on_capture_request


def _select_targets(services: Services, run: str, hosts: Sequence[str]) -> list[TargetRecord]:
    """The named targets, or (none named) those with a fresh heartbeat; one per host name.

    Named targets are tried even when their heartbeat is stale: the user asked for them, and
    the capture records why a dead one failed.
    """
    targets = services.state.list_targets(run)
    unknown = sorted(set(hosts) - {t.host for t in targets})
    if unknown:
        raise PoisonMessage(f"run {run!r} has no target(s) {', '.join(unknown)} (registered: "
                            f"{', '.join(sorted({t.host for t in targets})) or 'none'})")
    if not hosts:
        now = services.clock()
        targets = [t for t in targets if not liveness(t, services.settings, now)]
    # One file per host name: a host re-registered on another port is its newest record.
    newest: dict[str, TargetRecord] = {}
    for t in targets:
        if (not hosts or t.host in hosts) and (
                t.host not in newest or t.last_heartbeat > newest[t.host].last_heartbeat):
            newest[t.host] = t
    try:
        limits.check_hosts(len(newest))
    except ValueError as e:
        raise PoisonMessage(str(e)) from e
    return [newest[h] for h in sorted(newest)]


def on_capture_request(msg: CaptureProfile | ContinuousProfiling, services: Services) -> None:
    """Capture a session on the run's targets, or start/stop continuous profiling."""
    if isinstance(msg, ContinuousProfiling):
        continuous(msg, services)
        return
    if msg.capture not in ("on_demand", "snapshot"):
        raise PoisonMessage(f"capture must be on_demand or snapshot, not {msg.capture!r}")
    try:
        limits.check_capture_duration(msg.duration_s)
        check_name("session", msg.session)
    except ValueError as e:
        raise PoisonMessage(str(e)) from e
    run = services.state.get_run(msg.run)
    if run is None:
        raise PoisonMessage(f"capture {msg.session}: unknown run {msg.run!r}")
    targets = _select_targets(services, run.name, msg.targets)
    now = services.clock()
    request_id = msg.request_id or f"capture:{msg.run}/{msg.session}"
    record = SessionRecord(
        run=run.name, session=msg.session, state=CAPTURING, kind=msg.capture,
        trigger=msg.trigger, expected_hosts=[t.host for t in targets], created_at=now,
        updated_at=now, last_arrival_at=now, timings={CAPTURING: now}, request_id=request_id,
        note=msg.note)
    if not targets:
        record.state, record.reason = FAILED, (
            f"run {run.name} has no live profiler targets (none registered, or no heartbeat "
            f"within {services.settings.target_stale_s:g} s): start the workload with "
            "mldiag.sdk.machinelearning_run(...)")
        services.state.create_session(record)
        _give_back_reservation(services, msg)
        return
    stored, created = services.state.create_session(record)
    if not created and stored.request_id != request_id:
        raise PoisonMessage(f"session {run.name}/{msg.session} already exists (created by "
                            f"{stored.request_id or stored.kind}); choose another name")
    if stored.state != CAPTURING:
        return
    key = f"capture:{run.name}/{msg.session}"
    lease = max(services.settings.lease_s, msg.duration_s + _turn_wait_s(services, msg)
                + services.settings.pull_answer_s + 180.0)
    with claimed(services, key, lease_s=lease) as mine:
        if not mine:
            return
        _capture_all(services, run.storage_prefix, msg,
                     [t for t in targets if t.host not in stored.hosts])


def _check_xspace(data: bytes, host: str) -> None:
    """Only bytes that parse as an XSpace go to the bucket: a target's answer is not trusted."""
    with tempfile.NamedTemporaryFile(suffix=".xplane.pb") as f:
        f.write(data)
        f.flush()
        try:
            validate_xplane(Path(f.name), max_bytes=max(len(data), 1))
        except ProfileUnreadable as e:
            raise CaptureFailed(f"the answer of {host} is not a profile, nothing was stored: "
                                f"{str(e).split(': ', 1)[-1]}") from e


def _capture_all(services: Services, prefix: str, msg: CaptureProfile,
                 targets: list[TargetRecord]) -> None:
    """Capture every target in parallel from one start time; keep what succeeds.

    Push targets are called (their profiler server); pull targets get a request in their
    mailbox and answer with their upload, or their host FAILED, which this waits for."""
    directory = session_dir(prefix, msg.run, msg.session)
    # One start time for all, far enough ahead that every request reaches its target first
    # (a pull target looks for requests every pull_poll_s).
    pulled = [t for t in targets if t.pulls]
    lead = services.settings.pull_poll_s + 0.5 if pulled else 0.5
    start_at = services.clock() + lead + 0.05 * len(targets)

    egress = EgressPolicy.from_settings(services.settings)
    cap = services.settings.max_host_bytes

    def one(target: TargetRecord) -> str:
        # One bound for both waits: for our own earlier capture, then for anyone else's.
        deadline = time.monotonic() + _turn_wait_s(services, msg)
        with _profiler_turn(services, target, msg, deadline):
            data = _capture_when_free(target, msg, start_at, egress, cap, deadline)
        _check_xspace(data, target.host)
        services.storage.write_bytes(f"{directory}/{target.host}.xplane.pb", data)
        return ""

    failures: dict[str, str] = {}
    waiting = _ask_pull_targets(services, msg, pulled, start_at, failures)
    pushed = [t for t in targets if not t.pulls]
    with ThreadPoolExecutor(max(1, len(pushed)), thread_name_prefix="capture") as pool:
        # One thread per push target: they wait on the network, and all must start together.
        futures = {t.host: pool.submit(one, t) for t in pushed}
        if waiting:
            unanswered = pull.await_answers(
                services.state, services.settings, msg.run, waiting,
                lambda host, _: _host_answered(services, msg, directory, host),
                services.clock)
            failures |= {host: f"{host}: {reason}" for host, reason in unanswered.items()}
        for host, future in futures.items():
            try:
                future.result()
            except MldiagError as e:
                failures[host] = f"{host}: {e}"
            except Exception as e:  # noqa: BLE001 - one host's failure must not lose the rest
                log.exception("capture %s/%s: %s", msg.run, msg.session, host)
                failures[host] = f"{host}: {type(e).__name__}: {e}"
    for host, reason in failures.items():
        log.warning("capture %s/%s: %s", msg.run, msg.session, reason)
        record = HostRecord(object_name=f"{directory}/{host}.xplane.pb", generation="",
                            size=0, arrived_at=services.clock(), status="FAILED",
                            reason=short_reason(reason))
        services.state.register_host(msg.run, msg.session, host, record, services.clock())
    s = services.state.get_session(msg.run, msg.session)
    if s is None or s.state != CAPTURING or not s.complete():
        return
    if not any(h.status == "ARRIVED" for h in s.hosts.values()):
        _fail(services, msg.run, msg.session, "every target failed: " + short_reason(
            *(h.reason for h in s.hosts.values())), s.version)
        _give_back_reservation(services, msg)
    else:
        complete_session(services, s)


def _ask_pull_targets(services: Services, msg: CaptureProfile, targets: list[TargetRecord],
                      start_at: float, failures: dict[str, str]
                      ) -> dict[str, tuple[ControlRequest, float]]:
    """Leave each pull target its capture request; host -> (request, deadline) of those that
    got one (a full mailbox is a failure: the workload is not taking its requests)."""
    settings = services.settings
    waiting: dict[str, tuple[ControlRequest, float]] = {}
    for target in targets:
        request = pull.capture_request(msg, target, start_at=start_at,
                                       wait_s=_turn_wait_s(services, msg),
                                       now=services.clock(), answer_s=settings.pull_answer_s)
        if services.state.put_request(request, services.clock()):
            waiting[target.host] = (request, pull.capture_deadline(request,
                                                                   settings.pull_answer_s))
        else:
            failures[target.host] = (
                f"{target.host}: {MAX_PENDING_REQUESTS} requests already wait for it: the "
                "workload is not taking its requests (stuck, or gone without a goodbye)")
    return waiting


def _host_answered(services: Services, msg: CaptureProfile, directory: str, host: str) -> bool:
    """Whether a pull target has answered: its upload is in the bucket (its registration is
    on_profile_object's, which must not wait behind this stage for a free worker), or it
    recorded its host FAILED."""
    if services.storage.stat(f"{directory}/{host}.xplane.pb") is not None:
        return True
    s = services.state.get_session(msg.run, msg.session)
    return s is None or host in s.hosts or s.state != CAPTURING


def _give_back_reservation(services: Services, msg: CaptureProfile) -> None:
    """A failed automatic capture does not count for its run's cooldown or hourly cap: an
    alert storm against a busy or dead target must not use up the quota."""
    if msg.trigger == "alert" and msg.request_id:
        services.state.release_capture(msg.run, msg.request_id)


def _uses_profiler(msg: CaptureProfile, target: TargetRecord) -> bool:
    """Whether this capture runs a trace on the target's profiler server, which serves one
    session at a time (snapshots and the ring read what is already recorded)."""
    return msg.capture == "on_demand" and target.continuous == "OFF" and not target.pulls


def _turn_wait_s(services: Services, msg: CaptureProfile) -> float:
    """How long a capture may wait for a busy profiler: `capture_wait_s`, within what one
    function invocation leaves after the capture itself and its upload."""
    return min(services.settings.capture_wait_s,
               max(0.0, INVOCATION_S - 60.0 - msg.duration_s))


@contextmanager
def _profiler_turn(services: Services, target: TargetRecord, msg: CaptureProfile,
                   deadline: float) -> Iterator[None]:
    """Hold the target's profiler for this capture (a claim in the state store, so across
    processes and function instances too). A second capture waits its turn until
    `deadline` (monotonic), then fails with the reason."""
    if not _uses_profiler(msg, target):
        yield
        return
    key = f"profiler:{target.address}:{target.port}"
    owner = f"{services.owner}:{msg.run}/{msg.session}"
    waited = time.monotonic()
    while not services.state.claim(key, owner, msg.duration_s + 60.0, services.clock()):
        if time.monotonic() >= deadline:
            raise ProfilerBusy(f"another profiling session is active on {target.host}: an "
                               f"earlier mldiag capture still held its profiler after "
                               f"{time.monotonic() - waited:.0f} s")
        time.sleep(0.2)
    try:
        yield
    finally:
        services.state.release(key, owner)


def _capture_when_free(target: TargetRecord, msg: CaptureProfile, start_at: float,
                       egress: EgressPolicy, cap: int, deadline: float) -> bytes:
    """Capture; while the profiler answers that another session (not ours: a programmatic
    capture in the workload, another tool) holds it, try again until `deadline`."""
    waited = time.monotonic()
    while True:
        try:
            return capture_target(target, msg, start_at, egress=egress, max_bytes=cap)
        except ProfilerBusy as e:
            if time.monotonic() + 1.0 >= deadline:
                raise ProfilerBusy(f"{e}; still busy after "
                                   f"{time.monotonic() - waited:.0f} s") from e
            time.sleep(1.0)


def continuous(msg: ContinuousProfiling, services: Services) -> None:
    """Start or stop continuous profiling (snapshot mode) on the selected targets."""
    if msg.action not in ("start", "stop"):
        raise PoisonMessage(f"continuous action must be start or stop, not {msg.action!r}")
    try:
        limits.check_window(msg.window_s)
        limits.check_ring_bytes(msg.max_bytes)
    except ValueError as e:
        raise PoisonMessage(str(e)) from e
    run = services.state.get_run(msg.run)
    if run is None:
        raise PoisonMessage(f"continuous {msg.action}: unknown run {msg.run!r}")
    targets = _select_targets(services, run.name, msg.targets)
    if not targets:
        raise PermanentFailure(f"continuous {msg.action}: run {run.name} has no profiler "
                               "targets")
    errors: list[str] = []

    def one(target: TargetRecord) -> None:
        try:
            state = set_continuous(target, msg,
                                   egress=EgressPolicy.from_settings(services.settings))
        except Exception as e:  # noqa: BLE001 - recorded on the target, the others go on
            reason = str(e) if isinstance(e, MldiagError) else f"{type(e).__name__}: {e}"
            services.state.update_target(target.run, target.host, target.port,
                                         last_error=f"continuous {msg.action}: {reason}",
                                         last_request=msg.request_id)
            errors.append(f"{target.host}: {reason}")
            return
        since = 0.0 if state == "OFF" else (target.continuous_since
                                            if target.continuous != "OFF" else services.clock())
        services.state.update_target(target.run, target.host, target.port, continuous=state,
                                     continuous_since=since, last_error="",
                                     last_request=msg.request_id)

    pulled = [t for t in targets if t.pulls]
    with ThreadPoolExecutor(min(16, max(1, len(targets) - len(pulled))),
                            thread_name_prefix="continuous") as pool:
        list(pool.map(one, [t for t in targets if not t.pulls]))
    if pulled:
        errors += _continuous_by_pull(services, msg, pulled)
    if len(errors) == len(targets):
        raise PermanentFailure(f"continuous {msg.action} failed on every target: "
                               + "; ".join(errors))
    for error in errors:
        log.warning("continuous %s on run %s: %s", msg.action, run.name, error)


def _continuous_by_pull(services: Services, msg: ContinuousProfiling,
                        targets: list[TargetRecord]) -> list[str]:
    """Ask pull targets to start or stop their ring and wait for their answers (each writes
    the request's id, and any error, on its target record); the errors, one per host."""
    settings = services.settings
    request_id = msg.request_id or uuid.uuid4().hex
    msg_ = replace(msg, request_id=request_id)
    waiting: dict[str, tuple[ControlRequest, float]] = {}
    errors: list[str] = []
    by_host = {t.host: t for t in targets}
    for target in targets:
        request = pull.continuous_request(msg_, target, now=services.clock(),
                                          answer_s=settings.pull_answer_s)
        if services.state.put_request(request, services.clock()):
            waiting[target.host] = (request, request.created_at + settings.pull_answer_s)
        else:
            errors.append(f"{target.host}: {MAX_PENDING_REQUESTS} requests already wait for "
                          "it: the workload is not taking its requests")
    unanswered = pull.await_answers(
        services.state, settings, msg.run, waiting,
        lambda _, t: t is not None and t.last_request == request_id, services.clock)
    for host, reason in unanswered.items():
        t = by_host[host]
        services.state.update_target(t.run, t.host, t.port,
                                     last_error=f"continuous {msg.action}: {reason}",
                                     last_request=request_id)
        errors.append(f"{host}: {reason}")
    answered = {t.host: t for t in services.state.list_targets(msg.run)
                if t.host in waiting and t.host not in unanswered}
    errors += [f"{h}: {t.last_error}" for h, t in sorted(answered.items()) if t.last_error]
    return errors


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
            _fail(services, run, session, str(e), getattr(message, "version", None))
            return
        raise PoisonMessage(str(e)) from e
    except PoisonMessage as e:
        # Record the reason on the session when the message names one that exists.
        run, session = getattr(message, "run", None), getattr(message, "session", None)
        # Only a message about an existing session's work fails it: a capture request whose
        # name collides with another session must not fail that session.
        if (run and session and isinstance(message, SessionMessage)
                and services.state.get_session(run, session) is not None):
            _fail(services, run, session, f"poison message: {e}",
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
                _fail(services, s.run, s.session,
                      f"no host's profile arrived within {settings.stuck_after_s:g} s"
                      + (f": {failed}" if failed else ""), s.version)
                done["failed"] += 1
            continue
        waited_enough = (not s.expected_hosts and quiet >= settings.settle_s) or (
            s.expected_hosts and quiet >= settings.stuck_after_s)
        if not waited_enough:
            continue
        for host in sorted(set(s.expected_hosts) - set(s.hosts)):
            # Record who is missing, so the report says the analysis lacks that host.
            anchor = next(iter(s.hosts.values())).object_name.rsplit("/", 1)[0]
            services.state.register_host(s.run, s.session, host, HostRecord(
                object_name=f"{anchor}/{host}.xplane.pb", generation="", size=0,
                arrived_at=now, status="FAILED",
                reason=f"{host}: did not arrive within {settings.stuck_after_s:g} s"), now)
        current = services.state.get_session(s.run, s.session)
        if current is not None and complete_session(services, current):
            done["settled"] += 1
    done["requeued"] = requeue_stuck(services, settings.stuck_after_s)
    interval = settings.rescan_interval_s
    # One rescan per interval across every sweeper instance: the claim of its time slot.
    if interval > 0 and services.state.claim(f"rescan:{int(now // interval)}",
                                             services.owner, interval, now):
        done["rescanned"] = rescan(services, window_s=settings.rescan_window_s, now=now)
    return done


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
                    _fail(services, s.run, s.session,
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
