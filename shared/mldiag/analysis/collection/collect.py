"""Collection: the health snapshot's tools, from jobs run in killable worker processes.

The tools (`registry.TOOLS`, one spec each) are assembled from jobs (`jobs.py`) that run in
two worker processes (`workers.py`): one builds op_stats once, in a private xprof workspace,
and runs every tool that reads them; the other runs our timeline pass and the converters that
read the xplanes themselves. So the step set and every metric are the same each time a profile
is analysed, each xprof converter runs once per session, and the two workers use two cores
instead of sharing one GIL.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mldiag
from mldiag.analysis.collection import plan, registry
from mldiag.analysis.collection.hlo import detectors
from mldiag.analysis.collection.hlo import digest as hlo_digest
from mldiag.analysis.collection.hlo import facts as hlo_facts
from mldiag.analysis.collection.hosts import memory_allocators
from mldiag.analysis.collection.hosts.share import combine_host_parts
from mldiag.analysis.collection.hosts.window_tasks import RemoteWindows, WindowExchange, window_of
from mldiag.analysis.collection.jobs import pick_step_trace
from mldiag.analysis.collection.passes import (
    ASYNC_COPIES,
    CUSTOM_CALLS,
    MEMORY_ALLOCATORS,
    PASSES,
    TIMELINE,
)
from mldiag.analysis.collection.profile_input import (
    DEFAULT_MAX_HOST_BYTES,
    ProfileSession,
    host_name,
    resolve_session,
    validate_xplane,
)
from mldiag.analysis.collection.workers import (
    DEFAULT_TOOL_TIMEOUT_S,
    Outcome,
    default_budget_bytes,
    reason_of,
    worker_allocator,
)
from mldiag.analysis.collection.xprof_tools import (
    OP_STATS_FILE,
    NoData,
    XprofWorkspace,
    xprof_installed_version,
)
from mldiag.errors import ProfileUnreadable

SCHEMA_VERSION = "1.0"

# The snapshot's order of the tools (the progress lines' and the report's too).
COLLECTION_TOOLS: tuple[str, ...] = tuple(tool.name for tool in registry.IN_SNAPSHOT_ORDER)

DATA, NO_DATA, ERROR = "DATA", "NO_DATA", "ERROR"

ProgressFn = Callable[[str, dict[str, Any], int, int], None]


def tool_result(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one tool and normalise it to `{name, status, elapsed_ms, data|error}`."""
    start = time.perf_counter()
    status = DATA
    payload: dict[str, Any]
    try:
        payload = {"data": fn()}
    except NoData as e:
        status, payload = NO_DATA, {"data": {"reason": str(e)}}
    except Exception as e:  # noqa: BLE001 - one tool's failure must not sink the snapshot
        status, payload = ERROR, {"error": f"{type(e).__name__}: {e}".splitlines()[0][:500]}
    elapsed = round((time.perf_counter() - start) * 1000.0, 1)
    return {"name": name, "status": status, "elapsed_ms": elapsed, **payload}


# Each HLO detector tool's function, named after it.
_DETECTORS = {name: getattr(detectors, name) for name in registry.DETECTORS}


# mldiag's own passes, filed under the snapshot's `passes` by name (never inside an xprof
# tool's result: a reader re-running `xprof <tool>` would not find them there), with the jobs
# each is made of.
_PASS_JOBS: dict[str, tuple[str, ...]] = {
    TIMELINE: ("timeline_pass",),
    CUSTOM_CALLS: registry.HLO_JOBS,
    ASYNC_COPIES: registry.HLO_JOBS,
    MEMORY_ALLOCATORS: ("memory_profile",),
}

# The `xprof` CLI command that outputs each collection tool's data for the same file (the
# arguments the collection calls it with): what a reader runs to check a cited field. None:
# no command prints it (the smart suggestions are xprof's `smart_suggestion` converter output;
# the detectors are mldiag's, cited as `mldiag.<detector>`).
XPROF_CLI: dict[str, tuple[str, ...] | None] = {
    tool.name: tool.xprof.argv if tool.xprof else None for tool in registry.IN_SNAPSHOT_ORDER}


