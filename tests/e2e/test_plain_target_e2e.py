"""A workload without the SDK (only `jax.profiler.start_server(PORT)`) registered from the CLI
alone, captured on demand and from an alert, and watched by the background prober: up (also
while a capture holds its profiler: the check starts no session), then down."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mldiag.bootstrap import LocalRuntime, bootstrap
from mldiag.capture import remote
from mldiag.cli.main import main
from mldiag.messages import DegradationDetected
from mldiag.model import REPORTED, SessionRecord
from mldiag.settings import Settings
from tests.helpers.net import free_port
from tests.helpers.pipeline import FAST
from tests.helpers.pipeline import finished as finished_in
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow

WORKLOAD = Path(__file__).with_name("plain_workload.py")
RUN = "plain-run"


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[LocalRuntime]:
    rt = bootstrap(Settings(home=tmp_path / "home", probe_interval_s=0.2, **FAST))
    rt.start()
    yield rt
    rt.stop()


@pytest.fixture
def plain() -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(WORKLOAD), "--port", str(port)],
                            env={**os.environ, "JAX_PLATFORMS": "cpu",
                                 "TF_CPP_MIN_LOG_LEVEL": "3"},
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc, port
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def cli(runtime: LocalRuntime, capsys: pytest.CaptureFixture[str], *argv: str
        ) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([*argv, "--home", str(runtime.services.settings.home)])
    out, err = capsys.readouterr()
    return code, out, err


def finished(runtime: LocalRuntime, session: str) -> SessionRecord:
    return finished_in(runtime, RUN, session)


def test_a_plain_profiler_server_registered_from_the_cli_is_captured_and_watched(
        runtime: LocalRuntime, plain: tuple[subprocess.Popen[str], int],
        capsys: pytest.CaptureFixture[str]) -> None:
    proc, port = plain
    address = f"127.0.0.1:{port}"
    assert cli(runtime, capsys, "machine-learning-run", "create", RUN,
               "--location=us-central1")[0] == 0
    code, out, _ = cli(runtime, capsys, "profiler-target", "create", RUN, "--address", address,
                       "--platform", "cpu")
    # Named without its address (every role reads host names; addresses are for viewers).
    name = re.search(r"target (target-[0-9a-f]{8}) \(" + re.escape(address) + r"\) registered",
                     out)
    assert code == 0 and name, out
    host = name.group(1)
    assert out.rstrip().endswith(": up")
    # The product's first command, as the docs pipe it into the next one.
    code, out, _ = cli(runtime, capsys, "profiler-target", "list",
                       f"--machine-learning-run={RUN}", "--location=us-central1",
                       "--format=csv[no-heading](name.basename())")
    assert code == 0 and out.splitlines() == [host]

    # On demand, named by address as a user pastes it.
    code, out, err = cli(runtime, capsys, "profiler-session", "capture", "od1",
                         f"--machine-learning-run={RUN}", f"--targets={address}",
                         "--duration", "1000ms", "--location=us-central1")
    s = finished(runtime, "od1")
    assert code == 0, err
    assert s.state == REPORTED and s.hosts[host].status == "ARRIVED"  # type: ignore[attr-defined]

    # From an alert: the run's policy captures the live plain server.
    assert cli(runtime, capsys, "autocapture", "set", "--run", RUN, "--enable",
               "--kind", "on-demand", "--duration", "1s")[0] == 0
    runtime.services.bus.publish(DegradationDetected(alert_id="slow-1", run=RUN,
                                                     source="cloud-monitoring",
                                                     summary="step time up 40%"))
    auto = wait_until(lambda: next(
        (x for x in runtime.state.list_sessions(run=RUN) if x.trigger == "alert"), None),
        what="the alert's session", timeout=120, interval=0.1)
    auto = finished(runtime, auto.session)
    assert auto.state == REPORTED, auto  # type: ignore[attr-defined]
    code, out, _ = cli(runtime, capsys, "monitored-events", "list",
                       f"--machine-learning-run={RUN}", "--format=value(name,profilerSession)")
    assert code == 0 and out.split() == ["slow-1", auto.session]  # type: ignore[attr-defined]

    def listed() -> str:
        code, out, _ = cli(runtime, capsys, "profiler-target", "list",
                           f"--machine-learning-run={RUN}",
                           "--format=csv[no-heading](name,status)")
        return out.strip()

    # Up while another session holds its profiler: the prober's check starts no session, so
    # it neither collides with the capture nor mistakes it for a dead server.
    holder = threading.Thread(target=lambda: remote.remote_trace(address, 3.0))
    holder.start()
    try:
        held_at = time.time()
        wait_until(lambda: runtime.state.list_targets(RUN)[0].probed_at > held_at + 0.5,
                   what="a check while the trace runs", timeout=10.0, interval=0.05)
        assert listed().endswith(",up")
    finally:
        holder.join()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_until(lambda: listed().endswith(",down"), what="down", timeout=10.0, interval=0.1)
    code, out, _ = cli(runtime, capsys, "targets", "list", "--run", RUN)
    assert code == 0 and " down " in out and remote.UNREACHABLE in out
    assert "(checked " in out
    # Forgotten from the CLI too.
    code, out, _ = cli(runtime, capsys, "profiler-target", "delete", RUN, address)
    assert code == 0 and runtime.state.list_targets(RUN) == []
