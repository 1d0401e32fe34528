"""One host's share of a fanned-out collection (`collect_host`), and the combine step's
session-level outcomes from every host's share (`combine_host_parts`).

Each host runs in its own `collect_host` (one function instance, or a collect job task):
its op_stats, whole or in time windows combined as one host, its passes and per-host tools,
and its memory copy (`hosts.jobs`, planned by `plan.host_jobs`). `collect(host_parts=...,
host_op_stats=...)` then combines the hosts: their op_stats as xprof combines hosts
(`op_stats_hosts`), the per-host outcomes here.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mldiag.analysis.collection import plan
from mldiag.analysis.collection.jobs import has_python_events
from mldiag.analysis.collection.profile_input import (
    DEFAULT_MAX_HOST_BYTES,
    ProfileSession,
    validate_xplane,
)
from mldiag.analysis.collection.workers import (
    DATA,
    DEFAULT_TOOL_TIMEOUT_S,
    ERROR,
    NO_DATA,
    Job,
    Outcome,
    default_budget_bytes,
    reason_of,
)
from mldiag.analysis.collection.xprof_tools import NoData, XprofWorkspace
from mldiag.errors import ProfileUnreadable


def collect_host(
    xplane: Path,
    host: str,
    out_dir: Path,
    *,
    tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
    max_host_bytes: int = DEFAULT_MAX_HOST_BYTES,
    memory_budget_bytes: int | None = None,
    window_min_bytes: int | None = None,
    window_bytes: int | None = None,
) -> dict[str, Any]:
    """One host's share of a fanned-out collection (see `collect(host_parts=...)`).

    Runs the host's jobs (`plan.host_jobs`) in worker processes: its op_stats, built whole
    or, over the window size, in time windows combined as one host; its timeline pass, async
    overlap share, memory profile and utilization; and its memory copy. Writes the op_stats
    to `out_dir/<host>.op_stats.pb` and the copy the combine step's converters read beside
    them to `out_dir/<host>.xplane.pb`. Returns the parts, JSON-able. Raises
    ProfileUnreadable for an unusable xplane, or when the host's op_stats could not be
    built (the combine step then leaves the host out, naming it and why).
    """
    validate_xplane(xplane, max_bytes=max_host_bytes)
    session = ProfileSession(run="", name="host", path=xplane.parent, xplanes=(xplane,))
    budget = memory_budget_bytes or default_budget_bytes()
    size = xplane.stat().st_size
    windows = plan.window_count(size, budget, min_bytes=window_min_bytes,
                                window_bytes=window_bytes)
    python = size >= plan.REDUCE_MIN_BYTES and has_python_events(xplane)
    jobs = plan.host_jobs(size, windows, python=python, tool_timeout_s=tool_timeout_s,
                          prepare_timeout_s=tool_timeout_s)
    op_stats_out = out_dir / f"{host}.op_stats.pb"
    windowed = windows > 1 and not python

    def inputs_for(job: Job, outcomes: Mapping[str, Outcome]) -> dict[str, Any]:
        if job.name == "host_parts":
            return {"windowed": windowed, "reduce": python}
        if job.name == "host_op_stats" and windows > 1:
            return {"out": str(op_stats_out), "parts": [
                outcomes[n].value for n in job.after if outcomes[n].status == DATA],
                "seams": outcomes["split_windows"].value["seams"]}
        if job.name == "host_op_stats":
            return {"out": str(op_stats_out)}
        return plan.job_inputs(job, outcomes, windows, windowed)

    root = XprofWorkspace.create_root(session)
    started = time.perf_counter()
    try:
        outcomes = plan.run_planned(jobs, root, session, budget_bytes=budget,
                                    default_timeout_s=tool_timeout_s, inputs_for=inputs_for)
        built = outcomes["host_op_stats"]
        if built.status != DATA:
            raise ProfileUnreadable(f"its op_stats could not be built: {reason_of(built)}")
        o = outcomes["host_parts"]
        if o.status != DATA:
            parts: dict[str, Any] = {name: {"status": ERROR, "value": reason_of(o)} for name in (
                "timeline", "memory_profile", "utilization_viewer")}
        else:
            parts = dict(o.value)
        if windowed:
            line = built.value.get("timeline")
            parts["timeline"] = {"status": DATA, "value": line} if line is not None else {
                "status": ERROR, "value": "a time window's share of the timeline is missing"}
        parts["op_stats"] = {"windows": built.value["windows"], "bytes": built.value["bytes"]}
        split = outcomes.get("split_windows")
        if split is not None and split.status == DATA:
            # Why the windows' host databases would not add up ('' when they do).
            parts["op_stats"]["host_inexact"] = split.value["seams"]["host_inexact"]
        copy = parts.pop("converter_input", None)
        if copy is None:
            raise ProfileUnreadable("its memory copy could not be written: "
                                    f"{parts.get('reduce', {}).get('value')}")
        out_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(copy, out_dir / f"{host}.xplane.pb")
        parts["converter_input"] = "memory_copy"
    finally:
        shutil.rmtree(root, ignore_errors=True)
    peaks = [o.peak_rss_bytes for o in outcomes.values() if o.peak_rss_bytes]
    return {"host": host, "bytes": size, "elapsed_ms": round(
        (time.perf_counter() - started) * 1000.0, 1), "parts": parts,
        "worker_peak_rss_bytes": max(peaks, default=None),
        "jobs": {n: {"status": o.status, "elapsed_ms": round(o.elapsed_ms, 1),
                     "peak_rss_bytes": o.peak_rss_bytes} for n, o in outcomes.items()}}


def combine_host_parts(host_parts: Mapping[str, Mapping[str, Any]]) -> list[Outcome]:
    """The session-level outcomes of the per-host jobs, from every host's parts."""
    hosts = sorted(host_parts)
    parts = {h: host_parts[h]["parts"] for h in hosts}
    elapsed = max((float(host_parts[h].get("elapsed_ms", 0.0)) for h in hosts), default=0.0)
    out = []

    def failed(name: str) -> list[str]:
        return [f"{h}: {p[name]['value']}" for h, p in parts.items()
                if p.get(name, {}).get("status") == ERROR]

    bad = failed("timeline")
    if len(bad) == len(parts):
        out.append(Outcome("timeline_pass", ERROR, "; ".join(bad), elapsed))
    else:
        from mldiag.analysis.collection.hosts.pod import cross_host
        from mldiag.analysis.collection.xspace import timeline

        # A host whose pass failed is named; the others are measured without it.
        good = {h: p for h, p in parts.items() if p.get("timeline", {}).get("status") == DATA}
        hts = [timeline.HostTimeline.from_json(p["timeline"]["value"]) for p in good.values()]
        summary = timeline.summarize(hts)
        functions = {h: p["python_events"]["value"] for h, p in good.items()
                     if p.get("python_events", {}).get("status") == DATA
                     and p["python_events"]["value"]}
        pod = cross_host(hts, functions)
        if bad:
            summary["failed_hosts"] = bad
        if pod is not None:
            if bad:
                pod["failed_hosts"] = [*pod.get("failed_hosts", []), *bad]
            summary["pod"] = pod
        overlaps = [(h if len(hosts) > 1 else "", p["async_overlap"]["value"])
                    for h, p in parts.items()
                    if p.get("async_overlap", {}).get("status") == DATA
                    and p["async_overlap"]["value"] is not None]
        # Every host's share, or none: a follow-up answered from some hosts would differ.
        if overlaps and len(overlaps) == len(hosts):
            from mldiag.analysis.collection.jobs import combine_async_overlap

            summary["precomputed"] = {"analyze_async_overlap": combine_async_overlap(overlaps)}
        out.append(Outcome("timeline_pass", DATA, summary, elapsed))
    from mldiag.analysis.collection.jobs import combine_memory_profiles

    memory = {h: (p["memory_profile"]["value"] if p["memory_profile"]["status"] == DATA
                  else None) for h, p in parts.items()}
    try:
        out.append(Outcome("memory_profile", DATA, combine_memory_profiles(memory), elapsed))
    except NoData as e:
        bad = failed("memory_profile")
        out.append(Outcome("memory_profile", ERROR, "; ".join(bad), elapsed) if bad and len(
            bad) == len(hosts) else Outcome("memory_profile", NO_DATA, {"reason": str(e)},
                                            elapsed))
    util = [(h, p["utilization_viewer"]) for h, p in parts.items()]
    got = next(((h, u["value"]) for h, u in util if u["status"] == DATA), None)
    if got is not None:
        value = {**got[1], "host": got[0]} if len(hosts) > 1 else got[1]
        out.append(Outcome("utilization_viewer", DATA, value, elapsed))
    else:
        reasons = "; ".join(f"{h}: {_partreason_of(u)}" for h, u in util)
        out.append(Outcome("utilization_viewer", NO_DATA, {"reason": reasons}, elapsed))
    # The combine step's converters read each host's memory copy as its trace (no copy of
    # their own to look for): the jobs that would are told there is none.
    reduced = {h: {k: v for k, v in p["reduce"]["value"].items() if k != "memory_copy_bytes"}
               for h, p in parts.items() if p.get("reduce", {}).get("status") == DATA}
    if reduced:
        out.append(Outcome("reduce_for_converters", DATA, reduced, elapsed))
    return out


def _partreason_of(part: Mapping[str, Any]) -> str:
    value = part.get("value")
    return str(value.get("reason")) if isinstance(value, Mapping) else str(value)
