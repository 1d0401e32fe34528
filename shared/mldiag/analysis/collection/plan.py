"""The collection's plan: which jobs a session needs, in which worker, after what, and the
memory each is expected to take (per byte of xplane, measured), so that `workers.run_jobs`
runs side by side only what fits the budget. Large single hosts are planned as time windows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mldiag.analysis.collection import registry
from mldiag.analysis.collection.jobs import has_counters, has_python_events
from mldiag.analysis.collection.profile_input import ProfileSession
from mldiag.analysis.collection.workers import DATA, Job, Outcome, reason_of, run_jobs

# Peak resident memory of each job per byte of xplane it reads, over a fixed base, as measured
# on profiles of 10 and 111 MB (BENCHMARKS.md, "Large profiles"). Used to plan which jobs may
# run side by side under the memory budget, and to skip what cannot fit at all. These are the
# jobs no one tool owns (the op_stats build, our passes, the copies for the converters); a
# tool's own jobs are in its spec (`registry.ToolSpec.rss_per_byte`).
_SHARED_RSS_PER_BYTE = {"op_stats": 30.0, "op_stats_reduced": 20.0,
                        # One time window's build, per byte of the window: 3.0 GB for a 122 MB
                        # window of the 993 MB TPU-shaped profile (glibc's malloc).
                        "op_stats_window": 24.0,
                        # The one-pass window writer holds one chunk of a line's columns and
                        # lets the file's pages go as it writes them: 0.24 GB at 468 MB
                        # TPU-shaped, 0.29 GB at 1.9 GB (the base's, about).
                        "split_windows": 0.1,
                        # Our timeline pass lets each line go once read (XSpaceScan.passing):
                        # what it keeps is a few columns of the device events.
                        "timeline": 2.0,
                        # The async-overlap follow-up, computed in the timeline pass after its
                        # own work (xspace/async_overlap.py): 1.9 per byte on its own on a
                        # 94 MB TPU-shaped profile, and no higher a peak than the pass's alone
                        # after it. As its own pass (a large host's timeline by window), one
                        # device plane's three columns at a time, decoded chunk by chunk:
                        # 0.28 GB at 468 MB and 0.74 GB at 1.9 GB TPU-shaped.
                        "async_overlap": 0.4,
                        # Two one-pass copies (XSpaceScan.write_split), one chunk of a line at
                        # a time: 0.22 GB at 468 MB, 0.26 GB at 1.9 GB.
                        "reduce_for_converters": 0.1}
RSS_PER_BYTE: dict[str, float] = {
    **_SHARED_RSS_PER_BYTE,
    **{job: per_byte for tool in registry.TOOLS for job, per_byte in tool.rss_per_byte}}
BASE_RSS = 320 * 1024**2
# Below this many bytes of xplanes the converters read the files as they are: the copy
# without Python-tracer events costs more than it saves.
REDUCE_MIN_BYTES = 16 * 1024**2
# A single host over this size has its op_stats built in time windows of about
# WINDOW_BYTES each and combined (jobs.split_windows, jobs.op_stats_window): the build's
# memory follows a window's size, not the host's (2.0-2.4 GB per window of about 120 MB).
WINDOW_MIN_BYTES = 256 * 1024**2
WINDOW_BYTES = 128 * 1024**2


def op_stats_windows(session: ProfileSession, budget_bytes: int | None = None, *,
                     min_bytes: int | None = None, window_bytes: int | None = None) -> int:
    """How many time windows the op_stats build of `session` runs in (1: the whole file).
    See `window_count`."""
    if len(session.xplanes) != 1:
        return 1
    return window_count(session.xplanes[0].stat().st_size, budget_bytes,
                        min_bytes=min_bytes, window_bytes=window_bytes)


def window_count(size: int, budget_bytes: int | None = None, *, min_bytes: int | None = None,
                 window_bytes: int | None = None) -> int:
    """How many time windows a single host of `size` bytes is converted in (1: whole).

    Hosts over `min_bytes` (WINDOW_MIN_BYTES) are cut into windows of at most `window_bytes`
    (WINDOW_BYTES), smaller when two builds side by side (one per worker) would not fit half
    of `budget_bytes` each. A function of its arguments only: every task of the collect job
    computes the same count from the session's record, before it has the file."""
    if size <= (WINDOW_MIN_BYTES if min_bytes is None else min_bytes):
        return 1
    window = WINDOW_BYTES if window_bytes is None else window_bytes
    if budget_bytes:
        fits = int((budget_bytes / 2 - BASE_RSS) / RSS_PER_BYTE["op_stats_window"])
        window = min(window, max(fits, 16 * 1024**2))
    return -(-size // window)

JOBS_MODULE = "mldiag.analysis.collection.jobs"


def run_planned(jobs: Sequence[Job], root: Path, session: ProfileSession,
                **options: Any) -> dict[str, Outcome]:
    """Run planned jobs (runners of `jobs` and `hosts.jobs`) in worker processes that each
    join the workspace created at `root` (`jobs.attach`); `options` as `workers.run_jobs`'s."""
    return run_jobs(jobs, setup=f"{JOBS_MODULE}:attach",
                    setup_args={"root": str(root), "session": session}, **options)


def plan_jobs(session: ProfileSession, *, tool_timeout_s: float, prepare_timeout_s: float,
          reduce: bool, windows: int = 1, combine: bool = False,
          windows_elsewhere: bool = False, hosts_built: bool = False) -> list[Job]:
    """The jobs of a collection, in plan order (a worker runs its jobs in that order).

    `hosts_built`: a fanned-out session whose hosts' op_stats were built by their own
    `collect_host` (`hosts.jobs`); the op_stats job combines them, and the traces are the
    hosts' memory copies.

    `windows_elsewhere`: the other tasks of the collect job convert the time windows
    (`window_tasks`), so the first worker, which would build them, runs a whole-host
    timeline pass meanwhile, beside the second's reduction."""
    sizes = [p.stat().st_size for p in session.xplanes]
    total, largest = sum(sizes), max(sizes)
    # Per byte of the original file: with the Python-tracer events dropped, xprof's op_stats
    # build peaked at 20 bytes per original byte on a Python-traced 111 MB profile (29 per byte
    # it read), and at 30 without the reduction.

    def job(name: str, group: str, after: tuple[str, ...] = (), per_byte: float = 0.0,
            bytes_read: int = 0, timeout: float | None = None, runner: str = "",
            requires: tuple[str, ...] = ()) -> Job:
        # Tools that read op_stats would rebuild them if the build failed: skip them instead.
        requires = requires or tuple(d for d in after if d == "op_stats")
        return Job(name=name, group=group, runner=f"{JOBS_MODULE}:{runner or name}", after=after,
                   requires=requires, memory_bytes=int(BASE_RSS + per_byte * bytes_read),
                   timeout_s=timeout)

    pre: tuple[str, ...] = ("reduce_for_converters",) if reduce else ()
    opstats = ("op_stats",)
    jobs = []
    if reduce:
        # In the second worker, which then runs the smart suggestions and the timeline pass
        # while the first builds op_stats from the reduced copy.
        jobs.append(job("reduce_for_converters", "xplane", (), RSS_PER_BYTE[
            "reduce_for_converters"], largest))
    python = reduce and any(has_python_events(x) for x in session.xplanes)
    # A large host without Python-tracer events has its timeline measured window by window,
    # in the window jobs (the windows are its events, cut), and combined: that pass's memory
    # then follows a window's size, not the host's.
    windowed_timeline = windows > 1 and not python
    if windows > 1:
        # One large host: cut in time windows in one pass (bounded by a line's columns), the
        # windows' op_stats built side by side in both workers, then combined. The cut
        # starts at once in the first worker, beside the reduction, unless it must read the
        # reduced copy (Python-tracer events to drop): at 1.9 GB the windows waited 68 s.
        names = tuple(f"op_stats_window{k}" for k in range(windows))
        jobs.append(job("split_windows", "xplane" if python else "xprof",
                        pre if python else (), RSS_PER_BYTE["split_windows"], largest,
                        prepare_timeout_s))
        # Three windows in four to the first worker: the second also runs our passes
        # (reduction, timeline) before its windows (see the end of the plan).
        jobs += [job(name, "xplane" if k % 4 == 3 else "xprof", ("split_windows",),
                     RSS_PER_BYTE["op_stats_window"], -(-total // windows), prepare_timeout_s,
                     runner="op_stats_window", requires=("split_windows",))
                 for k, name in enumerate(names)]
        jobs.append(job("op_stats", "xprof", (*pre, *names), 0.0, 0, prepare_timeout_s,
                        requires=names))
        if windowed_timeline:
            jobs.append(job("timeline_pass", "xprof", (*names, "async_overlap"), 0.0, 0,
                            runner="timeline_from_windows", requires=names))
    elif reduce:
        # Built first (waiting for the reduction only when it has Python-tracer events to
        # drop), then the overview read beside the memory copies (jobs.op_stats).
        jobs.append(job("op_stats_build", "xprof", pre if python else (), RSS_PER_BYTE[
            "op_stats_reduced" if python else "op_stats"], largest, prepare_timeout_s))
        jobs.append(job("op_stats", "xprof", ("op_stats_build", *pre), 0.0, 0,
                        prepare_timeout_s, requires=("op_stats_build",)))
    elif hosts_built:
        jobs.append(job("op_stats", "xprof", (), RSS_PER_BYTE["smart_suggestions_saved"],
                        total, prepare_timeout_s))
    else:
        jobs.append(job("op_stats", "xprof", pre, RSS_PER_BYTE["op_stats"], largest,
                        prepare_timeout_s))
    jobs += [
        # xprof's step trace in two halves, one per worker (jobs._step_trace_half).
        job("step_trace_pods", "xprof", opstats),
        job("device_information", "xprof", opstats),
        job("hosts", "xprof", opstats),
        job("roofline", "xprof", opstats),
        job("op_profile", "xprof", opstats),
        job("list_hlo_modules", "xprof", opstats),
        job("hlo_texts", "xprof", ("op_stats", "list_hlo_modules")),
        job("peak_allocations", "xprof", opstats),
        job("kpi_metrics", "xprof", ("op_stats", "roofline", "memory_profile")),
        # The second worker, beside the op_stats build: on small sessions the smart
        # suggestions first (they build op_stats of their own in memory), the timeline pass
        # (our own, on the original files), and the converters that read the xplanes rather
        # than op_stats. The step trace's halves after the build stay in this worker: the
        # xprof half beside the smart suggestions held 3.1 GB at 94 MB, in turn 2.0 GB.
        *([] if reduce or combine else [
            job("smart_suggestions", "xplane", pre, RSS_PER_BYTE["smart_suggestions"], total)]),
        job("async_overlap", "xplane", pre, RSS_PER_BYTE["async_overlap"], largest,
            runner="async_overlap_pass") if windowed_timeline else
        job("timeline_pass", "xplane", pre,
            max(RSS_PER_BYTE["timeline"], RSS_PER_BYTE["async_overlap"]), largest),
        # From the memory copies where the reduction wrote them (hosts.copies.memory_copy).
        job("memory_profile", "xplane", pre, RSS_PER_BYTE["memory_profile"], largest),
        # Without a TPU plane of counters it answers from the plane headers, reading nothing.
        job("utilization_viewer", "xplane", pre, RSS_PER_BYTE["utilization_viewer"],
            largest if any(has_counters(x) for x in session.xplanes) else 0),
        # On large sessions after the op_stats build, reading them from the saved file and
        # the rest from the memory copies: 5.3 s CPU became 0.3 s at 94 MB TPU-shaped.
        *([job("smart_suggestions", "xplane", ("op_stats", *pre),
               RSS_PER_BYTE["smart_suggestions_saved"], total)] if reduce else []),
        # Combining a fanned-out session: after the op_stats build, from the saved file, and
        # the hosts' traces one at a time (xprof reads a session's XSpaces in turn: two hosts
        # of 73 and 98 MB peaked at the larger one's 1.37 GB).
        *([job("smart_suggestions", "xplane", ("op_stats",), RSS_PER_BYTE[
            "smart_suggestions_saved" if hosts_built else "smart_suggestions"],
            total if hosts_built else largest)] if combine else []),
        job("xprof_step_trace", "xplane", opstats),
    ]
    if windows_elsewhere and windows > 1:
        # The whole-host pass: the timeline's, or with windowed timelines the async overlap's.
        timeline = next(j for j in jobs if j.group == "xplane" and j.name in (
            "timeline_pass", "async_overlap"))
        jobs.remove(timeline)
        at = next(i for i, j in enumerate(jobs) if j.name == "split_windows") + 1
        jobs.insert(at, Job(name=timeline.name, group="xprof", runner=timeline.runner,
                            memory_bytes=timeline.memory_bytes, timeout_s=timeline.timeout_s))
    # A worker runs its jobs in plan order, each once its inputs are done: the second
    # worker's windows go after its own passes (which need no window) and before its first
    # job that waits for the combined op_stats (which needs them all).
    late = [j for j in jobs if j.group == "xplane" and j.name.startswith("op_stats_window")]
    if late:
        rest = [j for j in jobs if j not in late]
        at = next((i for i, j in enumerate(rest)
                   if j.group == "xplane" and "op_stats" in j.after), len(rest))
        jobs = rest[:at] + late + rest[at:]
    return jobs


def window_jobs(size: int, windows: int, held: Sequence[int], *,
                prepare_timeout_s: float) -> list[Job]:
    """A collect-job task's share of a large host (`window_tasks.convert_windows`): the cut
    of the windows `held`, then their op_stats builds, alternating between the two workers."""
    per_window = int(BASE_RSS + RSS_PER_BYTE["op_stats_window"] * -(-size // windows))
    jobs = [Job(name="split_windows", group="xprof", runner=f"{JOBS_MODULE}:split_windows",
                memory_bytes=int(BASE_RSS + RSS_PER_BYTE["split_windows"] * size),
                timeout_s=prepare_timeout_s)]
    jobs += [Job(name=f"op_stats_window{k}", group="xprof" if i % 2 == 0 else "xplane",
                 runner=f"{JOBS_MODULE}:op_stats_window", after=("split_windows",),
                 requires=("split_windows",), memory_bytes=per_window,
                 timeout_s=prepare_timeout_s) for i, k in enumerate(held)]
    return jobs


def job_inputs(job: Job, outcomes: Mapping[str, Outcome], windows: int = 1,
               timeline_by_window: bool = False) -> dict[str, Any]:
    """What `job` is given to run, from the outcomes of the jobs it waited for."""
    if job.name == "split_windows":
        return {"windows": windows}
    if job.name.startswith("op_stats_window"):
        split = outcomes["split_windows"].value
        return {"window": int(job.name.removeprefix("op_stats_window")),
                "windows": int(split["windows"]), "cuts": list(split.get("cuts", [])),
                "timeline": timeline_by_window, "steps": split.get("steps", []),
                "excluded_steps": split.get("excluded_steps", [])}
    if job.runner.endswith(":timeline_from_windows"):
        overlap = outcomes.get("async_overlap")
        return {"parts": [outcomes[n].value for n in job.after
                          if n.startswith("op_stats_window") and outcomes[n].status == DATA],
                "async_overlap": overlap.value if overlap and overlap.status == DATA else None}
    if job.name == "op_stats" and "op_stats_build" in job.after:
        reduced = outcomes.get("reduce_for_converters")
        return {"built": True,
                "reduced": reduced.value if reduced and reduced.status == DATA else {}}
    if job.name == "op_stats" and windows > 1:
        parts = [outcomes[f"op_stats_window{k}"] for k in range(windows)]
        reduced = outcomes.get("reduce_for_converters")
        return {"window_parts": [o.value["op_stats"] for o in parts if o.status == DATA],
                "seams": outcomes["split_windows"].value["seams"],
                "reduced": reduced.value if reduced and reduced.status == DATA else {}}
    if job.name == "kpi_metrics":
        return {"overview": _payload(outcomes["op_stats"]),
                "roofline": _payload(outcomes["roofline"]),
                "memory_profile": _payload(outcomes["memory_profile"])}
    if job.name in ("memory_profile", "smart_suggestions"):
        reduced = outcomes.get("reduce_for_converters")
        return {"reduced": reduced.value if reduced and reduced.status == DATA else {},
                "after_op_stats": "op_stats" in job.after}
    if job.name == "hlo_texts":
        listed = outcomes.get("list_hlo_modules")
        modules = listed.value.get("modules", []) if listed and listed.status == DATA else []
        return {"modules": list(modules)}
    return {}


def _payload(o: Outcome) -> dict[str, Any]:
    return {"data": o.value} if o.status == DATA else {"error": reason_of(o)}


HOST_JOBS_MODULE = "mldiag.analysis.collection.hosts.jobs"


def host_jobs(size: int, windows: int, *, python: bool, tool_timeout_s: float,
              prepare_timeout_s: float) -> list[Job]:
    """One host's share of a fanned-out collection (`hosts.jobs`): its op_stats, whole or in
    `windows` time windows combined as one host (each window's build in either worker, as
    in `plan_jobs`), beside its passes and per-host tools, which read the whole trace one
    line at a time (the timeline's or async overlap's columns, the copies' one line)."""
    passes = ("async_overlap", "reduce_for_converters") if windows > 1 and not python else (
        "timeline", "async_overlap", "reduce_for_converters")
    parts = Job(name="host_parts", group="xplane", runner=f"{HOST_JOBS_MODULE}:host_parts",
                memory_bytes=int(BASE_RSS + max(RSS_PER_BYTE[p] for p in passes) * size),
                timeout_s=tool_timeout_s)
    if windows <= 1:
        # With Python-tracer events, after the copy without them (`host_parts` writes it).
        return [Job(name="host_op_stats", group="xprof",
                    runner=f"{HOST_JOBS_MODULE}:host_op_stats",
                    after=("host_parts",) if python else (),
                    memory_bytes=int(BASE_RSS + RSS_PER_BYTE[
                        "op_stats_reduced" if python else "op_stats"] * size),
                    timeout_s=prepare_timeout_s), parts]
    cut, *builds = window_jobs(size, windows, range(windows),
                               prepare_timeout_s=prepare_timeout_s)
    names = tuple(j.name for j in builds)
    return [cut, parts, *builds, Job(
        name="host_op_stats", group="xprof", runner=f"{HOST_JOBS_MODULE}:host_windows",
        after=names, requires=names, memory_bytes=BASE_RSS, timeout_s=prepare_timeout_s)]


# Each collection tool and the jobs it is made of.
TOOL_JOBS: dict[str, tuple[str, ...]] = {
    tool.name: tool.jobs for tool in registry.IN_SNAPSHOT_ORDER}


def needed_jobs(jobs: list[Job], tools: Sequence[str]) -> list[Job]:
    """The jobs that `tools` need, with everything those jobs wait for."""
    unknown = [t for t in tools if t not in TOOL_JOBS]
    if unknown:
        raise ValueError(f"unknown collection tool(s): {', '.join(unknown)}")
    by_name = {j.name: j for j in jobs}
    todo = [n for t in tools for n in TOOL_JOBS[t]]
    keep: set[str] = set()
    while todo:
        name = todo.pop()
        if name in keep or name not in by_name:
            continue
        keep.add(name)
        todo.extend((*by_name[name].after, *by_name[name].requires))
    return [j for j in jobs if j.name in keep]
