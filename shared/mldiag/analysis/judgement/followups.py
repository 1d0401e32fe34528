"""Follow-up tools an investigator may call after triage, at most MAX_FOLLOW_UPS per analysis.

Each call runs in a worker process (`workers.py`) with a deadline, like the collection jobs:
a follow-up that runs away is stopped and recorded as ERROR with the reason, and the
investigation goes on. `llo_load`/`llo_query` are ours: they load the trace's events into
xprof's DuckDB events store and answer `LLO_DATA_ABSENT` when the capture has no LLO lines
(any non-TPU trace). `aggregate_xplane_events` is xprof's, computed column-wise.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The follow-ups the timeline pass answers ahead (HOST_PYTHON_EVENTS, ASYNC_OVERLAP): the
# collection's leaf holds their arguments, which both sides use.
from mldiag.analysis.collection.passes import ASYNC_OVERLAP as ASYNC_OVERLAP
from mldiag.analysis.collection.passes import HOST_PYTHON_EVENTS as HOST_PYTHON_EVENTS
from mldiag.analysis.collection.profile_input import ProfileSession
from mldiag.analysis.collection.xprof_tools import NoData, XprofWorkspace
from mldiag.analysis.judgement.evidence import KERNEL_TABLE
from mldiag.errors import MldiagError

if TYPE_CHECKING:
    # The worker's context, for its type only: the jobs module loads numpy and the timeline
    # pass, which only the worker that runs a follow-up needs.
    from mldiag.analysis.collection.jobs import Context

MAX_FOLLOW_UPS = 4
DEFAULT_FOLLOW_UP_TIMEOUT_S = 120.0
FOLLOW_UP_TOOLS = (
    "get_hlo_neighborhood",
    "aggregate_xplane_events",
    "get_kernel_stats",
    "get_hosts",
    "analyze_async_overlap",
    "llo_load",
    "llo_query",
)
LLO_DATA_ABSENT = "LLO_DATA_ABSENT"
# Follow-ups whose output is mldiag's own table rather than what `xprof <tool>` prints: the
# record says so (`pass`), and evidence cites it under that pass name.
FOLLOW_UP_PASSES = {"get_kernel_stats": KERNEL_TABLE}
# What a TPU capture needs for LLO detail (xprof's collect_profile reference).
LLO_RECAPTURE = 'LIBTPU_INIT_ARGS="--xla_xprof_register_llo_debug_info=true"'


class FollowUpRefused(MldiagError):
    """The call is not an allowed follow-up, or the budget of calls is spent.

    Permanent for this investigation: the investigator stops asking and writes its findings."""


class FollowUps:
    """Runs follow-up tools on one session, recording each call for investigation.json."""

    def __init__(self, session: ProfileSession, max_calls: int = MAX_FOLLOW_UPS, *,
                 timeout_s: float = DEFAULT_FOLLOW_UP_TIMEOUT_S,
                 memory_budget_bytes: int | None = None,
                 precomputed: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """`precomputed`: {tool: {"args": ..., "data": ...}} results collection already has;
        a call with exactly those arguments is answered from it (and still counts)."""
        self.session = session
        self.precomputed = dict(precomputed or {})
        self.max_calls = max_calls
        self.timeout_s = timeout_s
        self.memory_budget_bytes = memory_budget_bytes
        self.records: list[dict[str, Any]] = []
        self._root: Path | None = None
        self._llo_db: str | None = None

    def __enter__(self) -> FollowUps:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    @property
    def remaining(self) -> int:
        return self.max_calls - len(self.records)

    def call(self, tool: str, purpose: str, **args: Any) -> dict[str, Any]:
        """Run one follow-up; returns `{tool, args, purpose, status, elapsed_ms, data|error}`."""
        if tool not in FOLLOW_UP_TOOLS:
            raise FollowUpRefused(f"{tool} is not a follow-up tool ({', '.join(FOLLOW_UP_TOOLS)})")
        if self.remaining <= 0:
            raise FollowUpRefused(f"follow-up budget of {self.max_calls} calls is spent")
        known = self.precomputed.get(tool)
        if known is not None and known.get("args") == args and known.get("data") is not None:
            record = {"tool": tool, "args": args, "purpose": purpose, "status": "DATA",
                      "elapsed_ms": 0.0, "data": known["data"],
                      "precomputed": str(known.get("how") or "during collection")}
            self.records.append(record)
            return record
        from mldiag.analysis.collection.workers import (
            DATA,
            Job,
            default_budget_bytes,
            reason_of,
            run_jobs,
        )

        if self._root is None:
            self._root = XprofWorkspace.create_root(self.session)
        job = Job(name=tool, group="follow-ups",
                  runner="mldiag.analysis.judgement.followups:run_in_worker",
                  timeout_s=self.timeout_s)
        outcome = run_jobs(
            [job], setup="mldiag.analysis.collection.jobs:attach",
            setup_args={"root": str(self._root), "session": self.session},
            budget_bytes=self.memory_budget_bytes or default_budget_bytes(),
            default_timeout_s=self.timeout_s,
            inputs_for=lambda j, o: {"tool": tool, "args": args, "llo_db": self._llo_db},
        )[tool]
        result: dict[str, Any] = {"status": outcome.status, "elapsed_ms": outcome.elapsed_ms}
        if outcome.status == DATA or outcome.status == "NO_DATA":
            result["data"] = outcome.value
        else:
            result["error"] = reason_of(outcome)
        if tool == "llo_load" and outcome.status == DATA and isinstance(outcome.value, dict):
            self._llo_db = str(outcome.value.get("path") or "") or None
        record = {"tool": tool, "args": args, "purpose": purpose, **result}
        if tool in FOLLOW_UP_PASSES:
            record["pass"] = FOLLOW_UP_PASSES[tool]
        self.records.append(record)
        return record


def run_in_worker(ctx: Context, inputs: Mapping[str, Any]) -> Any:
    """One follow-up call, as the job that `FollowUps.call` runs in a collection worker (set
    up by `jobs.attach`, which gives it the session's workspace)."""
    runner = FollowUpRunner(ctx.ws, ctx.session, llo_db=inputs.get("llo_db"))
    return runner.run(str(inputs["tool"]), dict(inputs.get("args") or {}))


class FollowUpRunner:
    """The follow-up implementations, as they run inside a worker (`run_in_worker`)."""

    def __init__(self, ws: XprofWorkspace, session: ProfileSession,
                 llo_db: str | None = None) -> None:
        self.ws = ws
        self.session = session
        self._llo_db = llo_db

    def _workspace(self) -> XprofWorkspace:
        return self.ws

    def run(self, tool: str, args: dict[str, Any]) -> Any:
        ours: dict[str, Callable[..., Any]] = {
            "aggregate_xplane_events": self._aggregate_events,
            "get_kernel_stats": self._kernel_stats,
            "llo_load": self._llo_load,
            "llo_query": self._llo_query,
        }
        impl = ours.get(tool)
        if impl is not None:
            return impl(**args)
        # xprof's HLO tools write the HLO protos from the whole trace when there are none.
        self.ws.ensure_hlo_protos()
        # Text-mode tools echo their trace selection to stderr; keep the terminal clean.
        with contextlib.redirect_stderr(io.StringIO()):
            return self.ws.call(tool, **args)

    def _aggregate_events(self, plane_regex: str = ".*", event_regex: str = ".*",
                          min_duration_ps: int | None = None,
                          max_duration_ps: int | None = None,
                          start_time_ps: int | None = None, end_time_ps: int | None = None,
                          **other: Any) -> dict[str, Any]:
        """xprof's aggregate_xplane_events (same arguments and output), column-wise.

        xprof's builds a record per event and stops after 5 M events; a Python-traced
        profile of 100 MB has 4 M, which took it 70 s. Options this does not implement
        (`filter`, `group_by` other than event, overlap windows) go to xprof's own.
        """
        if other and any(v not in (None, "", "event", "containment") for v in other.values()):
            return self._workspace().call("aggregate_xplane_events", plane_regex=plane_regex,
                                          event_regex=event_regex,
                                          min_duration_ps=min_duration_ps,
                                          max_duration_ps=max_duration_ps,
                                          start_time_ps=start_time_ps,
                                          end_time_ps=end_time_ps, **other)
        from mldiag.analysis.collection.xspace.event_aggregates import aggregate_events

        return aggregate_events(self.session.xplanes, plane_regex, event_regex,
                                min_duration_ps=min_duration_ps,
                                max_duration_ps=max_duration_ps,
                                start_time_ps=start_time_ps, end_time_ps=end_time_ps)

    def _kernel_stats(self, limit: int = 10) -> dict[str, Any]:
        # xprof's CLI get_kernel_stats attributes time per timeline line on non-TPU traces;
        # the kernel_stats converter has the real per-kernel table (occupancy, TensorCore use).
        ws = self._workspace()
        # kernel_stats reads op_stats: build them the way the snapshot did, so steps agree.
        ws.precompute_op_stats()
        table = ws.fetch_tool_data("kernel_stats")
        cols = [c.get("id") for c in table.get("cols", [])]
        rows = [
            {col: cell.get("v") if isinstance(cell, dict) else None
             for col, cell in zip(cols, row.get("c", []), strict=False)}
            for row in table.get("rows", [])
        ]
        if not rows:
            raise NoData("no GPU kernels in the profile")
        rows.sort(key=lambda r: -(r.get("total_duration_us") or 0.0))
        total_us = sum(float(r.get("total_duration_us") or 0.0) for r in rows)
        for r in rows:
            us = float(r.get("total_duration_us") or 0.0)
            r["percent_of_kernel_time"] = round(100.0 * us / total_us, 2) if total_us else None
        return {
            "kernel_count": len(rows),
            "total_kernel_time_us": round(total_us, 3),
            "kernels": rows[:limit],
        }

    def _llo_capture_check(self) -> None:
        # xprof's inspect_capture answers the same question but visits every event; line names
        # are enough (xprof's own list of the lines that carry LLO detail).
        from xprof.cli.internal.oss.xplane_tools import _LLO_LINE_NAMES

        from mldiag.analysis.collection.xspace.scan import XSpaceScan

        planes: list[str] = []
        for xplane in self.session.xplanes:
            with XSpaceScan(xplane) as scan:
                for plane in scan.planes:
                    planes.append(plane.name)
                    if any(line.name in _LLO_LINE_NAMES for line in plane.lines):
                        return
        tpu = any(p.startswith("/device:TPU") for p in planes)
        how = (f"; re-capture with {LLO_RECAPTURE} exported before JAX is imported (add "
               "--xla_xprof_enable_custom_call_tracing=true for per-bundle runtime detail of "
               "Pallas/Mosaic kernels, 6-12x the trace size)") if tpu else (
            "; LLO data exists only in TPU captures")
        raise NoData(f"{LLO_DATA_ABSENT}: no LLO instruction lines in the trace "
                     f"(planes: {', '.join(planes[:6])}){how}")

    def load_events_store(self) -> dict[str, Any]:
        """Load every trace event into xprof's DuckDB events store (a Parquet file)."""
        ws = self._workspace()
        out = ws.call("create_events_db")
        self._llo_db = str(out.get("path"))
        return {"status": "LOADED", "path": self._llo_db}

    def query_events_store(self, sql: str) -> Any:
        """Run one SELECT against the `Events` view of the store; returns the result rows."""
        return _rows(self._workspace().call("query_events_db", query=sql))

    def _llo_load(self) -> dict[str, Any]:
        self._llo_capture_check()
        info = self.load_events_store()
        info["lines"] = self.query_events_store(
            "SELECT thread_name, COUNT(*) AS events FROM Events GROUP BY thread_name "
            "ORDER BY events DESC LIMIT 20")
        return info

    def _llo_query(self, sql: str) -> dict[str, Any]:
        if self._llo_db is None:
            self._llo_capture_check()
        return {"query": sql, "rows": self.query_events_store(sql)}


def _rows(out: dict[str, Any]) -> Any:
    # query_events_db saves results to a JSON file and returns its path.
    path = out.get("path") or out.get("result_path")
    if isinstance(path, str) and Path(path).is_file():
        return json.loads(Path(path).read_text())
    return out.get("rows", out)
