"""The analysis stages, from a CAPTURED session to its report.

- collect: the 15-tool health snapshot, then triage: OPTIMAL goes straight to the report,
  anything else to investigation. A session over the function's limits goes to the collect
  job; a large or many-host one fans out to collect_host, one host each, and is combined.
- investigate: the investigator and its follow-up calls.
- render_report: analysis.json and summary.html (with the diff against the baseline when an
  alert triggered the session); the session is REPORTED.
- prebuild_viewer: the XProf viewer's caches of a reported session, built into the bucket.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from mldiag import limits, regression, retention
from mldiag.analysis import (
    OPTIMAL,
    ProfileSession,
    SessionTooLarge,
    Triage,
    build_analysis,
    convert_windows,
    default_budget_bytes,
    read_session,
    render_summary_html,
    task_windows,
    triage,
)
from mldiag.analysis import collect as collect_snapshot
from mldiag.analysis import investigate as run_investigator
from mldiag.errors import MldiagError, ProfileUnreadable
from mldiag.messages import (
    AnalyzeSession,
    InvestigateSession,
    PrebuildViewer,
    RenderReport,
)
from mldiag.model import (
    ANALYZING,
    CAPTURED,
    INVESTIGATING,
    REPORTED,
    SessionRecord,
    short_reason,
)
from mldiag.settings import Settings
from mldiag.stages.claims import claimed, toucher
from mldiag.stages.fanout import fan_out, fans_out, host_file, host_parts, share_hosts
from mldiag.stages.services import Services, fail, publish_or_undo
from mldiag.stages.sessions import (
    Superseded,
    analysis_dir,
    current,
    generations,
    profile_session,
    read_json,
    stage_key,
    unless_superseded,
)
from mldiag.stages.window_shards import window_count_of, window_exchange

log = logging.getLogger(__name__)


# collect


def _write_json(services: Services, s: SessionRecord, filename: str,
                obj: Mapping[str, Any]) -> str:
    data = json.dumps(obj, indent=2, default=str).encode()
    return _write_artifact(services, s, filename, data, "application/json")


def _write_artifact(services: Services, s: SessionRecord, filename: str, data: bytes,
                    content_type: str) -> str:
    base = analysis_dir(s)
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
    s = current(services, msg, (CAPTURED, ANALYZING))
    if s is None:
        return
    if s.progress.startswith("collected:"):
        _route_after_collect(services, msg, s.progress.split(":", 1)[1])
        return
    arrived = {h: r for h, r in s.hosts.items() if r.status == "ARRIVED"}
    if not arrived:
        fail(services, msg.run, msg.session, "no host's profile arrived: " + short_reason(
            *(r.reason or h for h, r in s.hosts.items())), msg.version)
        return
    settings = services.settings
    sizes = [r.size for r in arrived.values()]
    try:
        # Checked before anything is downloaded: /tmp is memory on a Cloud Function.
        limits.check_session_bytes({h: r.size for h, r in arrived.items()},
                                   settings.max_session_bytes)
    except ValueError as e:
        fail(services, msg.run, msg.session, str(e), msg.version)
        return
    over = _over_function_limits(settings, sizes)
    if over and not settings.in_job:
        _hand_to_job(services, msg, s, over)
        return
    parts = None
    if fans_out(settings, sizes):
        parts = host_parts(services, s, sorted(arrived))
        if parts is None and settings.in_job:
            # The job's tasks share the hosts: no function instance gets one it cannot hold.
            try:
                share_hosts(services, msg, s, sorted(arrived), wait=True)
            except Superseded as e:
                log.info("collect job stopped: %s", e)
                return
            parts = host_parts(services, s, sorted(arrived))
        if parts is None:
            fan_out(services, msg, s, sorted(arrived))
            return
    key = "combine" if parts is not None else "collect"
    try:
        with claimed(services, stage_key(key, msg), keep_alive=toucher(
                services, msg.run, msg.session, msg.version, ANALYZING)) as mine:
            if not mine:
                return
            try:
                with unless_superseded(services, msg):
                    _collect_claimed(services, msg, parts)
            except Superseded as e:
                # A later host started the next version, which has its own analysis.
                log.info("collect stopped: %s", e)
    except _TooLargeHere as e:
        # The claim was released: the collect job takes the session with its own.
        _hand_to_job(services, msg, s, str(e))


class _TooLargeHere(MldiagError):
    """The session does not fit this instance's memory budget, and a collect job exists: a
    private signal, not a failure (the session is handed to the collect job). Permanent for
    this instance: retrying here cannot make it fit."""


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
        fail(services, msg.run, msg.session, str(e), msg.version)
        return
    except ProfileUnreadable as e:
        # Bad input: FAILED with the reason, acknowledged.
        fail(services, msg.run, msg.session, str(e), msg.version)
        return
    snapshot["session"]["path"] = services.storage.uri(analysis_dir(s).rsplit("/", 1)[0])
    snapshot["session"]["version"] = s.version
    failed = {h: r.reason for h, r in sorted(s.hosts.items()) if r.status == "FAILED"}
    failed |= {h: str(p["failed"]) for h, p in (host_parts or {}).items() if "failed" in p}
    snapshot["session"]["capture"] = {
        # A session nothing asked for says so ("programmatic" would claim the workload's code).
        "kind": "dropped" if s.dropped else s.kind, "trigger": s.trigger, "note": s.note,
        "failed_hosts": failed}
    if services.settings.in_job:
        # The big-session path: the report says where the collection ran and why.
        snapshot["collection"]["collect_job"] = _job_note(services, s) or {
            "why": "the session was handed to the collect job"}
    _write_json(services, s, "health_snapshot.json", snapshot)
    # Triage runs once per version, here; the investigator and the report read its result.
    result = triage(snapshot)
    _write_json(services, s, TRIAGE_JSON, result.to_dict())
    status = result.status
    services.state.transition(msg.run, msg.session, ANALYZING, expect=[ANALYZING],
                              version=msg.version, now=services.clock(),
                              progress=f"collected:{status}")
    _route_after_collect(services, msg, status)


def op_stats_name(s: SessionRecord) -> str:
    """Where the session's op_stats are kept (the viewer's prebuild reads them)."""
    return f"{analysis_dir(s)}/v{s.version}/op_stats.pb"


def _collect_snapshot(services: Services, s: SessionRecord,
                      host_parts: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    """The health snapshot; the session's op_stats as xprof's tools read them are kept
    beside it (`op_stats_name`)."""
    keep = Path(tempfile.mkdtemp(prefix="mldiag-op-stats-"))
    try:
        snapshot = _snapshot(services, s, host_parts, keep / "op_stats.pb")
        if (keep / "op_stats.pb").is_file():
            services.storage.put_file(op_stats_name(s), keep / "op_stats.pb")
        return snapshot
    finally:
        shutil.rmtree(keep, ignore_errors=True)


def _snapshot(services: Services, s: SessionRecord,
              host_parts: Mapping[str, Mapping[str, Any]] | None,
              op_stats_out: Path) -> dict[str, Any]:
    settings = services.settings
    options: dict[str, Any] = {"max_host_bytes": settings.max_host_bytes,
                               "memory_budget_bytes": settings.memory_budget_bytes,
                               "tool_timeout_s": settings.tool_timeout_s,
                               "window_min_bytes": settings.window_min_bytes or None,
                               "window_bytes": settings.window_bytes or None,
                               "op_stats_out": op_stats_out}
    if host_parts is None:

        def windows_done(done: int, total: int) -> None:
            # A large host converts window by window: the session's state says how far.
            services.state.transition(s.run, s.session, ANALYZING, expect=[ANALYZING],
                                      version=s.version, now=services.clock(),
                                      progress=f"windows:{done}/{total}")

        options["on_windows"] = windows_done
        names = [r.object_name for r in s.hosts.values() if r.status == "ARRIVED"]
        exchange = window_exchange(services, s, analysis_dir(s))
        try:
            with services.storage.local_files(names, generations=generations(s),
                                              max_bytes=settings.max_host_bytes) as local:
                return collect_snapshot(profile_session(s, local), exchange=exchange,
                                        **options)
        finally:
            if exchange is not None:
                exchange.close()
    ok = {h: p for h, p in host_parts.items() if "failed" not in p}
    if not ok:
        raise ProfileUnreadable("no host could be analysed: " + short_reason(
            *(f"{h}: {p['failed']}" for h, p in sorted(host_parts.items()))))
    # The converters read each host's memory copy, beside the session's op_stats combined
    # from the hosts' own (`collect_host`).
    inputs = {h: host_file(s, h, "converter-input.pb") for h in ok}
    built = {h: host_file(s, h, "op_stats.pb") for h in ok}
    with services.storage.local_files([*inputs.values(), *built.values()]) as local:
        view = Path(tempfile.mkdtemp(prefix="mldiag-combine-"))
        try:
            for h, name in inputs.items():
                (view / f"{h}.xplane.pb").symlink_to(local / name.rsplit("/", 1)[1])
            session = ProfileSession(run=s.run, name=s.session, path=view, xplanes=tuple(
                view / f"{h}.xplane.pb" for h in sorted(ok)))
            snapshot = collect_snapshot(session, host_parts=ok, host_op_stats={
                h: local / name.rsplit("/", 1)[1] for h, name in built.items()}, **options)
        finally:
            shutil.rmtree(view, ignore_errors=True)
    fanned, degraded = fanned_out_record(host_parts, ok)
    snapshot["collection"]["fanned_out"] = fanned
    snapshot["collection"]["degraded"].extend(degraded)
    return snapshot


def fanned_out_record(host_parts: Mapping[str, Mapping[str, Any]],
                      ok: Mapping[str, Mapping[str, Any]]
                      ) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """A fanned-out collection's record (the snapshot's `collection.fanned_out`), and what
    its hosts could not combine exactly (a host built in time windows whose host database
    would not add up: `HostActivity.inexact`), as `degraded` entries."""
    fanned = {
        "hosts": len(host_parts), "failed": sorted(h for h in host_parts if h not in ok),
        "per_host_ms": {h: p.get("elapsed_ms") for h, p in sorted(host_parts.items())},
        "per_host_worker_peak_rss_bytes": {h: p.get("worker_peak_rss_bytes")
                                           for h, p in sorted(ok.items())},
        # How each host's op_stats were built (1: whole), and by which task of the collect
        # job when its tasks shared the hosts.
        "op_stats_windows": {h: p["parts"].get("op_stats", {}).get("windows")
                             for h, p in sorted(ok.items())},
        "hosts_by_task": {h: p["job_task"] for h, p in sorted(host_parts.items())
                          if "job_task" in p}}
    degraded = []
    for h, p in sorted(ok.items()):
        built_as = p["parts"].get("op_stats", {})
        if built_as.get("host_inexact"):
            degraded.append({
                "tools": f"xprof's op_stats of host {h}",
                "reason": (f"built in {built_as.get('windows')} time windows and combined: "
                           f"its host op database is not combined exactly: "
                           f"{built_as['host_inexact']}")})
    return fanned, degraded


def collect_windows(msg: AnalyzeSession, services: Services) -> None:
    """A task other than the first of a collect job of several (`settings.job_task` of
    `settings.collect_job_tasks`): convert its share of a large host's time windows and
    publish them for task 0, which runs the collection and combines them (`window_tasks`).
    Nothing to do when the session has no windows to share."""
    s = current(services, msg, (CAPTURED, ANALYZING))
    if s is None:
        return
    settings = services.settings
    arrived = sorted(h for h, r in s.hosts.items() if r.status == "ARRIVED")
    if fans_out(settings, [s.hosts[h].size for h in arrived]):
        share_hosts(services, msg, s, arrived, wait=False)
        return
    exchange = window_exchange(services, s, analysis_dir(s))
    if exchange is None:
        log.info("collect job task %d: session %s/%s has no time windows to share",
                 settings.job_task, msg.run, msg.session)
        return
    windows = window_count_of(services, s)
    # Claimed before the download: task 0 takes over only what nobody holds.
    held = [k for k in task_windows(windows, settings.job_task, settings.collect_job_tasks)
            if exchange.take(k)]
    try:
        if not held:
            return
        (record,) = [r for r in s.hosts.values() if r.status == "ARRIVED"]
        with services.storage.local_files([record.object_name], generations=generations(s),
                                          max_bytes=settings.max_host_bytes) as local, \
                unless_superseded(services, msg):
            done = convert_windows(
                local / record.object_name.rsplit("/", 1)[1], exchange, windows, held,
                tool_timeout_s=settings.tool_timeout_s,
                prepare_timeout_s=settings.tool_timeout_s,
                max_host_bytes=settings.max_host_bytes,
                memory_budget_bytes=settings.memory_budget_bytes)
        log.info("collect job task %d of %s/%s: windows %s", settings.job_task, msg.run,
                 msg.session, done["done"])
    except ProfileUnreadable as e:
        # Task 0 reads the same file and records the session FAILED with the reason.
        log.warning("collect job task %d: %s", settings.job_task, e)
    except Superseded as e:
        log.info("collect job task %d stopped: %s", settings.job_task, e)
    finally:
        exchange.close()


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
        fail(services, msg.run, msg.session, f"session too large for the collect function: "
             f"{why}, and no collect job is configured (MLDIAG_COLLECT_JOB)", msg.version)
        return
    key = stage_key("job", msg)
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
    return f"{analysis_dir(s)}/v{s.version}/collect-job.json"


def _job_note(services: Services, s: SessionRecord) -> dict[str, Any] | None:
    """In the collect job: why the collect function handed the session over, if it said."""
    try:
        note = json.loads(services.storage.read_bytes(_job_note_name(s)))
    except (FileNotFoundError, ValueError):
        return None
    return {"why": str(note.get("why", ""))} if isinstance(note, dict) else None


TRIAGE_JSON = "triage.json"


def _triaged(services: Services, s: SessionRecord, snapshot: Mapping[str, Any]) -> Triage:
    """The version's triage, as collect wrote it, with the session's reading. A version
    collected before collect wrote it is triaged here, once, and written for the next stage."""
    reading = read_session(snapshot)
    name = f"{analysis_dir(s)}/v{s.version}/{TRIAGE_JSON}"
    if services.storage.stat(name) is not None:
        return Triage.from_dict(read_json(services, name), reading)
    result = triage(reading)
    _write_json(services, s, TRIAGE_JSON, result.to_dict())
    return result


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
    publish_or_undo(services, moved, ANALYZING, message)


def investigate(msg: InvestigateSession, services: Services) -> None:
    """Run the investigator on the snapshot and write investigation.json."""
    s = current(services, msg, (INVESTIGATING,))
    if s is None:
        return
    if s.progress == "investigated":
        services.bus.publish(RenderReport(run=msg.run, session=msg.session, version=msg.version))
        return
    with claimed(services, stage_key("investigate", msg), keep_alive=toucher(
            services, msg.run, msg.session, msg.version, INVESTIGATING)) as mine:
        if not mine:
            return
        base = analysis_dir(s)
        snapshot = read_json(services, f"{base}/v{s.version}/health_snapshot.json")
        result = _triaged(services, s, snapshot)
        names = [r.object_name for r in s.hosts.values() if r.status == "ARRIVED"]
        # The follow-ups read the generations collect analysed, each under the per-host cap.
        with services.storage.local_files(names, generations=generations(s),
                                          max_bytes=services.settings.max_host_bytes) as local:
            investigation = run_investigator(snapshot, result, services.investigator,
                                             session=profile_session(s, local))
        _write_json(services, s, "investigation.json",
                    {**investigation, "triage": result.to_dict()})
        services.state.transition(msg.run, msg.session, INVESTIGATING, expect=[INVESTIGATING],
                                  version=msg.version, now=services.clock(),
                                  progress="investigated")
        services.bus.publish(RenderReport(run=msg.run, session=msg.session,
                                          version=msg.version))


def render_report(msg: RenderReport, services: Services) -> None:
    """Write analysis.json and summary.html; mark the session REPORTED."""
    s = current(services, msg, (ANALYZING, INVESTIGATING))
    if s is None:
        return
    with claimed(services, stage_key("render", msg)) as mine:
        if not mine:
            return
        base = f"{analysis_dir(s)}/v{s.version}"
        snapshot = read_json(services, f"{base}/health_snapshot.json")
        result = _triaged(services, s, snapshot)
        if services.storage.stat(f"{base}/investigation.json") is not None:
            investigation = read_json(services, f"{base}/investigation.json")
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
        # Before the report: a redelivery marks what a failure left unmarked (marks hold).
        retention.mark_superseded(services.storage, analysis_dir(s), s, services.clock())
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


def _viewer_tasks(services: Services, s: SessionRecord) -> dict[str, Any]:
    """How the collect job's tasks share a prebuild's windowed hosts: their count, and the
    claim of one host (`viewer_prebuild.Take`), renewed while its windows are built. The
    claim is the cache's (its key covers the hosts' generations and the xprof version)."""
    from mldiag.viewer_cache import cache_key

    settings = services.settings
    tasks = max(1, settings.collect_job_tasks) if settings.in_job else 1
    if tasks == 1:
        return {}  # every host is this one's: nothing to claim
    key = f"viewer-host:{s.run}/{s.session}/{cache_key(s)}"

    def take(host: str) -> AbstractContextManager[bool]:
        return claimed(services, f"{key}/{host}", keep_alive=lambda now: None)

    return {"tasks": tasks, "take": take}


def _viewer_to_build(msg: PrebuildViewer, services: Services) -> SessionRecord | None:
    """The session whose viewer caches `msg` asks for, unless there is nothing to build: a
    newer version (or none) supersedes it, no host arrived, or its caches are built or
    skipped already."""
    s = services.state.get_session(msg.run, msg.session)
    if s is None or s.state != REPORTED or s.version != msg.version:
        return None
    if not any(h.status == "ARRIVED" for h in s.hosts.values()):
        return None
    from mldiag import viewer_cache

    prefix = viewer_cache.cache_prefix(s)
    if services.storage.stat(f"{prefix}/{viewer_cache.SKIPPED}") is not None:
        return None
    if services.storage.stat(f"{prefix}/{viewer_cache.MANIFEST}") is not None and not (
            msg.rebuild and viewer_cache.lacks_files(services.storage, prefix)):
        return None
    if msg.rebuild:
        log.info("viewer caches of %s/%s v%d expired: rebuilt on demand", msg.run,
                 msg.session, msg.version)
    return s


def _viewer_claim(kind: str, msg: PrebuildViewer) -> str:
    """A prebuild's claim; a rebuild's is its own (the first build's is completed)."""
    key = f"{kind}:{msg.run}/{msg.session}/v{msg.version}"
    return f"{key}/rebuild:{msg.rebuild}" if msg.rebuild else key


def prebuild_viewer_share(msg: PrebuildViewer, services: Services) -> None:
    """A task other than the first of a collect job of several (`settings.job_task`): build
    its share of the session's windowed hosts for task 0's `prebuild_viewer`
    (`viewer_prebuild.build_share`). Nothing to do when the session has none, or its caches
    are built or skipped already; a plan over the budget or the deadline is task 0's to say."""
    s = _viewer_to_build(msg, services)
    if s is None or msg.rebuild:
        return  # a rebuild is task 0's alone (its hosts' parts may have expired in part)
    from mldiag import viewer_prebuild

    settings = services.settings
    try:
        hosts = viewer_prebuild.build_share(
            s, services.storage, task=settings.job_task,
            budget_bytes=settings.viewer_memory_budget_bytes or default_budget_bytes(),
            window_bytes=settings.window_bytes or None, deadline_s=settings.viewer_deadline_s,
            **_viewer_tasks(services, s))
    except viewer_prebuild.NotPrebuilt as e:
        log.info("collect job task %d: viewer caches of %s/%s v%d not prebuilt (%s): task 0 "
                 "says why", settings.job_task, msg.run, msg.session, msg.version, e)
        return
    log.info("collect job task %d: viewer caches of %s/%s v%d: built hosts %s",
             settings.job_task, msg.run, msg.session, msg.version, hosts or "none")


def prebuild_viewer(msg: PrebuildViewer, services: Services) -> None:
    """Build the XProf viewer's caches of a REPORTED session into the bucket, once per
    version, so that the first open in the console is warm (see mldiag.viewer).

    A session whose conversions need more than this instance's memory goes to the collect job
    (task 0 runs this stage there, with the job's `MLDIAG_VIEWER_MEMORY_BUDGET`); over that
    too, its large hosts are viewed in time windows (`viewer_prebuild`), and when not even
    those fit, `skipped.json` says why."""
    s = _viewer_to_build(msg, services)
    if s is None:
        return
    from mldiag import viewer_cache

    prefix = viewer_cache.cache_prefix(s)
    need = viewer_cache.prebuild_memory_bytes(s)
    settings = services.settings
    budget = settings.viewer_memory_budget_bytes or default_budget_bytes()
    if need > budget and services.jobs is not None and not settings.in_job:
        # The collect job has the memory (its container's, without collection workers).
        key = _viewer_claim("viewer-job", msg)
        if services.state.claim(key, services.owner, settings.stuck_after_s, services.clock()):
            try:
                execution = services.jobs.run(msg)
            except BaseException:
                services.state.release(key, services.owner)
                raise
            log.info("viewer caches of %s/%s v%d handed to the collect job (%s): they need "
                     "about %.1f GiB, over this instance's %.1f GiB", msg.run, msg.session,
                     msg.version, execution, need / 1024**3, budget / 1024**3)
        return
    with claimed(services, _viewer_claim("viewer", msg)) as mine:
        if not mine:
            return
        from mldiag import viewer_prebuild

        try:
            # Hosts whose conversions would not fit the budget are viewed in time windows.
            manifest = viewer_prebuild.prebuild(s, services.storage, budget_bytes=budget,
                                                op_stats_name=op_stats_name(s),
                                                window_bytes=settings.window_bytes or None,
                                                deadline_s=settings.viewer_deadline_s,
                                                fresh=bool(msg.rebuild),
                                                **({} if msg.rebuild
                                                   else _viewer_tasks(services, s)))
        except viewer_prebuild.NotPrebuilt as e:
            # Said once, where the console looks: its first open then says why it cannot
            # convert what xprof would need more memory for.
            largest = max(r.size for r in s.hosts.values() if r.status == "ARRIVED")
            where = "the collect job's" if settings.in_job else "this instance's"
            memory = (f"its largest host is {largest / 1024**2:,.1f} MB, and xprof's viewer "
                      f"conversions need about {limits.size_text(need)}, over {where} memory "
                      f"budget of {limits.size_text(budget)}, and " if need > budget else "")
            why = f"not prebuilt: {memory}{e}"
            services.storage.write_bytes(f"{prefix}/{viewer_cache.SKIPPED}", json.dumps(
                {"reason": why, "needs_bytes": need, "budget_bytes": budget,
                 "at": services.clock()}).encode(), content_type="application/json")
            log.warning("viewer caches of %s/%s v%d %s", msg.run, msg.session, msg.version,
                        why)
            return
        if manifest.get("view"):
            log.info("viewer caches of %s/%s v%d: hosts viewed in time windows %s (whole, "
                     "they need about %.1f GiB, over %.1f GiB)", msg.run, msg.session,
                     msg.version, manifest["view"]["windows"], need / 1024**3, budget / 1024**3)
        log.info("viewer caches of %s/%s v%d built in %.1f s (%d files)", msg.run, msg.session,
                 msg.version, manifest["elapsed_ms"] / 1000, len(manifest["files"]))
