"""A many-host or large session's fan-out: one `collect_host` per host, then the combine.

Each host's share (`collection.hosts.share.collect_host`: its op_stats, passes and per-host
tools, and the memory copy the combine step's converters read) is written under
`analysis/v<n>/hosts/`; `collect` combines them when every host is done (`host_parts`).

Where the hosts' shares run:
- by the collect function: one `CollectHost` message per host (`fan_out`), each handled
  by a function instance of its own; the host that completes the set asks for the combine;
- in the collect job (a session over the function's limits): the job's tasks share the
  hosts (`share_hosts`). Each task takes the hosts it can claim, starting from its own
  place in the list; task 0 then waits for the others' and takes over a host whose task
  died (its claim stops being renewed and lapses), and combines. No host goes to a
  function instance that could not hold it.

A superseded version's shares stop: a `CollectHost` of an old version does nothing, one
running stops at its next check (`sessions.unless_superseded`), and task 0 stops waiting.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mldiag.analysis import collect_host as collect_host_parts
from mldiag.errors import ProfileUnreadable
from mldiag.messages import AnalyzeSession, CollectHost
from mldiag.model import ANALYZING, CAPTURED, SessionRecord
from mldiag.settings import Settings
from mldiag.stages.claims import claimed, toucher
from mldiag.stages.services import Services
from mldiag.stages.sessions import (
    Superseded,
    analysis_dir,
    current,
    generations,
    read_json,
    superseded_by,
    unless_superseded,
)

log = logging.getLogger(__name__)
# How often task 0 of the collect job looks for the other tasks' hosts.
SHARE_POLL_S = 2.0


def fans_out(settings: Settings, sizes: Sequence[int]) -> bool:
    return len(sizes) >= max(settings.fanout_min_hosts, 2) or (
        len(sizes) >= 2 and sum(sizes) >= settings.fanout_min_bytes)


def host_part_name(s: SessionRecord, host: str) -> str:
    return f"{analysis_dir(s)}/v{s.version}/hosts/{host}.json"


def host_file(s: SessionRecord, host: str, suffix: str) -> str:
    return f"{analysis_dir(s)}/v{s.version}/hosts/{host}.{suffix}"


def hosts_done(services: Services, s: SessionRecord, hosts: Sequence[str]) -> set[str]:
    """The hosts whose collect_host result is written."""
    present = {o.name for o in services.storage.list(f"{analysis_dir(s)}/v{s.version}/hosts/")}
    return {h for h in hosts if host_part_name(s, h) in present}


def host_parts(services: Services, s: SessionRecord,
               hosts: Sequence[str]) -> dict[str, dict[str, Any]] | None:
    """Every host's collect_host result, or None while any is missing."""
    if len(hosts_done(services, s, hosts)) < len(hosts):
        return None
    return {h: read_json(services, host_part_name(s, h)) for h in hosts}


def _mark_fanned_out(services: Services, msg: AnalyzeSession, s: SessionRecord,
                     hosts: Sequence[str]) -> bool:
    if s.progress.startswith("fanout:"):
        return True
    return services.state.transition(msg.run, msg.session, ANALYZING,
                                     expect=[CAPTURED, ANALYZING], version=msg.version,
                                     now=services.clock(),
                                     progress=f"fanout:{len(hosts)}") is not None


def fan_out(services: Services, msg: AnalyzeSession, s: SessionRecord,
            hosts: Sequence[str]) -> None:
    """Ask for every host's collect_host. Once fanned out, a repeat of the request (the
    sweeper's, for a session stuck past its deadline) asks again for the hosts still missing:
    a host whose instance died is retried, and the claims keep the others from running twice.
    """
    if not _mark_fanned_out(services, msg, s, hosts):
        return
    done = hosts_done(services, s, hosts)
    for host in hosts:
        if host not in done:
            services.bus.publish(CollectHost(run=msg.run, session=msg.session,
                                             version=msg.version, host=host))