def _with_cli(result: dict[str, Any]) -> dict[str, Any]:
    cli = XPROF_CLI.get(str(result.get("name")))
    return {**result, "cli": f"xprof {' '.join(cli)}"} if cli else result


class _Assembler:
    """Turns job outcomes into the tool results and mldiag's pass results, each as soon as
    its jobs are done."""

    def __init__(self, progress: ProgressFn | None, tools: Sequence[str]) -> None:
        self.outcomes: dict[str, Outcome] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.passes: dict[str, dict[str, Any]] = {}
        self.progress = progress
        self.tools = [t for t in COLLECTION_TOOLS if t in tools]

    def add(self, outcome: Outcome) -> None:
        self.outcomes[outcome.name] = outcome
        for tool in self.tools:
            needs = plan.TOOL_JOBS[tool]
            if tool not in self.results and all(n in self.outcomes for n in needs):
                result = _with_cli(self._tool(tool, [self.outcomes[n] for n in needs]))
                self.results[tool] = result
                if self.progress is not None:
                    self.progress(tool, result, len(self.results), len(self.tools))
        for name, needs in _PASS_JOBS.items():
            if name not in self.passes and all(n in self.outcomes for n in needs):
                self.passes[name] = self._pass(name, [self.outcomes[n] for n in needs])

    def _tool(self, tool: str, parts: list[Outcome]) -> dict[str, Any]:
        elapsed = round(sum(p.elapsed_ms for p in parts), 1)
        main = parts[0]
        if tool == "get_step_trace":
            return self._step_trace(parts[0], parts[2], elapsed)
        if tool in _DETECTORS:
            return tool_result(tool, lambda: self._detect(tool, *parts)) | {"elapsed_ms": elapsed}
        result = _as_result(tool, main, elapsed)
        if tool == "get_memory_profile" and isinstance(result.get("data"), dict):
            # What the CLI prints; the allocators beside it are mldiag.memory_allocators.
            result["data"] = {k: v for k, v in result["data"].items()
                              if k != memory_allocators.KEY}
        return result

    def _pass(self, name: str, parts: list[Outcome]) -> dict[str, Any]:
        elapsed = round(sum(p.elapsed_ms for p in parts), 1)
        if name == MEMORY_ALLOCATORS:
            return {**_allocators_result(parts[0], elapsed), "from": list(PASSES[name])}
        if name == TIMELINE:
            result = _as_result(name, parts[0], elapsed)
            if isinstance(result.get("data"), dict):
                # Precomputed follow-ups go to the snapshot's own block, not the pass's.
                result["data"] = {k: v for k, v in result["data"].items()
                                  if k != "precomputed"}
            computed_from = list(PASSES[name])
        else:
            result = tool_result(name, lambda: self._hlo_pass(name, *parts)) | {
                "elapsed_ms": elapsed}
            source = (result.get("data") or {}).get("time_source") if result.get(
                "status") == DATA else None
            computed_from = [PASSES[name][0]] + [f"op times: {source}" if source else
                                                 PASSES[name][1]]
        return {**result, "from": computed_from}

    @staticmethod
    def _step_trace(xprof_part: Outcome, pods: Outcome, elapsed: float) -> dict[str, Any]:
        """xprof's own step trace, as `xprof get_step_trace` outputs it (NO_DATA without
        steps); our timeline pass is `mldiag.timeline`, beside it."""
        for part in (xprof_part, pods):
            if part.status == ERROR:
                return _as_result("get_step_trace", part, elapsed)
        data = dict(pick_step_trace(pods.value, xprof_part.value))
        if data.get("status") == "NO_DATA":
            return {"name": "get_step_trace", "status": NO_DATA, "elapsed_ms": elapsed,
                    "data": {"reason": str(data.get("message", "no steps"))}}
        return {"name": "get_step_trace", "status": DATA, "elapsed_ms": elapsed, "data": data}

    @staticmethod
    def _hlo(texts_o: Outcome, prof_o: Outcome, tl_o: Outcome, modules_o: Outcome
             ) -> tuple[dict[str, str], dict[str, Any], _OpTimes]:
        if texts_o.status == ERROR:
            raise RuntimeError(reason_of(texts_o))
        value = texts_o.value if texts_o.status == DATA else {}
        texts, sources = value.get("texts", {}), value.get("sources", {})
        if not texts:
            raise NoData("no HLO modules in the profile")
        prof = prof_o.value if prof_o.status == DATA else None
        tl = tl_o.value if tl_o.status == DATA else {}
        modules = modules_o.value.get("modules", []) if modules_o.status == DATA else []
        return texts, sources, _OpTimes(prof, tl, modules)

    def _detect(self, tool: str, texts_o: Outcome, prof_o: Outcome, tl_o: Outcome,
                modules_o: Outcome) -> dict[str, Any]:
        texts, sources, times = self._hlo(texts_o, prof_o, tl_o, modules_o)
        found = [d.to_dict() for d in _DETECTORS[tool](texts)]
        for d in found:
            if ".py:" not in d["source"]:
                # The op's place in the user's code, from the module's HLO proto metadata (the
                # printed text keeps at most the op name; the proto has the file and line).
                where = sources.get(d["module"], {})
                d["source"] = where.get(d["inner_instruction"]) or where.get(
                    d["instruction"]) or d["source"]
        for d in found:
            ms = times.ms(d["module"], d["instruction"])
            if d.get("chain"):
                # A chain costs what all its links cost, not its first link alone.
                d["links"] = [{"instruction": n, "time_ms": times.ms(d["module"], n)}
                              for n in d["chain"]]
                timed = [link["time_ms"] for link in d["links"] if link["time_ms"] is not None]
                ms = sum(timed) if timed else ms
            d["time_ms"] = round(ms, 4) if ms is not None else None
            d["percent_of_step"] = times.percent(ms)
            d["time_source"] = times.source if ms is not None else "not found on the timeline"
            d["share_of"] = times.share_of
            # With op times available, an instruction absent from them never ran while the
            # profiler was on (e.g. a module compiled and run before the trace started).
            d["executed_in_profile"] = ms is not None if times.times else None
        found.sort(key=lambda d: (-(d["time_ms"] or 0.0), d["module"], d["instruction"]))
        return {
            "detections": found,
            "modules_scanned": len(texts),
            "reference_time_ms": times.reference_ms,
            "time_source": times.source,
        }

    def _hlo_pass(self, name: str, texts_o: Outcome, prof_o: Outcome, tl_o: Outcome,
                  modules_o: Outcome) -> dict[str, Any]:
        texts, sources, times = self._hlo(texts_o, prof_o, tl_o, modules_o)
        if name == ASYNC_COPIES:
            # Host offload and prefetch copies: their direction, and whether each is exposed
            # (its copy-done takes time) or hidden behind compute.
            copies = hlo_facts.async_copies(texts)
            for c in copies:
                ms = times.ms(c["module"], c["copy_done"])
                c["time_ms"] = round(ms, 4) if ms is not None else None
                c["percent_of_step"] = times.percent(ms)
            listed: dict[str, Any] = {"async_copies": copies}
        else:
            # Custom calls: XLA cannot fuse them and its cost model counts them as 0 FLOPs, so
            # their share of time is worth stating.
            calls = hlo_facts.custom_calls(texts)
            for c in calls:
                if ".py:" not in c["source"]:
                    where = sources.get(c["module"], {})
                    c["source"] = where.get(c["instruction"]) or c["source"]
                ms = times.ms(c["module"], c["instruction"])
                c["time_ms"] = round(ms, 4) if ms is not None else None
                c["percent_of_step"] = times.percent(ms)
                c["share_of"] = times.share_of
            calls.sort(key=lambda c: -(c["time_ms"] or 0.0))
            listed = {"custom_calls": calls}
        return {**listed, "modules_scanned": len(texts), "reference_time_ms": times.reference_ms,
                "time_source": times.source, "share_of": times.share_of}


