"""Collection: the 15 tools of the health snapshot, run in parallel in-process.

op_stats are computed once (by the overview tool) before the parallel phase, inside a private
xprof workspace, so the step set and every metric are the same each time a profile is analysed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mldiag
from mldiag.analysis import detectors, timeline
from mldiag.analysis.profile_input import (
    DEFAULT_MAX_HOST_BYTES,
    ProfileSession,
    resolve_session,
    validate_xplane,
)
from mldiag.analysis.xprof_tools import NoData, XprofWorkspace, xprof_installed_version

SCHEMA_VERSION = "1.0"
DEFAULT_TOOL_TIMEOUT_S = 300.0

COLLECTION_TOOLS: tuple[str, ...] = (
    "get_xprof_overview",
    "get_step_trace",
    "get_kpi_metrics",
    "get_device_information",
    "get_hosts",
    "get_utilization_viewer",
    "get_smart_suggestions",
    "get_roofline_model",
    "get_hlo_op_profile",
    "detect_layout_mismatch_copies",
    "detect_unfused_reshapes",
    "detect_unnecessary_convert_reduce",
    "list_hlo_modules",
    "get_memory_profile",
    "get_peak_allocations",
)

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


class _Once:
    """A value computed at most once, on first use, shared by the tool threads."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._fn = fn
        self._lock = threading.Lock()
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def get(self) -> Any:
        with self._lock:
            if not self._done:
                try:
                    self._value = self._fn()
                except BaseException as e:  # re-raised to every caller below
                    self._error = e
                self._done = True
        if self._error is not None:
            raise self._error
        return self._value


