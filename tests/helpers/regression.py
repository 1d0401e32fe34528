"""Stored sessions of one run for the regression explanation (the report's comparison with
the run's baseline) and the console's compare view."""

from __future__ import annotations

import json
from typing import Any

from mldiag.bootstrap import LocalRuntime
from mldiag.messages import RenderReport
from mldiag.model import ANALYZING, REPORTED, HostRecord, SessionRecord
from mldiag.stages import handle
from tests.helpers.snapshots import analysis, cpu_snapshot

RUN = "train"
HEALTHY = cpu_snapshot(step_ms=10.0, wait_ms=0.3, ops={"dot.1": 8.7, "add.2": 1.0}, run=RUN)
STALLED = cpu_snapshot(step_ms=50.0, wait_ms=40.2, ops={"dot.1": 8.8, "add.2": 1.0}, run=RUN)


def session_dir(session: str) -> str:
    return f"{RUN}/plugins/profile/{session}"


def host_records(session: str) -> dict[str, HostRecord]:
    return {"h0": HostRecord(object_name=f"{session_dir(session)}/h0.xplane.pb", generation="1",
                             size=1, arrived_at=1.0)}


def reported(rt: LocalRuntime, session: str, status: str, created_at: float,
             snapshot: dict[str, Any] = HEALTHY) -> None:
    """A session REPORTED earlier, with its stored artifacts."""
    base = f"{session_dir(session)}/analysis/v1"
    rt.storage.write_bytes(f"{base}/health_snapshot.json", json.dumps(snapshot).encode())
    rt.storage.write_bytes(f"{base}/analysis.json",
                           json.dumps(analysis(snapshot, status)).encode())
    rt.state.create_session(SessionRecord(
        run=RUN, session=session, state=REPORTED, hosts=host_records(session), verdict=status,
        reported_version=1, created_at=created_at, updated_at=created_at))


def report(rt: LocalRuntime, session: str, trigger: str = "alert",
           created_at: float = 5.0) -> dict[str, Any]:
    """Run the report stage on a session whose snapshot and investigation are stored."""
    base = f"{session_dir(session)}/analysis/v1"
    rt.storage.write_bytes(f"{base}/health_snapshot.json", json.dumps(STALLED).encode())
    rt.storage.write_bytes(f"{base}/investigation.json", json.dumps({
        "investigator": "rule-based", "summary": "The device waits for the host.",
        "findings": [{"id": "F1", "category": "host_bound", "priority": "P0",
                      "title": "Host-bound", "evidence": [], "impact": {"value": 80.4}}]
    }).encode())
    rt.state.create_session(SessionRecord(
        run=RUN, session=session, state=ANALYZING, trigger=trigger, hosts=host_records(session),
        created_at=created_at, updated_at=created_at))
    handle(RenderReport(run=RUN, session=session, version=1), rt.services)
    s = rt.state.get_session(RUN, session)
    assert s is not None and s.state == REPORTED
    return dict(json.loads(rt.storage.read_bytes(f"{session_dir(session)}/analysis/analysis.json")))
