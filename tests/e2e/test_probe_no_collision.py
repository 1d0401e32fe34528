"""A liveness check never collides with the workload's own tracing (issue 34, item 5).

A real JAX workload traces itself in a loop (`jax.profiler.start_trace`/`stop_trace`) on the
profiler server it serves (`jax.profiler.start_server`), registered as a plain target of a run
on a real local runtime. While it traces, the runtime's background prober checks it several
times a second, and the console's runs list, the run's page and `targets list` are read
without pause. Every one of the workload's traces succeeds: the check asks the profiler
service for nothing that starts a profiling session (before, a probe started one, and the
workload's next `start_trace` failed, and every one after it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mldiag.access import ALL_RUNS, create_token
from mldiag.bootstrap import LocalRuntime, bootstrap
from mldiag.cli.main import main
from mldiag.console.app import create_app
from mldiag.console.context import build_console
from mldiag.settings import Settings
from tests.helpers.net import free_port
from tests.helpers.pipeline import FAST
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow

WORKLOAD = Path(__file__).with_name("tracing_workload.py")
RUN = "traced"
SECONDS = 12.0


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[LocalRuntime]:
    rt = bootstrap(Settings(home=tmp_path / "home", probe_interval_s=0.1, **FAST))
    rt.start()
    yield rt
    rt.stop()


@pytest.fixture
def workload(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(WORKLOAD), "--port", str(port), "--logdir",
                             str(tmp_path / "own-traces"), "--seconds", str(SECONDS)],
                            env={**os.environ, "JAX_PLATFORMS": "cpu",
                                 "TF_CPP_MIN_LOG_LEVEL": "3"},
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc, port
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_the_workloads_own_traces_all_succeed_while_it_is_checked_and_read(
        runtime: LocalRuntime, workload: tuple[subprocess.Popen[str], int],
        capsys: pytest.CaptureFixture[str]) -> None:
    proc, port = workload
    home = str(runtime.services.settings.home)
    assert main(["machine-learning-run", "create", RUN, "--location=us-central1",
                 "--home", home]) == 0
    assert main(["profiler-target", "create", RUN, "--address", f"127.0.0.1:{port}",
                 "--platform", "cpu", "--home", home]) == 0
    assert "registered on run" in capsys.readouterr().out
    console = build_console(runtime.services.settings)
    secret, _ = create_token(console.access, role="viewer", run=ALL_RUNS, now=time.time())
    auth = {"Authorization": f"Bearer {secret}"}
    reads = {"api": 0, "cli": 0}
    checks: set[float] = set()
    seen: set[str] = set()
    stop = threading.Event()

    def read() -> None:
        with TestClient(create_app(console), base_url="http://127.0.0.1:8790") as client:
            while not stop.is_set():
                assert client.get("/api/v1/runs", headers=auth).status_code == 200
                assert client.get(f"/runs/{RUN}", headers=auth).status_code == 200
                rows = client.get(f"/api/v1/runs/{RUN}/targets", headers=auth).json()
                checks.add(runtime.state.list_targets(RUN)[0].probed_at)
                seen.add(rows[0]["status"])
                reads["api"] += 1

    reader = threading.Thread(target=read)
    reader.start()
    try:
        while proc.poll() is None:
            assert main(["targets", "list", "--run", RUN, "--home", home]) == 0
            reads["cli"] += 1
    finally:
        stop.set()
        reader.join()
    out, _ = proc.communicate()
    result = json.loads(out.strip().splitlines()[-1])
    assert result["ok"] > 20 and result["failed"] == 0, result
    # The prober checked it all along (several checks a second, each a new connection), and
    # found it up each time.
    assert seen == {"up"}, seen
    assert len(checks) >= SECONDS, checks
    assert reads["api"] > 10 and reads["cli"] > 10, reads
    # Then down, once the workload is gone.
    wait_until(lambda: runtime.state.list_targets(RUN)[0].probe_state == "down",
               what="down once the workload ended", timeout=10.0, interval=0.1)