class _OpTimes:
    """Each executed instruction's time, and what its percentage is a share of: a step, or
    (no step markers) the capture window."""

    def __init__(self, prof: Mapping[str, Any] | None, tl: Mapping[str, Any],
                 modules: list[str]) -> None:
        self.times, self.step_ms, self.source = _op_times(prof, tl, modules)
        self.share_of = "step" if tl.get("steps_analyzed") else "capture window"
        self.reference_ms = round(self.step_ms, 4) if self.step_ms else None

    def ms(self, module: str, instruction: str) -> float | None:
        ms = self.times.get((module, instruction))
        return self.times.get(("", instruction)) if ms is None else ms

    def percent(self, ms: float | None) -> float | None:
        return round(100.0 * ms / self.step_ms, 2) if ms is not None and self.step_ms else None


def _as_result(tool: str, o: Outcome, elapsed: float) -> dict[str, Any]:
    if o.status == DATA:
        return {"name": tool, "status": DATA, "elapsed_ms": elapsed, "data": o.value}
    if o.status == NO_DATA:
        return {"name": tool, "status": NO_DATA, "elapsed_ms": elapsed, "data": o.value}
    return {"name": tool, "status": ERROR, "elapsed_ms": elapsed, "error": reason_of(o)}


def _allocators_result(o: Outcome, elapsed: float) -> dict[str, Any]:
    """mldiag.memory_allocators from the memory profile job: the allocators its host's
    converter named (`memory_allocators.summarize`), with that host on a multi-host session;
    the tool's own NO_DATA or ERROR otherwise."""
    name = MEMORY_ALLOCATORS
    if o.status != DATA or not isinstance(o.value, Mapping):
        return _as_result(name, o, elapsed)
    found = o.value.get(memory_allocators.KEY)
    if not isinstance(found, Mapping):
        return {"name": name, "status": NO_DATA, "elapsed_ms": elapsed,
                "data": {"reason": "the memory profile carried no allocator figures"}}
    if "error" in found:
        return {"name": name, "status": ERROR, "elapsed_ms": elapsed,
                "error": str(found["error"])}
    host = {"host": o.value["host"]} if "host" in o.value else {}
    return {"name": name, "status": DATA, "elapsed_ms": elapsed, "data": {**host, **found}}


