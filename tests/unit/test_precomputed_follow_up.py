"""The host-bound follow-up computed during collection: the same answer as the follow-up
itself, given without running it, and only for exactly its arguments."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mldiag.analysis.collection.jobs import host_python_events
from mldiag.analysis.collection.profile_input import resolve_session
from mldiag.analysis.collection.xspace.event_aggregates import aggregate_events
from mldiag.analysis.collection.xspace.scan import XSpaceScan
from mldiag.analysis.judgement.followups import HOST_PYTHON_EVENTS, FollowUps

pytestmark = pytest.mark.slow

_WORKLOAD = textwrap.dedent("""
    import sys, time
    import jax, jax.numpy as jnp

    def host_work():
        time.sleep(0.002)

    step = jax.jit(lambda x: jnp.tanh(x @ x))
    x = jnp.ones((64, 64))
    step(x).block_until_ready()
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = 3
    options.python_tracer_level = 1
    with jax.profiler.trace(sys.argv[1], profiler_options=options):
        for i in range(20):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                host_work()
                step(x).block_until_ready()
""")


@pytest.fixture(scope="module")
def python_traced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    logdir = tmp_path_factory.mktemp("pytrace")
    subprocess.run([sys.executable, "-c", _WORKLOAD, str(logdir)], check=True, timeout=120,
                   env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    (run_dir,) = (logdir / "plugins" / "profile").iterdir()
    return run_dir


def test_the_timeline_pass_gives_the_follow_ups_own_answer(python_traced: Path) -> None:
    (xplane,) = python_traced.glob("*.xplane.pb")
    with XSpaceScan(xplane) as scan:
        known = host_python_events(scan)
    assert known is not None and known["args"] == HOST_PYTHON_EVENTS
    theirs = aggregate_events([xplane], **HOST_PYTHON_EVENTS)
    assert known["data"]["aggregates"] == theirs["aggregates"][:100]
    assert any("host_work" in r["event"] for r in known["data"]["aggregates"])


def test_follow_ups_answer_exactly_those_arguments_from_it(python_traced: Path) -> None:
    (xplane,) = python_traced.glob("*.xplane.pb")
    with XSpaceScan(xplane) as scan:
        known = host_python_events(scan)
    assert known is not None
    session = resolve_session(python_traced)
    with FollowUps(session, max_calls=2, precomputed={"aggregate_xplane_events": known}) as f:
        fast = f.call("aggregate_xplane_events", "host frames", **HOST_PYTHON_EVENTS)
        other = f.call("aggregate_xplane_events", "all host events",
                       plane_regex="^/host:CPU$", event_regex="host_work")
    assert fast["status"] == "DATA" and fast["elapsed_ms"] == 0.0 and fast["precomputed"]
    assert fast["data"] == known["data"]
    assert other["status"] == "DATA" and "precomputed" not in other
    assert [r["event"] for r in other["data"]["aggregates"]] == [
        r["event"] for r in known["data"]["aggregates"] if "host_work" in r["event"]]
    assert f.remaining == 0, "a precomputed answer still counts against the budget"
