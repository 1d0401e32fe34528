"""Follow-up tools an investigator may call after triage, at most MAX_FOLLOW_UPS per analysis.

`llo_load`/`llo_query` are ours: they load the trace's events into xprof's DuckDB events store
and answer `LLO_DATA_ABSENT` when the capture has no LLO lines (any non-TPU trace).
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mldiag.analysis.collect import tool_result
from mldiag.analysis.profile_input import ProfileSession
from mldiag.analysis.xprof_tools import NoData, XprofWorkspace

MAX_FOLLOW_UPS = 4
FOLLOW_UP_TOOLS = (
    "get_hlo_neighborhood",
    "aggregate_xplane_events",
    "get_kernel_stats",
    "get_hosts",
    "llo_load",
    "llo_query",
)
LLO_DATA_ABSENT = "LLO_DATA_ABSENT"


class FollowUpRefused(Exception):
    """The call is not an allowed follow-up, or the budget of calls is spent."""


class FollowUps:
    """Runs follow-up tools on one session, recording each call for investigation.json."""

    def __init__(self, session: ProfileSession, max_calls: int = MAX_FOLLOW_UPS) -> None:
        self.session = session
        self.max_calls = max_calls
        self.records: list[dict[str, Any]] = []
        self._ws: XprofWorkspace | None = None
        self._llo_db: str | None = None

    def __enter__(self) -> FollowUps:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None

    @property
    def remaining(self) -> int:
        return self.max_calls - len(self.records)

    def _workspace(self) -> XprofWorkspace:
        if self._ws is None:
            self._ws = XprofWorkspace(self.session).__enter__()
        return self._ws

    def call(self, tool: str, purpose: str, **args: Any) -> dict[str, Any]:
        """Run one follow-up; returns `{tool, args, purpose, status, elapsed_ms, data|error}`."""
        if tool not in FOLLOW_UP_TOOLS:
            raise FollowUpRefused(f"{tool} is not a follow-up tool ({', '.join(FOLLOW_UP_TOOLS)})")
        if self.remaining <= 0:
            raise FollowUpRefused(f"follow-up budget of {self.max_calls} calls is spent")
        ours: dict[str, Callable[..., dict[str, Any]]] = {
            "aggregate_xplane_events": self._aggregate_events,
            "get_kernel_stats": self._kernel_stats,
            "llo_load": self._llo_load,
            "llo_query": self._llo_query,
        }
        impl = ours.get(tool)
        if impl is None:
            # Text-mode tools echo their trace selection to stderr; keep the terminal clean.
            with contextlib.redirect_stderr(io.StringIO()):
                result = tool_result(tool, lambda: self._workspace().call(tool, **args))
        else:
            run = impl
            result = tool_result(tool, lambda: run(**args))
        record = {"tool": tool, "args": args, "purpose": purpose, **result}
        record.pop("name", None)
        self.records.append(record)
        return record

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
        from mldiag.analysis.xspace_scan import aggregate_events

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
        return {
            "kernel_count": len(rows),
            "total_kernel_time_us": round(total_us, 3),
            "kernels": rows[:limit],
        }

    def _llo_capture_check(self) -> None:
        # xprof's inspect_capture answers the same question but visits every event; line names
        # are enough (xprof's own list of the lines that carry LLO detail).
        from xprof.cli.internal.oss.xplane_tools import _LLO_LINE_NAMES
        from xprof.profile_data import ProfileData

        planes: list[str] = []
        for xplane in self.session.xplanes:
            with ProfileData.from_file(str(xplane)) as data:
                for plane in data.planes:
                    planes.append(plane.name)
                    if any(line.name in _LLO_LINE_NAMES for line in plane.lines):
                        return
        raise NoData(f"{LLO_DATA_ABSENT}: no LLO instruction lines in the trace "
                     f"(planes: {', '.join(planes[:6])}); LLO data exists only in TPU "
                     "captures with LLO tracing")

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