def _op_times(prof: Mapping[str, Any] | None, tl: Mapping[str, Any], modules: list[str]
              ) -> tuple[dict[tuple[str, str], float], float | None, str]:
    """Per-step time of each executed instruction, and the step time to divide by."""
    if prof and prof.get("grouped_operations"):
        times: dict[tuple[str, str], float] = {}
        total = float(prof.get("total_profile_time_ms") or 0.0)
        for ops in prof["grouped_operations"].values():
            for op in ops:
                parts = str(op.get("name", "")).split("/")
                if len(parts) >= 4 and parts[0] == "by_program":
                    module, inst = parts[1], parts[-1]
                    # Totals over the whole profile, divided by the profile's total time
                    # below: a share of device time, which equals the share of a step.
                    times[(module, inst)] = float(op.get("total_self_time_ms", 0.0))
        return times, total or None, "get_hlo_op_profile self time, total over the profile"
    step_ms = tl.get("step_time_ms_average")
    source = "timeline events on XLA execution lines, ms per step"
    if not step_ms:
        # No step markers: the ops' totals over the capture window (each host's active span).
        span = sum(float(h.get("active_span_ms") or 0.0) for h in tl.get("per_host") or [])
        step_ms = span or None
        source = ("timeline events on XLA execution lines, total over the capture window "
                  "(no step markers)")
    module_by_program = {_program_of(m): m for m in modules}
    times = {}
    for program, ops in (tl.get("op_time_ms_by_program") or {}).items():
        module = module_by_program.get(program, "")
        for op, ms in ops.items():
            times[(module, op)] = float(ms)
            if not program:
                times[("", op)] = float(ms)
    return times, step_ms, source


def _program_of(module: str) -> str:
    # xprof names modules "<name>(<program_id>)", e.g. "jit_step(16)".
    if module.endswith(")") and "(" in module:
        return module[module.rindex("(") + 1 : -1]
    return ""


