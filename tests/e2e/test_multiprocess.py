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


@pytest.mark.parametrize("processes", [2, 4])
def test_each_process_of_a_job_is_a_host_and_version_1_has_them_all(
        runtime: LocalRuntime, tmp_path: Path, processes: int) -> None:
    coordinator = f"127.0.0.1:{free_port()}"
    env = _env(runtime, tmp_path)
    procs = [subprocess.Popen(
        [sys.executable, str(WORKLOAD), "--run", RUN, "--coordinator", coordinator,
         "--processes", str(processes), "--index", str(i), "--session", "job",
         # The last process registers late: the first must still wait for it.
         "--register-after", "4" if i == processes - 1 else "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for i in range(processes)]
    try:
        outputs = [p.communicate(timeout=240)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outputs)
    hosts = [f"box-{i}" for i in range(processes)]
    assert sorted(t.host for t in runtime.state.list_targets(RUN)) == hosts
    s = finished(runtime, RUN, "job")
    assert s.state == REPORTED, s.reason
    assert sorted(s.expected_hosts) == hosts and s.note == ""
    assert sorted(s.hosts) == hosts and {r.status for r in s.hosts.values()} == {"ARRIVED"}
    assert s.version == 1  # analysed once, with every process's trace
    session_dir = runtime.storage.root / RUN / "plugins/profile/job"
    assert sorted(p.name for p in session_dir.glob("*.xplane.pb")) == [
        f"{h}.xplane.pb" for h in hosts]
    analysis = json.loads((session_dir / "analysis/analysis.json").read_text())
    assert sorted(analysis["session"]["hosts"]) == hosts


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