class _Collector:
    """The tool implementations of one collection, sharing lazily computed inputs."""

    def __init__(self, ws: XprofWorkspace) -> None:
        self.ws = ws
        self.timeline = _Once(
            lambda: timeline.analyze([(p, h) for p, h in zip(
                ws.session.xplanes, ws.session.hosts, strict=True)])
        )
        self.modules = _Once(self._module_names)
        self.hlo = _Once(self._hlo_texts)
        self.op_profile = _Once(lambda: ws.call("get_hlo_op_profile", top_n=50))

    def _module_names(self) -> list[str]:
        return list(self.ws.call("list_hlo_modules").get("modules", []))

    def _hlo_texts(self) -> dict[str, str]:
        texts = {}
        for module in self.modules.get():
            out = self.ws.call("get_hlo_text", module_name=module, max_lines=10_000_000)
            content = out.get("content")
            if isinstance(content, str) and content:
                texts[module] = content
        return texts

    def implementations(self) -> dict[str, Callable[[], dict[str, Any]]]:
        ws = self.ws
        return {
            "get_step_trace": self.step_trace,
            "get_kpi_metrics": lambda: ws.call("get_kpi_metrics"),
            "get_device_information": lambda: ws.call("get_device_information"),
            "get_hosts": lambda: ws.call("get_hosts"),
            "get_utilization_viewer": self.utilization_viewer,
            "get_smart_suggestions": lambda: ws.fetch_tool_data("smart_suggestion"),
            "get_roofline_model": lambda: ws.call("get_roofline_model", top_n=15),
            "get_hlo_op_profile": self.op_profile.get,
            "detect_layout_mismatch_copies": lambda: self.detect(
                detectors.detect_layout_mismatch_copies
            ),
            "detect_unfused_reshapes": lambda: self.detect(detectors.detect_unfused_reshapes),
            "detect_unnecessary_convert_reduce": lambda: self.detect(
                detectors.detect_unnecessary_convert_reduce
            ),
            "list_hlo_modules": lambda: ws.call("list_hlo_modules"),
            "get_memory_profile": self.memory_profile,
            "get_peak_allocations": lambda: ws.call("get_peak_allocations", limit=10),
        }

    def step_trace(self) -> dict[str, Any]:
        try:
            data = self.ws.call("get_step_trace", limit=50)
        except NoData as e:
            data = {"status": "NO_DATA", "message": str(e)}
        analysis = self.timeline.get()
        data["host_bound_analysis"] = analysis
        if data.get("status") == "NO_DATA" and not analysis.get("steps_analyzed"):
            raise NoData(str(data.get("message", "no steps")))
        return data

    def memory_profile(self) -> dict[str, Any]:
        # xprof's memory profile reads exactly one host: take each host's and report the
        # host closest to running out of memory, with every host's peak beside it.
        per_host: dict[str, dict[str, Any]] = {}
        for host in self.ws.session.hosts:
            only = host if len(self.ws.session.hosts) > 1 else None
            data = self.ws.call("get_memory_profile", only_host=only)
            # xprof reports -1.0 for every figure when there are no memory activity events.
            if float(data.get("peak_memory_usage_gib", -1.0)) >= 0:
                per_host[host] = data
        if not per_host:
            raise NoData("no memory allocation events in the profile (the CPU runtime does not "
                         "record them)")
        worst = max(per_host, key=lambda h: _usage_ratio(per_host[h]))
        result = dict(per_host[worst])
        if len(self.ws.session.hosts) > 1:
            result["host"] = worst
            result["per_host_peak_gib"] = {
                h: d.get("peak_memory_usage_gib") for h, d in sorted(per_host.items())}
        return result

    def utilization_viewer(self) -> dict[str, Any]:
        hosts = self.ws.session.hosts
        if len(hosts) == 1:
            return self.ws.call("get_utilization_viewer")
        reasons = []
        for host in hosts:
            try:
                return {**self.ws.call("get_utilization_viewer", only_host=host), "host": host}
            except NoData as e:
                reasons.append(f"{host}: {e}")
        raise NoData("; ".join(reasons))

    def detect(self, detector: Callable[[Mapping[str, str]], list[Any]]) -> dict[str, Any]:
        texts = self.hlo.get()
        if not texts:
            raise NoData("no HLO modules in the profile")
        found = [d.to_dict() for d in detector(texts)]
        times, step_ms, time_source = self._op_times()
        for d in found:
            ms = times.get((d["module"], d["instruction"]))
            if ms is None:
                ms = times.get(("", d["instruction"]))
            d["time_ms"] = round(ms, 4) if ms is not None else None
            d["percent_of_step"] = (
                round(100.0 * ms / step_ms, 2) if ms is not None and step_ms else None
            )
            d["time_source"] = time_source if ms is not None else "not found on the timeline"
            # With op times available, an instruction absent from them never ran while the
            # profiler was on (e.g. a module compiled and run before the trace started).
            d["executed_in_profile"] = ms is not None if times else None
        found.sort(key=lambda d: (-(d["time_ms"] or 0.0), d["module"], d["instruction"]))
        return {
            "detections": found,
            "modules_scanned": len(texts),
            "reference_time_ms": round(step_ms, 4) if step_ms else None,
            "time_source": time_source,
        }

    def _op_times(self) -> tuple[dict[tuple[str, str], float], float | None, str]:
        """Per-step time of each executed instruction, and the step time to divide by."""
        try:
            prof = self.op_profile.get()
        except NoData:
            prof = None
        if prof and prof.get("grouped_operations"):
            times: dict[tuple[str, str], float] = {}
            total = float(prof.get("total_profile_time_ms") or 0.0)
            for ops in prof["grouped_operations"].values():
                for op in ops:
                    parts = str(op.get("name", "")).split("/")
                    if len(parts) >= 4 and parts[0] == "by_program":
                        module, inst = parts[1], parts[-1]
                        ms = float(op.get("total_self_time_ms", 0.0))
                        # Totals over the whole profile, divided by the profile's total time
                        # below: a share of device time, which equals the share of a step.
                        times[(module, inst)] = ms
            return times, total or None, "get_hlo_op_profile self time, total over the profile"
        tl = self.timeline.get()
        step_ms = tl.get("step_time_ms_average")
        module_by_program = {_program_of(m): m for m in self.modules.get()}
        times = {}
        for program, ops in (tl.get("op_time_ms_by_program") or {}).items():
            module = module_by_program.get(program, "")
            for op, ms in ops.items():
                times[(module, op)] = float(ms)
                if not program:
                    times[("", op)] = float(ms)
        return times, step_ms, "timeline events on XLA execution lines, ms per step"


def _warm(value: _Once) -> None:
    # Errors surface to the tools that use the value; here they only must not escape.
    try:
        value.get()
    except Exception:  # noqa: BLE001 - re-raised to every consumer by _Once.get
        return