def _summary(outcomes: Mapping[str, Outcome], budget: int, reduced: Any,
             elapsed_ms: float, session_bytes: int, windows: int = 1,
             by_task: Mapping[int, int] | None = None) -> dict[str, Any]:
    """The snapshot's `collection` block: what ran, how long, what was cut and why."""
    degraded = []
    split = outcomes.get("split_windows")
    if split is not None and split.status == DATA and isinstance(split.value, Mapping):
        windows = int(split.value.get("windows") or windows)
    if windows > 1 and outcomes.get("op_stats") and outcomes["op_stats"].status == DATA:
        # Combined exactly unless the cut says why not (`op_stats_shards.seams`).
        seams = split.value.get("seams") if split is not None and split.status == DATA \
            and isinstance(split.value, Mapping) else None
        why = (seams or {}).get("host_inexact", "") if seams is not None else \
            "the cut's record of the host database was not kept"
        if why:
            degraded.append({
                "tools": "xprof's op_stats (overview, op profile, roofline, step trace, KPIs)",
                "reason": (f"built in {windows} time windows of the host, cut between module "
                           f"executions (over {plan.WINDOW_MIN_BYTES // 1024**2} MB), and "
                           f"combined: device figures are the whole trace's; the host's op "
                           f"database is not combined exactly: {why}"),
            })
    if isinstance(reduced, Mapping) and reduced:
        dropped = sum(int(h.get("python_events_dropped", 0)) for h in reduced.values())
        if dropped:
            degraded.append({
                "tools": "xprof converters",
                "reason": (f"read a copy of the xplanes without {dropped:,} Python-tracer "
                           f"events, which feed no collection tool (the timeline pass read "
                           f"the original files)"),
            })
    skipped = [{"job": o.name, "reason": o.skipped} for o in outcomes.values() if o.skipped]
    killed = [{"job": o.name, "reason": o.killed} for o in outcomes.values() if o.killed]
    peaks = [o.peak_rss_bytes for o in outcomes.values() if o.peak_rss_bytes]
    return {
        "elapsed_ms": round(elapsed_ms, 1),
        "session_bytes": session_bytes,
        "memory_budget_bytes": budget,
        "worker_peak_rss_bytes": max(peaks) if peaks else None,
        # The malloc the workers ran with (workers.worker_allocator): it moves their time and
        # memory by a third on large profiles, so figures are compared like for like.
        "worker_malloc": os.path.basename(worker_allocator() or "") or "glibc",
        "jobs": {o.name: {"status": o.status, "elapsed_ms": o.elapsed_ms,
                          **({"peak_rss_bytes": o.peak_rss_bytes} if o.peak_rss_bytes else {})}
                 for o in sorted(outcomes.values(), key=lambda o: o.name)},
        "degraded": degraded,
        # A large host's op_stats built in time windows and combined (1: whole).
        **({"op_stats_windows": windows} if windows > 1 else {}),
        # A large host's windows shared by the collect job's tasks: which task built each.
        **({"windows_by_task": {str(k): t for k, t in sorted(by_task.items())}}
           if by_task else {}),
        "skipped": skipped,
        "killed": killed,
    }


class SessionTooLarge(ProfileUnreadable):
    """Not even the core of the analysis (the op_stats build) fits the memory budget.

    Permanent under this budget: the same session needs a larger one (or the collect job)."""


