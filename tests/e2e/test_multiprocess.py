"""Several processes on one machine: every process is its own target, and a programmatic
session of a multi-process job is analysed once, with every process's trace.

Real JAX processes on CPU: `jax.distributed.initialize` with a local coordinator gives
`jax.process_count() == N`, and all N share one host name, as the processes of one TPU VM do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mldiag.bootstrap import LocalRuntime, bootstrap
from mldiag.model import REPORTED
from mldiag.settings import Settings
from tests.helpers.net import free_port
from tests.helpers.pipeline import FAST, finished
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow

WORKLOAD = Path(__file__).with_name("multiprocess_workload.py")
SDK_WORKLOAD = Path(__file__).with_name("sdk_workload.py")
RUN = "train"


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[LocalRuntime]:
    rt = bootstrap(Settings(home=tmp_path / "home", **FAST))
    rt.start()
    yield rt
    rt.stop()


def _env(runtime: LocalRuntime, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "MLDIAG_HOME": str(runtime.services.settings.home),
            "MLDIAG_HOST_NAME": "box", "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3",
            # The lock files that reserve names on "this machine": private to the test.
            "TMPDIR": str(tmp_path)}


def _run_job(runtime: LocalRuntime, tmp_path: Path, processes: int, session: str,
             *, staggered: bool) -> list[dict[str, float]]:
    """Run the job to its end (jax's shutdown barrier included); each process's start() and
    stop() times. `staggered`: process k starts k/2 s after the first, and the last one only
    once the first has stopped capturing and closed its run."""
    coordinator = f"127.0.0.1:{free_port()}"
    env = _env(runtime, tmp_path)
    stopped = tmp_path / f"{session}.stopped-0"
    procs = []
    for i in range(processes):
        extra: list[str] = []
        if staggered and i == processes - 1:
            extra = ["--start-after", str(stopped), "--start-delay", "1"]
        elif staggered:
            extra = ["--start-delay", str(i / 2)]
        if staggered and i == 0:
            extra += ["--stopped", str(stopped)]
        procs.append(subprocess.Popen(
            [sys.executable, str(WORKLOAD), "--run", RUN, "--coordinator", coordinator,
             "--processes", str(processes), "--index", str(i), "--session", session, *extra],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        outputs = [p.communicate(timeout=240)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    # No process aborted (jax's shutdown barrier waits for the late one, which never blocks).
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outputs)
    return [json.loads(line.split(" ", 1)[1]) for o in outputs for line in o.splitlines()
            if line.startswith("timings ")]


@pytest.mark.parametrize("processes", [2, 4])
def test_processes_starting_apart_never_block_and_version_1_has_them_all(
        runtime: LocalRuntime, tmp_path: Path, processes: int) -> None:
    """The processes reach start() seconds apart, the last one after the first has stopped
    and closed its run: nobody waits in start() or stop(), nobody aborts, and the one
    session holds every process's trace in version 1."""
    timings = _run_job(runtime, tmp_path, processes, "job", staggered=True)
    assert len(timings) == processes
    # Waiting for a missing process used to take 30 s in start(); the profiler's own start
    # and stop (writing the trace) take well under a second here.
    assert max(t["start_s"] for t in timings) < 3.0, timings
    assert max(t["stop_s"] for t in timings) < 5.0, timings
    hosts = [f"box-{i}" for i in range(processes)]
    assert sorted(t.host for t in runtime.state.list_targets(RUN)) == hosts
    s = finished(runtime, RUN, "job")
    assert s.state == REPORTED, s.reason
    assert s.process_count == processes and s.processes == {h: i for i, h in enumerate(hosts)}
    assert sorted(s.hosts) == hosts and {r.status for r in s.hosts.values()} == {"ARRIVED"}
    assert s.version == 1 and s.superseded == []  # analysed once, with every trace
    assert [x.session for x in runtime.state.list_sessions(run=RUN)] == ["job"]
    session_dir = runtime.storage.root / RUN / "plugins/profile/job"
    assert sorted(p.name for p in session_dir.glob("*.xplane.pb")) == [
        f"{h}.xplane.pb" for h in hosts]
    analysis = json.loads((session_dir / "analysis/analysis.json").read_text())
    assert sorted(analysis["session"]["hosts"]) == hosts
    if processes == 2:
        # The job restarts: every process keeps its host name.
        _run_job(runtime, tmp_path, processes, "again", staggered=False)
        again = wait_until(lambda: (x if (x := runtime.state.get_session(RUN, "again"))
                                    and len(x.hosts) == processes else None),
                           what="the restarted job's hosts", timeout=120)
        assert sorted(again.hosts) == hosts and again.processes == s.processes
        assert sorted(t.host for t in runtime.state.list_targets(RUN)) == hosts


def test_independent_processes_sharing_a_machine_get_distinct_names(
        runtime: LocalRuntime, tmp_path: Path) -> None:
    """Processes of one run that are not one JAX job (process_count 1, all process index 0)
    on one machine: the first keeps the machine's name, the next takes `-1`, and a
    programmatic session of both is one session with two traces."""
    env = _env(runtime, tmp_path)
    procs = []
    try:
        for count in (1, 2):
            procs.append(subprocess.Popen(
                [sys.executable, str(SDK_WORKLOAD), "--run", RUN, "--port", str(free_port()),
                 "--no-server", "--programmatic", "both", "--wait-targets", "2",
                 "--seconds", "60"], env=env))
            # One after the other, so which one is "box" is known.
            wait_until(lambda: len(runtime.state.list_targets(RUN)) == count,  # noqa: B023
                       what="the target", timeout=120, interval=0.1)
        s = finished(runtime, RUN, "both")
    finally:
        for p in procs:
            p.kill()
            p.wait()
    by_pid = {t.pid: t.host for t in runtime.state.list_targets(RUN)}
    assert [by_pid[p.pid] for p in procs] == ["box", "box-1"]
    assert s.state == REPORTED, s.reason
    assert sorted(s.hosts) == ["box", "box-1"] and s.version == 1
