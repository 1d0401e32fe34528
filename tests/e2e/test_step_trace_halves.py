"""xprof's step trace, computed in two halves side by side
(mldiag.analysis.collection.jobs), is xprof's own tool's answer: on a CPU profile (where only
the input-pipeline half finds steps), and on the team's TPU and GPU traces."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from mldiag.analysis.collection.jobs import (
    Context,
    pick_step_trace,
    step_trace_pods,
    xprof_step_trace,
)
from mldiag.analysis.collection.profile_input import resolve_session
from mldiag.analysis.collection.xprof_tools import NoData, XprofWorkspace


def _whole_and_halves(run_dir: Path) -> tuple[object, object, object]:
    session = resolve_session(run_dir)
    with XprofWorkspace(session) as ws:
        ws.precompute_op_stats()
        try:
            whole: object = ws.call("get_step_trace", limit=50)
        except NoData as e:
            whole = {"status": "NO_DATA", "message": str(e)}
    halves = []
    for half in (step_trace_pods, xprof_step_trace):
        # Each half in a workspace of its own, as each runs in a worker with its own cache.
        with XprofWorkspace(session) as ws:
            ws.precompute_op_stats()
            halves.append(half(Context(ws=ws, session=session), {}))
    return whole, halves[0], halves[1]


def test_on_a_cpu_profile_the_halves_give_xprofs_step_trace(
        workload_run_dir: Callable[[str], Path]) -> None:
    whole, pods, rest = _whole_and_halves(workload_run_dir("host_bound"))
    assert isinstance(whole, dict) and whole["step_breakdown"], "the profile has steps"
    assert pods.get("status") == "NO_DATA"  # the pod viewer has no steps on XLA:CPU
    assert pick_step_trace(pods, rest) == whole


@pytest.mark.parametrize("logdir_fixture", ["tpu_logdir", "gpu_logdir"])
def test_on_the_fixtures_the_halves_give_xprofs_step_trace(
        logdir_fixture: str, request: pytest.FixtureRequest) -> None:
    whole, pods, rest = _whole_and_halves(request.getfixturevalue(logdir_fixture))
    assert pick_step_trace(pods, rest) == whole