def collect(
    session_path: str | os.PathLike[str] | ProfileSession,
    *,
    progress: ProgressFn | None = None,
    tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
    max_host_bytes: int = DEFAULT_MAX_HOST_BYTES,
    prepare_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
    memory_budget_bytes: int | None = None,
    tools: Sequence[str] = COLLECTION_TOOLS,
    host_parts: Mapping[str, Mapping[str, Any]] | None = None,
    host_op_stats: Mapping[str, Path] | None = None,
    on_windows: Callable[[int, int], None] | None = None,
    exchange: WindowExchange | None = None,
    window_min_bytes: int | None = None,
    window_bytes: int | None = None,
    op_stats_out: Path | None = None,
) -> dict[str, Any]:
    """Run the collection tools (`registry.TOOLS`) on a session; return the health snapshot.

    `session_path` is a logdir, a run or session directory, or one `.xplane.pb`. The work
    runs in killable worker processes (`workers.py`): each job gets `tool_timeout_s` (the
    op_stats build that most tools share gets `prepare_timeout_s`); past it, its worker is
    killed and the tools that needed it are ERROR with the reason. Jobs run side by side only
    while their memory estimates fit `memory_budget_bytes` (default: `MLDIAG_MEMORY_BUDGET`,
    else what the cgroup or host allows); what cannot fit is skipped, with the reason in the
    snapshot's `collection` block. Always returns once every tool is accounted for.
    `tools` restricts the snapshot to some tools (and the jobs they need), for benchmarks.
    `host_parts` (host → `collect_host` result) combines a fanned-out collection: the per-host
    jobs are taken from it, and `session_path` holds the converters' inputs of those hosts.
    With `host_op_stats` (host → its op_stats file, from `collect_host`), the session's
    op_stats are those combined as xprof combines hosts (`op_stats_hosts`), not built from
    the hosts' traces, which are then the hosts' memory copies.
    `on_windows(done, total)` is told each time a time window of a large host is converted
    (the pipeline records it in the session's state).
    `exchange` shares a large host's time windows with the other tasks of the collect job
    (`window_tasks`): the windows they publish are combined with those built here.
    `window_min_bytes` and `window_bytes` override when a host is cut in time windows and
    their size (`plan.window_count`).
    `op_stats_out`: where to keep the session's op_stats as xprof's tools read them (built,
    or combined from windows or hosts), for the viewer's prebuild; not written when the
    op_stats job did not complete.
    Raises ProfileUnreadable (one-line reason) when the input cannot be analysed, and
    SessionTooLarge when not even the op_stats build fits the budget.
    """
    session = (
        session_path if isinstance(session_path, ProfileSession)
        else resolve_session(session_path)
    )
    started = time.perf_counter()
    # A host that cannot be read is named and left out; the others are analysed (a pod with
    # one corrupt or truncated host is still a pod). None readable: the session fails.
    unreadable: dict[str, str] = {}
    for xplane in session.xplanes:
        try:
            validate_xplane(xplane, max_bytes=max_host_bytes)
        except ProfileUnreadable as e:
            if len(session.xplanes) == 1:
                raise
            unreadable[host_name(xplane)] = str(e)
    if unreadable:
        readable = tuple(x for x in session.xplanes if host_name(x) not in unreadable)
        if not readable:
            raise ProfileUnreadable("no host could be read: " + "; ".join(
                unreadable.values()))
        session = dataclasses.replace(session, xplanes=readable)
    budget = memory_budget_bytes or default_budget_bytes()
    session_bytes = sum(p.stat().st_size for p in session.xplanes)
    windows = plan.op_stats_windows(session, budget, min_bytes=window_min_bytes,
                                    window_bytes=window_bytes) if host_parts is None else 1
    jobs = plan.plan_jobs(session, tool_timeout_s=tool_timeout_s,
                          prepare_timeout_s=prepare_timeout_s,
                          reduce=session_bytes >= plan.REDUCE_MIN_BYTES and host_parts is None,
                          windows=windows, combine=host_parts is not None,
                          windows_elsewhere=exchange is not None,
                          hosts_built=host_op_stats is not None)
    premade = combine_host_parts(host_parts) if host_parts is not None else []
    jobs = [j for j in plan.needed_jobs(jobs, tools) if j.name not in {o.name for o in premade}]
    core = max((j for j in jobs if j.name.startswith("op_stats")), default=None,
               key=lambda j: j.memory_bytes)
    if core is not None and core.memory_bytes > budget:
        largest = max(p.stat().st_size for p in session.xplanes)
        # xprof builds a session's hosts one at a time: the largest one sets the need.
        which = "" if len(session.xplanes) == 1 else (
            f", whose largest host is {largest / 1024**2:,.1f} MB,")
        raise SessionTooLarge(
            f"session of {session_bytes / 1024**2:,.1f} MB ({len(session.xplanes)} host(s)"
            f"){which} needs about {core.memory_bytes / 1024**3:.2f} GiB for xprof's op_stats "
            f"build, over the memory budget of {budget / 1024**3:.2f} GiB "
            "(MLDIAG_MEMORY_BUDGET)")
    assembler = _Assembler(progress, tools)
    for outcome in premade:
        assembler.add(outcome)
    window_jobs = [j.name for j in jobs if j.name.startswith("op_stats_window")]
    timeline_by_window = any(j.runner.endswith(":timeline_from_windows") for j in jobs)
    root = XprofWorkspace.create_root(session)
    remote = (RemoteWindows(exchange, windows, root / "published")
              if exchange is not None and window_jobs else None)

    def on_outcome(outcome: Outcome) -> None:
        if remote is not None and outcome.name == "split_windows" and outcome.status == DATA:
            if not remote.arrived(outcome.name):
                remote.expect(outcome.value)
        if remote is not None and outcome.name in window_jobs:
            if remote.arrived(outcome.name):
                # Published by another task: the window this task cut is not needed.
                (root / f"window{window_of(outcome.name)}" / "plugins" / "profile" /
                 session.name / session.xplanes[0].name).unlink(missing_ok=True)
            else:
                remote.built_here(outcome)
        assembler.add(outcome)
        if on_windows is not None and outcome.name in window_jobs:
            on_windows(sum(n in assembler.outcomes for n in window_jobs), len(window_jobs))
    try:
        outcomes = plan.run_planned(
            jobs, root, session, budget_bytes=budget, default_timeout_s=tool_timeout_s,
            inputs_for=lambda j, o: {**plan.job_inputs(j, o, windows, timeline_by_window), **(
                {"host_op_stats": [str(host_op_stats[h]) for h in session.hosts]}
                if j.name == "op_stats" and host_op_stats is not None else {})},
            on_outcome=on_outcome, done={o.name: o for o in premade}, remote=remote)
        saved = root / "plugins" / "profile" / session.name / OP_STATS_FILE
        if op_stats_out is not None and saved.is_file() and outcomes.get(
                "op_stats", Outcome("op_stats", ERROR, None, 0.0)).status == DATA:
            op_stats_out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(saved, op_stats_out)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    results = assembler.results
    overview = results.get("get_xprof_overview", {}).get("data", {})
    env = overview.get("run_environment", {}) if isinstance(overview, dict) else {}
    reduced = outcomes.get("reduce_for_converters")
    texts = outcomes.get("hlo_texts")
    tl = outcomes.get("timeline_pass")
    precomputed = dict(tl.value.get("precomputed") or {}) if (
        tl is not None and tl.status == DATA and isinstance(tl.value, dict)) else {}
    overlap = precomputed.get("analyze_async_overlap")
    if overlap is not None:
        # xprof's tool names the session it read (the workspace path, scrubbed to this).
        overlap["data"] = {**overlap["data"], "session_id": str(session.path)}
    return {
        "schema_version": SCHEMA_VERSION,
        "session": {**session.describe(), "device_type": env.get("device_type"),
                    **({"unreadable_hosts": unreadable} if unreadable else {})},
        "xprof_version": xprof_installed_version(),
        "mldiag_version": mldiag.__version__,
        "collected_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "elapsed_ms": round(elapsed_ms, 1),
        "collection": _summary(outcomes, budget, reduced.value if reduced else None,
                               elapsed_ms, session_bytes, windows,
                               remote.by_task if remote is not None else None),
        "tools": {name: results[name] for name in COLLECTION_TOOLS if name in tools},
        # mldiag's own passes by name (passes.PASSES), each with what it was computed from.
        "passes": {name: assembler.passes[name] for name in _PASS_JOBS
                   if name in assembler.passes},
        # Follow-ups answered from data collection had decoded anyway: tool → {args, data,
        # how}. The investigator's call with exactly those arguments is answered from it.
        "precomputed_follow_ups": precomputed,
        # Each module's fingerprint, entry parameters and op signatures, for `mldiag diff`.
        "hlo_digests": hlo_digest.digests(texts.value.get("texts", {}),
                                          texts.value.get("sources", {}))
        if texts is not None and texts.status == DATA and isinstance(texts.value, dict)
        else [],
    }


def write_json(obj: Mapping[str, Any], path: Path) -> None:
    """Write `obj` as pretty JSON, atomically (readers never see half a file)."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    tmp.replace(path)