def share_hosts(services: Services, msg: AnalyzeSession, s: SessionRecord,
                hosts: Sequence[str], *, wait: bool) -> None:
    """In the collect job: this task's share of a fanned-out session's hosts (see the
    module's notes). With `wait` (task 0), returns once every host's share is written,
    taking over those whose claim lapsed."""
    settings = services.settings
    if settings.job_task == 0 and not _mark_fanned_out(services, msg, s, hosts):
        return
    tasks = max(settings.collect_job_tasks, 1)
    first = (settings.job_task % tasks) * len(hosts) // tasks
    for host in [*hosts[first:], *hosts[:first]]:
        if host not in hosts_done(services, s, [host]):
            _collect_host(services, CollectHost(run=msg.run, session=msg.session,
                                                version=msg.version, host=host), ask=False)
    while wait:
        missing = [h for h in hosts if h not in hosts_done(services, s, hosts)]
        if not missing:
            return
        why = superseded_by(services, msg)
        if why:
            raise Superseded(why)
        time.sleep(SHARE_POLL_S)
        for host in missing:  # a lapsed claim is taken here; a live one is left to its task
            _collect_host(services, CollectHost(run=msg.run, session=msg.session,
                                                version=msg.version, host=host), ask=False)


def collect_host(msg: CollectHost, services: Services) -> None:
    """One host of a fanned-out session: its per-host jobs, written to analysis/v<N>/hosts/;
    the host that completes the set asks for the combine step."""
    _collect_host(services, msg, ask=True)


def _collect_host(services: Services, msg: CollectHost, *, ask: bool) -> None:
    s = current(services, msg, (ANALYZING,))
    if s is None or msg.host not in s.hosts or s.hosts[msg.host].status != "ARRIVED":
        return
    with claimed(services, f"collect_host:{msg.run}/{msg.session}#v{msg.version}/"
                           f"{msg.host}", keep_alive=toucher(
                               services, msg.run, msg.session, msg.version, ANALYZING)) as mine:
        if not mine:
            return
        settings = services.settings
        record = s.hosts[msg.host]
        with services.storage.local_files(
                [record.object_name], generations=generations(s),
                max_bytes=settings.max_host_bytes) as local, \
                tempfile.TemporaryDirectory(prefix="mldiag-host-") as out:
            xplane = local / record.object_name.rsplit("/", 1)[1]
            try:
                with unless_superseded(services, msg):
                    result = collect_host_parts(
                        xplane, msg.host, Path(out), tool_timeout_s=settings.tool_timeout_s,
                        max_host_bytes=settings.max_host_bytes,
                        memory_budget_bytes=settings.memory_budget_bytes,
                        window_min_bytes=settings.window_min_bytes or None,
                        window_bytes=settings.window_bytes or None)
            except ProfileUnreadable as e:
                # This host is left out of the report, which names it and says why.
                result = {"host": msg.host, "failed": str(e)}
            except Superseded as e:
                # The next version fans out on its own; this host's share is moot.
                log.info("collect_host %s stopped: %s", msg.host, e)
                return
            if settings.in_job:
                result["job_task"] = settings.job_task
            if "failed" not in result:
                # Its op_stats and the copy the combine step's converters read beside them.
                for suffix, local_name in (("op_stats.pb", f"{msg.host}.op_stats.pb"),
                                           ("converter-input.pb", f"{msg.host}.xplane.pb")):
                    services.storage.put_file(host_file(s, msg.host, suffix),
                                              Path(out) / local_name)
        services.storage.write_bytes(host_part_name(s, msg.host),
                                     json.dumps(result, default=str).encode(),
                                     content_type="application/json")
    hosts = sorted(h for h, r in s.hosts.items() if r.status == "ARRIVED")
    if ask and len(hosts_done(services, s, hosts)) == len(hosts):
        services.bus.publish(AnalyzeSession(run=msg.run, session=msg.session,
                                            version=msg.version))
