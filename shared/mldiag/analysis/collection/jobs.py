"""The collection jobs, as they run inside a worker process (see `workers.py`).

Each job is `fn(context, inputs) -> JSON-like value`, raising NoData when the profile has
nothing for it. The parent (`collect.py`) plans them and assembles the tools from their
results; a job never depends on another job's in-memory state, only on files in the session's
private workspace (op_stats and HLO protos that xprof saved there) and on `inputs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mldiag.analysis.collection import registry
from mldiag.analysis.collection.hosts import memory_allocators
from mldiag.analysis.collection.hosts.copies import (
    MEMORY_DIR,
    memory_copy,
    peaks_memory_profile,
    reduce_one,
)
from mldiag.analysis.collection.hosts.memory_peaks import MEMORY_EVENTS
from mldiag.analysis.collection.passes import ASYNC_OVERLAP, HOST_PYTHON_EVENTS
from mldiag.analysis.collection.profile_input import ProfileSession
from mldiag.analysis.collection.registry import XprofCommand
from mldiag.analysis.collection.xprof_tools import OP_STATS_FILE, NoData, XprofWorkspace
from mldiag.analysis.collection.xspace import timeline
from mldiag.analysis.collection.xspace.host_activity import HostActivity
from mldiag.analysis.collection.xspace.scan import Line, Plane, XSpaceScan


@dataclass
class Context:
    ws: XprofWorkspace
    session: ProfileSession


def attach(args: Mapping[str, Any], worker: Mapping[str, Any]) -> Context:
    """Worker setup: join the session's workspace, with this group's own result cache."""
    session: ProfileSession = args["session"]
    ws = XprofWorkspace.attach(Path(args["root"]), session, cache_name=worker["group"])
    _share_run_dir_lock()
    return Context(ws=ws, session=session)


_EXCLUSIVE = {"on": False}


def _share_run_dir_lock() -> None:
    """Let the tools that only read the saved op_stats convert side by side.

    xprof serialises every op_stats-based conversion of a run directory under one exclusive
    file lock, since any of them may rebuild op_stats. Here only the op_stats job builds them,
    before every tool that reads them starts (the plan's dependencies), so the readers take
    the lock shared: the step trace no longer waits seconds behind the smart suggestions. The
    op_stats job itself holds it exclusively.
    """
    import contextlib
    import fcntl

    from xprof.cli.internal.oss import xprof_client

    if getattr(xprof_client, "_mldiag_shared_lock", False):
        return

    @contextlib.contextmanager
    def lock_run_dir(lock_dir: Path, run_dir_hash: str) -> Any:
        lock_dir.mkdir(parents=True, exist_ok=True)
        with open(lock_dir / f"{run_dir_hash}.lock", "a+", encoding="utf-8") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX if _EXCLUSIVE["on"] else fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    xprof_client._lock_run_dir = lock_run_dir
    xprof_client._mldiag_shared_lock = True


def _xprof(tool: str) -> XprofCommand:
    command = registry.BY_NAME[tool].xprof
    if command is None:
        raise ValueError(f"{tool}: its spec names no xprof command")
    return command


def _call(tool: str) -> Any:
    """The job that answers `tool` with its xprof command, as its spec says to call it."""
    command = _xprof(tool)

    def run(ctx: Context, inputs: Mapping[str, Any]) -> Any:
        return ctx.ws.call(command.name, **command.kwargs)

    return run


device_information = _call("get_device_information")
hosts = _call("get_hosts")
roofline = _call("get_roofline_model")
op_profile = _call("get_hlo_op_profile")
list_hlo_modules = _call("list_hlo_modules")
peak_allocations = _call("get_peak_allocations")


def kpi_metrics(ctx: Context, inputs: Mapping[str, Any]) -> Any:
    """xprof's own KPI tool, fed the overview, roofline and memory profile computed already.

    The tool calls those three tools again, and a result that was NO_DATA is not cached, so
    on a CPU profile it would convert the whole xplane once more for the memory profile
    (14 s of a 111 MB profile). Inside this worker, and only for this call, the three tools
    answer with what `inputs` holds ("error" entries raise, as the tools themselves would).
    """
    import json

    from xprof.cli.tools import get_memory_profile_tool, get_overview_tool, get_roofline_model_tool

    def answer(key: str) -> Any:
        def fn(*args: Any, **kwargs: Any) -> str:
            got = inputs.get(key) or {}
            if "data" not in got:
                raise NoData(str(got.get("error") or f"{key}: no data"))
            return json.dumps(got["data"])
        return fn

    patched = [(get_overview_tool, "get_overview", answer("overview")),
               (get_memory_profile_tool, "get_memory_profile", answer("memory_profile")),
               (get_roofline_model_tool, "get_roofline_model", answer("roofline"))]
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patched]
    try:
        for mod, name, fn in patched:
            setattr(mod, name, fn)
        return ctx.ws.call("get_kpi_metrics")
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)


def reduce_for_converters(ctx: Context, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Give xprof's converters a copy of each host without its Python-tracer events.

    Python-tracer events ("$file.py:line function") feed none of the collection tools, yet on
    a profile captured with the Python tracer they are most of the events, and xprof's
    converters spend time and memory on every event they read. The timeline pass reads the
    original events, Python's included, and decodes them again: keeping them in this worker
    for it held 0.4 GB through the smart suggestions' conversion, beside the op_stats build
    (the tree's peak), to save it 1-2 s that are off the critical path.
    """
    per_host = {}
    for xplane, host in zip(ctx.session.xplanes, ctx.session.hosts, strict=True):
        with XSpaceScan(xplane) as scan:
            per_host[host] = reduce_one(ctx.ws, scan, xplane)
            per_host[host].update(memory_copy(ctx.ws, scan, xplane))
    return per_host


def op_stats(ctx: Context, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The overview, which builds op_stats (and the HLO protos) that later jobs reuse.

    With `inputs["windows"]` (one large host cut in time windows by `split_windows`), the
    windows' op_stats (`op_stats_window`, built side by side in both workers) are combined
    and adopted instead, so no process builds the whole host's op_stats; with
    `inputs["host_op_stats"]` (a fanned-out session), the hosts' op_stats are."""
    _EXCLUSIVE["on"] = True
    try:
        parts = inputs.get("window_parts")
        if inputs.get("host_op_stats"):
            # A fanned-out session whose hosts built their own op_stats: combined as xprof
            # combines hosts; the run directory's traces are the hosts' memory copies.
            from mldiag.analysis.collection.hosts import op_stats_hosts
            from mldiag.analysis.collection.hosts import op_stats_shards as shards

            ctx.ws.adopt_op_stats(op_stats_hosts.combine_hosts(
                [shards.read(p) for p in inputs["host_op_stats"]]).SerializeToString())
            ctx.ws.ensure_hlo_protos()
            return dict(ctx.ws.call("get_overview"))
        if inputs.get("built"):
            # `op_stats_build` saved them in the run directory.
            return _overview_beside(ctx, (ctx.ws.run_dir / OP_STATS_FILE).read_bytes(),
                                    inputs.get("reduced") or {})
        if not parts:
            return ctx.ws.precompute_op_stats()
        from mldiag.analysis.collection.hosts import op_stats_shards as shards

        combined = shards.combine([shards.read(p) for p in parts],
                                  inputs.get("seams")).SerializeToString()
        ctx.ws.adopt_op_stats(combined)
        ctx.ws.ensure_hlo_protos()
        return _overview_beside(ctx, combined, inputs.get("reduced") or {})
    finally:
        _EXCLUSIVE["on"] = False


def op_stats_build(ctx: Context, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """xprof's op_stats of the session, saved in its run directory, and the HLO protos,
    without the overview's whole-trace work (the `op_stats` job reads the overview beside
    the memory copies): the converter that builds them does little more (the roofline)."""
    _EXCLUSIVE["on"] = True
    try:
        ctx.ws.build_op_stats()
        ctx.ws.ensure_hlo_protos()
    finally:
        _EXCLUSIVE["on"] = False
    return {"op_stats_bytes": (ctx.ws.run_dir / OP_STATS_FILE).stat().st_size}


OVERVIEW_DIR = "overview"


def _overview_dir(ctx: Context) -> Path | None:
    """The run directory `_overview_beside` prepared (adopted op_stats beside the memory
    copy), where the tools that read op_stats but would also load the trace run; None when
    the op_stats were built from the session's own traces."""
    run_dir = ctx.ws.side_run_dir_path(OVERVIEW_DIR)
    return run_dir if (run_dir / OP_STATS_FILE).is_file() else None


def _overview_beside(ctx: Context, op_stats: bytes, reduced: Mapping[str, Any]
                     ) -> dict[str, Any]:
    """The overview from adopted op_stats, in a run directory whose trace is the memory copy.

    With op_stats saved, xprof's overview still loads every XSpace, for inference statistics
    that its CLI tool does not output (`get_overview` prints the capture, the performance
    summary and the run environment, all from op_stats): 9 GB at 468 MB TPU-shaped; so does
    the step trace's input-pipeline source (8 GiB at 947 MB). The copy answers the same in
    the memory of its few events (the step trace's halves run there too, `_overview_dir`).
    Without a copy, the session's own run directory is used."""
    if not all("memory_copy_bytes" in (reduced.get(h) or {}) for h in ctx.session.hosts):
        return dict(ctx.ws.call("get_overview"))
    run_dir = ctx.ws.side_run_dir(OVERVIEW_DIR)
    for xplane in ctx.session.xplanes:
        link = run_dir / xplane.name
        link.unlink()
        link.symlink_to(ctx.ws.side_run_dir(MEMORY_DIR) / xplane.name)
    ctx.ws.adopt_op_stats(op_stats, run_dir=run_dir)
    return dict(ctx.ws.call("get_overview", run_dir=run_dir))


def _window_path(ctx: Context, k: int) -> Path:
    (xplane,) = ctx.session.xplanes
    return ctx.ws.side_run_dir(f"window{k}") / xplane.name


def split_windows(ctx: Context, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Cut one large host into `inputs["windows"]` time windows between module executions
    (`op_stats_shards`), each written to its own run directory, in one pass over the trace
    (the converters' input: the reduced copy where the reduction made one). With
    `inputs["keep"]`, only those windows are written (a task of the collect job converting
    its share of them); the cuts and the idle time between windows are every window's."""
    from mldiag.analysis.collection.hosts import op_stats_shards as shards

    (xplane,) = ctx.session.xplanes
    with XSpaceScan(ctx.ws.run_dir / xplane.name) as scan:
        cuts = shards.module_cuts(scan, int(inputs["windows"]))
        keep = inputs.get("keep")
        kept = [k for k in range(len(cuts) + 1) if keep is None or k in keep]
        paths = [_window_path(ctx, k) for k in kept]
        # Written beside the link to the trace, then put in its place: a window job that
        # finds the link (the cut not done here, its window taken over from another task of
        # the collect job) cuts its window alone, never reads a half-written one.
        cutting = [p.with_name(f"{p.name}.cutting") for p in paths]
        # The host's steps, for each window's timeline to be measured against, from the
        # host lines as the cut decodes them (another pass took 23 s at 2 GB).
        host = timeline.HostSpans(scan)
        # The host database's total over every window, from the same lines.
        activity = HostActivity(scan, cuts)

        def each_line(plane: Plane, line: Line) -> None:
            host.add(plane, line)
            activity.add(plane, line)

        extents = shards.write_windows(scan, cuts, cutting,
                                       keep=None if keep is None else kept, each_line=each_line)
        steps, excluded = host.host_steps()
        for tmp, path in zip(cutting, paths, strict=True):
            tmp.replace(path)
    return {"windows": len(cuts) + 1, "cuts": cuts,
            "steps": steps.tolist(), "excluded_steps": excluded,
            "seams": shards.seams(extents, activity),
            "window_bytes": {str(k): p.stat().st_size for k, p in zip(kept, paths, strict=True)}}


def op_stats_window(ctx: Context, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """xprof's op_stats of one time window (`split_windows`), saved in its run directory;
    the window's trace is deleted once converted. A window this worker's session did not cut
    (another task of the collect job did, and died before publishing it) is cut here first,
    alone, from `inputs["cuts"]`. With `inputs["timeline"]`, the window's share of our
    timeline pass comes first, from the same file (`timeline_from_windows` combines them)."""
    from mldiag.analysis.collection.hosts import op_stats_shards as shards

    k = int(inputs["window"])
    if k >= int(inputs["windows"]):
        raise NoData(f"window {k}: the trace had fewer gaps between module executions")
    path = _window_path(ctx, k)
    if path.is_symlink():  # still the whole trace: not cut in this session
        (xplane,) = ctx.session.xplanes
        alone = path.with_name(f"{path.name}.alone")
        with XSpaceScan(ctx.ws.run_dir / xplane.name) as scan:
            shards.write_windows(scan, [int(c) for c in inputs["cuts"]], [alone], keep=[k])
        alone.replace(path)
    parts: dict[str, Any] = {}
    if inputs.get("timeline"):
        steps = (np.asarray(inputs["steps"], dtype=np.float64).reshape(-1, 2),
                 list(inputs["excluded_steps"]))
        with XSpaceScan(path) as scan:
            parts["timeline"] = timeline.analyze_scan(scan, ctx.session.hosts[0],
                                                      steps=steps).to_json()
    _EXCLUSIVE["on"] = True
    try:
        ctx.ws.call("get_overview", run_dir=path.parent)
    finally:
        _EXCLUSIVE["on"] = False
    path.unlink()
    saved = path.parent / OP_STATS_FILE
    return {"window": k, "op_stats": str(saved), "bytes": saved.stat().st_size, **parts}


def timeline_from_windows(ctx: Context, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Our timeline pass of one large host from its time windows' shares (`op_stats_window`),
    combined: what `timeline_pass` answers on the whole file, without holding the whole
    host's device events (the windows are cut between module executions, so every figure
    adds up exactly). The async-overlap follow-up comes from its own pass over the whole
    host (`async_overlap_pass`): its copies are paired first-in first-out over the whole
    trace, and a copy in flight across a cut would pair differently in a window."""
    parts = [p for p in inputs["parts"] if p.get("timeline") is not None]
    if not parts:
        raise NoData("no time window was measured")
    summary = timeline.summarize([timeline.combine_windows(
        [timeline.HostTimeline.from_json(p["timeline"]) for p in parts])])
    overlap = inputs.get("async_overlap")
    if overlap:
        summary["precomputed"] = {"analyze_async_overlap": combine_async_overlap(
            [(overlap["label"], overlap["part"])])}
    return summary


def async_overlap_pass(ctx: Context, inputs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The async-overlap follow-up's share of one large host (`async_overlap_part`), in a
    pass of its own, one device plane at a time; None without XLA op lines."""
    from xprof.cli.internal.trace_selection import trace_labels

    ((xplane, label),) = zip(ctx.session.xplanes, trace_labels(ctx.session.xplanes),
                             strict=True)
    with XSpaceScan(xplane) as scan:
        part = async_overlap_part(scan)
    return None if part is None else {"label": label, "part": part}


def step_trace_pods(ctx: Context, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """xprof's step trace from the pod viewer alone (see `_step_trace_half`)."""
    return _step_trace_half(ctx, pods=True)


def xprof_step_trace(ctx: Context, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """xprof's step trace from its other sources: the input-pipeline analysis, then the
    overview (see `_step_trace_half`)."""
    return _step_trace_half(ctx, pods=False)


_POD_SOURCES = frozenset({"pod_viewer.json", "pod_viewer"})


def _step_trace_half(ctx: Context, *, pods: bool) -> dict[str, Any]:
    """Half of xprof's `get_step_trace`, which takes its steps from the first source that has
    any: the pod viewer, then the input-pipeline analysis, then the overview.

    Each source costs a conversion and a Python pass over every step (3 s each on 46,000
    steps, and on CPU and GPU profiles the pod viewer's pass finds no step), so the two halves
    run side by side, in the two workers, and `pick_step_trace` chooses as xprof does. Each
    half is xprof's own tool with the other half's sources answering nothing. The halves run
    in different workers, whose result caches are their own: the two calls have one cache key.
    """
    from xprof.cli.tools import get_step_trace_tool as gst

    fetch = gst._fetch_first_available

    def this_half(client: Any, session_id: str, tool_names: Any, bypass_cache: bool = False
                  ) -> Any:
        if (set(tool_names) <= _POD_SOURCES) != pods:
            return None
        return fetch(client, session_id, tool_names, bypass_cache)

    gst._fetch_first_available = this_half
    try:
        command = _xprof("get_step_trace")
        data: dict[str, Any] = ctx.ws.call(command.name, **command.kwargs,
                                           run_dir=_overview_dir(ctx))
    except NoData as e:
        data = {"status": "NO_DATA", "message": str(e)}
    finally:
        gst._fetch_first_available = fetch
    return data


def pick_step_trace(pods: Any, rest: Any) -> Any:
    """xprof's step trace from its two halves: the pod viewer's when it found steps."""
    return pods if isinstance(pods, Mapping) and pods.get("step_breakdown") else rest


def smart_suggestions(ctx: Context, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """xprof's smart suggestions: op_stats, a memory profile and the step share of a few
    events (`SMART_EVENTS`), from its own run directory (xprof clears a run directory's
    saved results before a fresh conversion).

    On large sessions (`inputs["after_op_stats"]`) it runs after the op_stats job and reads
    them from the saved file, and reads the memory copies (`hosts.copies.memory_copy`, which
    keep those events and the step markers) for the rest; 5.3 s CPU becomes 0.3 s on 94 MB
    TPU-shaped, and its memory no longer follows the trace's size. On small
    ones it runs beside the build and combines its own op_stats in memory (the same answer).
    """
    run_dir = ctx.ws.side_run_dir("smart")
    reduced = inputs.get("reduced") or {}
    saved = ctx.ws.run_dir / OP_STATS_FILE
    if inputs.get("after_op_stats") and saved.is_file():
        memory_dir = ctx.ws.side_run_dir(MEMORY_DIR)
        for xplane, host in zip(ctx.session.xplanes, ctx.session.hosts, strict=True):
            part = reduced.get(host) or {}
            if "memory_copy_bytes" in part:
                link = run_dir / xplane.name
                link.unlink()
                link.symlink_to(memory_dir / xplane.name)
        # The session's op_stats, as xprof would reuse its own (never the copies' own).
        ctx.ws.adopt_op_stats(saved.read_bytes(), run_dir=run_dir)
    return ctx.ws.fetch_tool_data("smart_suggestion", run_dir=run_dir)


def hlo_texts(ctx: Context, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The HLO text of every module, and each instruction's source (`file.py:LINE (op)`)
    from the HLO protos xprof wrote, which the printed text omits."""
    texts = {}
    for module in inputs.get("modules", []):
        out = ctx.ws.call("get_hlo_text", module_name=module, max_lines=10_000_000)
        content = out.get("content")
        if isinstance(content, str) and content:
            texts[module] = content
    from mldiag.analysis.collection.hlo.meta import module_sources

    return {"texts": texts, "sources": module_sources(ctx.ws.run_dir)}


def timeline_pass(ctx: Context, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Our timeline pass, and the follow-ups it can answer from the lines it has decoded:
    they travel under "precomputed" (tool → {args, data, how}; `collect` moves them to the
    snapshot's `precomputed_follow_ups`)."""
    from xprof.cli.internal.trace_selection import trace_labels

    from mldiag.analysis.collection.hosts.pod import cross_host

    hosts = []
    python_events = None
    functions: dict[str, list[dict[str, Any]]] = {}
    overlaps: list[tuple[str, dict[str, Any]]] = []
    single = len(ctx.session.xplanes) == 1
    labels = trace_labels(ctx.session.xplanes)
    for xplane, host, label in zip(ctx.session.xplanes, ctx.session.hosts, labels, strict=True):
        with XSpaceScan(xplane) as scan:
            hosts.append(timeline.analyze_scan(scan, host))
            # One host's frames answer the host-bound follow-up; in a pod, each host's own
            # name the straggler's slow function (not the hosts' average).
            events = host_python_events(scan)
            if single:
                python_events = events
            elif events is not None:
                functions[host] = events["data"]["aggregates"]
            overlap = async_overlap_part(scan)
            if overlap is not None:
                overlaps.append((label, overlap))
    summary = timeline.summarize(hosts)
    pod = cross_host(hosts, functions)
    if pod is not None:
        summary["pod"] = pod
    precomputed = {}
    if python_events is not None:
        summary["host_instrumentation"] = python_events.pop("instrumentation")
        precomputed["aggregate_xplane_events"] = python_events
    if overlaps:
        precomputed["analyze_async_overlap"] = combine_async_overlap(overlaps)
    if precomputed:
        summary["precomputed"] = precomputed
    return summary


def async_overlap_part(scan: XSpaceScan) -> dict[str, Any] | None:
    """One host's share of the async-overlap follow-up (`async_overlap.host_partial`), from
    the device lines the timeline pass decoded; None when the trace has no XLA op lines (a
    CPU trace), where the investigator never asks for it."""
    from mldiag.analysis.collection.xspace import async_overlap

    if not async_overlap.has_async_lines(scan):
        return None
    return async_overlap.host_partial(scan, **ASYNC_OVERLAP)


def combine_async_overlap(parts: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The precomputed async-overlap follow-up from each host's label and share."""
    from mldiag.analysis.collection.xspace import async_overlap

    return {"args": dict(ASYNC_OVERLAP),
            "data": async_overlap.combine(parts, **ASYNC_OVERLAP),
            "how": "computed by the timeline pass from the device lines it had decoded "
                   "(xprof's analysis, column-wise)"}


# Rows of the precomputed host-bound follow-up kept in the snapshot (by total time).
_PYTHON_EVENT_ROWS = 100


def host_python_events(scan: XSpaceScan) -> dict[str, Any] | None:
    """The host-bound follow-up (`aggregate_xplane_events` of the Python-tracer frames),
    from the lines the timeline pass has decoded; None without Python-tracer events."""
    from mldiag.analysis.collection.xspace.event_aggregates import aggregate_scans
    from mldiag.analysis.collection.xspace.instrumentation import HostInstrumentation

    if not any(plane.name == "/host:CPU" and any(
            n.startswith("$") for n in plane.event_names.values()) for plane in scan.planes):
        return None
    measuring = HostInstrumentation()
    data = aggregate_scans([scan], **HOST_PYTHON_EVENTS, on_line=measuring.add)
    rows = data["aggregates"]
    data["truncated"] = len(rows) > _PYTHON_EVENT_ROWS
    data["aggregates"] = rows[:_PYTHON_EVENT_ROWS]
    data["returned"] = len(data["aggregates"])
    return {"args": dict(HOST_PYTHON_EVENTS), "data": data,
            "how": "computed by the timeline pass from the events it had decoded",
            # Which of those frames are instrumentation (never the host work to remove),
            # mldiag's: the timeline pass keeps it (`host_instrumentation`).
            "instrumentation": measuring.result(r["event"] for r in data["aggregates"])}


def memory_profile(ctx: Context, inputs: Mapping[str, Any]) -> dict[str, Any]:
    # xprof's memory profile reads exactly one host: take each host's and report the host
    # closest to running out of memory, with every host's peak beside it.
    session = ctx.session
    reduced = inputs.get("reduced") or {}
    per_host: dict[str, dict[str, Any] | None] = {}
    for xplane, host in zip(session.xplanes, session.hosts, strict=True):
        if not has_memory_events(xplane):
            per_host[host] = None
            continue
        only = host if len(session.hosts) > 1 else None
        # The host's memory copy, where the collection made one (`hosts.copies.memory_copy`).
        copy = "memory_copy_bytes" in (reduced.get(host) or {})
        src = (ctx.ws.side_run_dir(MEMORY_DIR) if copy else ctx.ws.run_dir) / xplane.name
        per_host[host] = peaks_memory_profile(ctx.ws, src, only)
    return combine_memory_profiles(per_host)


def has_memory_events(xplane: Path) -> bool:
    """Whether a host plane names the allocator events xprof's memory profile is built from.

    Without them the converter reads the whole file to report -1 for every figure (10 s for
    a 111 MB CPU profile); the plane headers answer in milliseconds.
    """
    with XSpaceScan(xplane) as scan:
        return any(name in MEMORY_EVENTS for plane in scan.planes
                   if plane.name.startswith("/host:") for name in plane.event_names.values())


def combine_memory_profiles(per_host: Mapping[str, dict[str, Any] | None]) -> dict[str, Any]:
    """One memory-profile result from each host's: the host closest to running out."""
    hosts = sorted(per_host)
    measured = {h: d for h, d in per_host.items()
                # xprof reports -1.0 for every figure when there are no memory events.
                if d is not None and float(d.get("peak_memory_usage_gib", -1.0)) >= 0}
    per_host = measured
    if not per_host:
        raise NoData("no memory allocation events in the profile (the CPU runtime does not "
                     "record them)")
    worst = max(per_host, key=lambda h: _usage_ratio(measured[h]))
    result = dict(measured[worst])
    if len(hosts) > 1:
        result["host"] = worst
        result["per_host_peak_gib"] = {
            h: d.get("peak_memory_usage_gib") for h, d in sorted(measured.items())}
    return result


# xprof's answer when a trace has no hardware performance counters.
NO_COUNTERS = "No hardware performance counter events found in trace"


# The stat that carries a hardware performance counter's value on a TPU plane's events (or
# their metadata): xprof's utilization viewer builds its rows from nothing else.
COUNTER_VALUE_STAT = "counter_value"


def has_python_events(xplane: Path) -> bool:
    """Whether a host plane names Python-tracer events (the reduction drops them), from
    the plane headers."""
    with XSpaceScan(xplane) as scan:
        return any(plane.name.startswith("/host:") and any(
            n.startswith("$") for n in plane.event_names.values()) for plane in scan.planes)


def has_counters(xplane: Path) -> bool:
    """Whether a TPU device plane can hold hardware performance counters: it names the
    `counter_value` stat, without which xprof's utilization viewer has no row to show.

    Elsewhere its converter reads every event of every TPU plane to answer NO_DATA (67 s at
    514 MB of a CPU trace; 4-6 s CPU at 94 MB of a TPU trace captured without counters); the
    plane headers answer in milliseconds.
    """
    with XSpaceScan(xplane) as scan:
        return any(plane.name.startswith("/device:TPU")
                   and COUNTER_VALUE_STAT in plane.stat_names.values() for plane in scan.planes)


def utilization_viewer(ctx: Context, inputs: Mapping[str, Any]) -> dict[str, Any]:
    if not any(has_counters(x) for x in ctx.session.xplanes):
        raise NoData(NO_COUNTERS)
    hosts_ = ctx.session.hosts
    if len(hosts_) == 1:
        return ctx.ws.call("get_utilization_viewer")
    reasons = []
    for host in hosts_:
        try:
            return {**ctx.ws.call("get_utilization_viewer", only_host=host), "host": host}
        except NoData as e:
            reasons.append(f"{host}: {e}")
    raise NoData("; ".join(reasons))


def _usage_ratio(memory_profile: Mapping[str, Any]) -> float:
    peak = float(memory_profile.get("peak_memory_usage_gib") or 0.0)
    # The capacity of the allocator that holds the peak (`memory_allocators`), where the
    # converter gave it: the CLI's own `memory_capacity_gib` is the largest allocator's.
    own = ((memory_profile.get(memory_allocators.KEY) or {}).get("peak") or {}).get(
        "memory_capacity_gib")
    capacity = float(own or memory_profile.get("memory_capacity_gib") or 0.0)
    return peak / capacity if capacity > 0 else peak
