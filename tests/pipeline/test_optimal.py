"""A healthy profile short-circuits: no investigation stage, a report with verdict OPTIMAL."""

from __future__ import annotations

import json

from mldiag.analysis.judgement.triage import OPTIMAL, triage
from mldiag.bootstrap import LocalRuntime
from mldiag.messages import RenderReport
from mldiag.model import ANALYZING, REPORTED, HostRecord
from mldiag.stages import handle
from tests.helpers.pipeline import MakeRuntime
from tests.helpers.snapshots import healthy_snapshot

RUN, SESSION = "healthy", "s1"


def test_a_healthy_snapshot_is_reported_optimal_without_investigation(
        make_runtime: MakeRuntime) -> None:
    snapshot = healthy_snapshot(RUN, SESSION)
    assert triage(snapshot).status == OPTIMAL
    rt: LocalRuntime = make_runtime()
    base = f"{RUN}/plugins/profile/{SESSION}"
    info = rt.storage.write_bytes(f"{base}/analysis/v1/health_snapshot.json",
                                  json.dumps(snapshot).encode())
    rt.state.ensure_run(RUN, discovered=True)
    rt.state.register_host(RUN, SESSION, "h0", HostRecord(
        object_name=f"{base}/h0.xplane.pb", generation="1", size=1, arrived_at=1.0), 1.0)
    assert rt.state.transition(RUN, SESSION, ANALYZING, now=2.0) is not None

    handle(RenderReport(run=RUN, session=SESSION, version=1), rt.services)

    s = rt.state.get_session(RUN, SESSION)
    assert s is not None and s.state == REPORTED and s.verdict == OPTIMAL
    analysis = json.loads(rt.storage.read_bytes(f"{base}/analysis/analysis.json"))
    assert analysis["status"] == OPTIMAL and analysis["follow_ups"] == []
    assert not [f for f in analysis["findings"] if f["priority"] in ("P0", "P1")]
    investigation = json.loads(rt.storage.read_bytes(f"{base}/analysis/investigation.json"))
    assert "short_circuit" in investigation
    assert "OPTIMAL" in rt.storage.read_bytes(f"{base}/analysis/summary.html").decode()
    assert info.size > 0