def _usage_ratio(memory_profile: Mapping[str, Any]) -> float:
    peak = float(memory_profile.get("peak_memory_usage_gib") or 0.0)
    capacity = float(memory_profile.get("memory_capacity_gib") or 0.0)
    return peak / capacity if capacity > 0 else peak


def _program_of(module: str) -> str:
    # xprof names modules "<name>(<program_id>)", e.g. "jit_step(16)".
    if module.endswith(")") and "(" in module:
        return module[module.rindex("(") + 1 : -1]
    return ""


def collect(
    session_path: str | os.PathLike[str] | ProfileSession,
    *,
    progress: ProgressFn | None = None,
    tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
    max_host_bytes: int = DEFAULT_MAX_HOST_BYTES,
    prepare_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
) -> dict[str, Any]:
    """Run the 15 collection tools on a session and return the health snapshot.

    `session_path` is a logdir, a run or session directory, or one `.xplane.pb`. Each tool
    gets `tool_timeout_s` (past it, the tool is recorded as ERROR); the op_stats build that
    all tools share gets `prepare_timeout_s`, past which TimeoutError (transient) is raised.
    Raises ProfileUnreadable (one-line reason) when the input cannot be analysed.
    """
    session = (
        session_path if isinstance(session_path, ProfileSession)
        else resolve_session(session_path)
    )
    for xplane in session.xplanes:
        validate_xplane(xplane, max_bytes=max_host_bytes)
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    total = len(COLLECTION_TOOLS)

    def done(result: dict[str, Any]) -> None:
        results[result["name"]] = result
        if progress is not None:
            progress(result["name"], result, len(results), total)

    ws = XprofWorkspace(session)
    ws.__enter__()
    pool = ThreadPoolExecutor(max_workers=total, thread_name_prefix="mldiag-tool")
    pending: dict[Future[dict[str, Any]], str] = {}
    try:
        collector = _Collector(ws)
        # The timeline pass reads the xplanes itself, not xprof's shared state: start it now,
        # beside the op_stats build, since it is the longest single piece of work.
        pool.submit(_warm, collector.timeline)
        overview = pool.submit(tool_result, "get_xprof_overview", ws.precompute_op_stats)
        pending[overview] = "get_xprof_overview"
        # Every other tool reads the op_stats it builds: wait for it, but not forever.
        wait([overview], timeout=prepare_timeout_s)
        if not overview.done():
            raise TimeoutError(f"xprof's op_stats build (get_xprof_overview) exceeded "
                               f"{prepare_timeout_s:g} s; retry later")
        del pending[overview]
        done(overview.result())
        for name, fn in collector.implementations().items():
            pending[pool.submit(tool_result, name, fn)] = name
        deadline = time.monotonic() + tool_timeout_s
        while pending:
            finished, _ = wait(
                pending, timeout=max(0.0, deadline - time.monotonic()),
                return_when=FIRST_COMPLETED,
            )
            if not finished:
                break
            for fut in finished:
                pending.pop(fut)
                done(fut.result())
        for fut, name in pending.items():
            fut.cancel()
            done({"name": name, "status": ERROR, "elapsed_ms": round(tool_timeout_s * 1000.0, 1),
                  "error": f"timed out after {tool_timeout_s:g} s"})
    finally:
        if pending:
            # A timed-out tool thread still uses the workspace: release it when that thread ends.
            remaining = list(pending)

            def _release(_: Future[dict[str, Any]]) -> None:
                if all(f.done() for f in remaining):
                    ws.close()

            for fut in remaining:
                fut.add_done_callback(_release)
            pool.shutdown(wait=False, cancel_futures=True)
        else:
            pool.shutdown(wait=True)
            ws.close()

    overview = results["get_xprof_overview"].get("data", {})
    env = overview.get("run_environment", {}) if isinstance(overview, dict) else {}
    return {
        "schema_version": SCHEMA_VERSION,
        "session": {**session.describe(), "device_type": env.get("device_type")},
        "xprof_version": xprof_installed_version(),
        "mldiag_version": mldiag.__version__,
        "collected_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "elapsed_ms": round((time.perf_counter() - started) * 1000.0, 1),
        "tools": {name: results[name] for name in COLLECTION_TOOLS},
    }


def write_json(obj: Mapping[str, Any], path: Path) -> None:
    """Write `obj` as pretty JSON, atomically (readers never see half a file)."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    tmp.replace(path)
