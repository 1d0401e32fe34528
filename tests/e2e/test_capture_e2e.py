"""Capture with real JAX processes using the SDK: on-demand, continuous snapshots, programmatic
capture, CLI errors, and the demo (degradation → alert → auto-capture → report)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mldiag.bootstrap import LocalRuntime, bootstrap
from mldiag.cli.main import main
from mldiag.model import FAILED, REPORTED, SessionRecord, TargetRecord
from mldiag.settings import Settings

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = Path(__file__).with_name("sdk_workload.py")
RUN = "train"
FAST = {"settle_s": 0.3, "stability_s": 0.1, "poll_s": 0.02, "retry_backoff_s": 0.05,
        "max_attempts": 3}

Launch = Callable[..., subprocess.Popen[bytes]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for[T](what: str, check: Callable[[], T], timeout: float = 120.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[LocalRuntime]:
    rt = bootstrap(Settings(home=tmp_path / "home", **FAST))
    rt.start()
    yield rt
    rt.stop()


@pytest.fixture
def launch(runtime: LocalRuntime) -> Iterator[Launch]:
    """Start sdk_workload.py processes on the runtime's home; all killed at teardown."""
    procs: list[subprocess.Popen[bytes]] = []
    home = runtime.services.settings.home

    def start(host: str, *args: str, wait_target: bool = True) -> subprocess.Popen[bytes]:
        env = {**os.environ, "MLDIAG_HOME": str(home), "MLDIAG_HOST_NAME": host,
               "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
        proc = subprocess.Popen([sys.executable, str(WORKLOAD), "--run", RUN,
                                 "--port", str(free_port()), *args], env=env,
                                start_new_session=True)
        procs.append(proc)
        if wait_target:
            wait_for(f"target {host}", lambda: any(
                t.pid == proc.pid for t in runtime.state.list_targets(RUN)))
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def finished(runtime: LocalRuntime, session: str) -> SessionRecord:
    return wait_for(f"session {session} to finish", lambda: (
        s if (s := runtime.state.get_session(RUN, session)) and s.state in (REPORTED, FAILED)
        else None))


def cli(runtime: LocalRuntime, *argv: str) -> int:
    return main([*argv, "--home", str(runtime.services.settings.home)])


def test_on_demand_capture_keeps_the_hosts_that_answered(
        runtime: LocalRuntime, launch: Launch, capsys: pytest.CaptureFixture[str]) -> None:
    launch("w0")
    launch("w1")
    # A third target whose process is gone: registered, fresh heartbeat, nobody listening.
    runtime.state.upsert_target(TargetRecord(run=RUN, host="w2", port=free_port(),
                                             last_heartbeat=time.time() + 600))
    assert cli(runtime, "capture", "od1", "--run", RUN, "--duration", "1s") == 0
    s = finished(runtime, "od1")
    assert s.state == REPORTED and s.kind == "on_demand" and s.trigger == "manual"
    assert sorted(s.expected_hosts) == ["w0", "w1", "w2"]
    assert {h: r.status for h, r in s.hosts.items()} == {
        "w0": "ARRIVED", "w1": "ARRIVED", "w2": "FAILED"}
    assert "unreachable" in s.hosts["w2"].reason
    out = capsys.readouterr()
    assert "host w2 failed" in out.out and "target down: w2" in out.err
    # The verdict and its findings, read back from analysis.json.
    assert "NEEDS_ATTENTION: " in out.out or "OPTIMAL: " in out.out
    session_dir = runtime.storage.root / RUN / "plugins" / "profile" / "od1"
    assert sorted(p.name for p in session_dir.glob("*.xplane.pb")) == [
        "w0.xplane.pb", "w1.xplane.pb"]
    assert (session_dir / "analysis" / "summary.html").is_file()


def test_continuous_snapshot_and_on_demand_served_from_the_ring(
        runtime: LocalRuntime, launch: Launch, capsys: pytest.CaptureFixture[str]) -> None:
    launch("w0")
    assert cli(runtime, "continuous", "start", "--run", RUN, "--window", "1s") == 0
    (target,) = runtime.state.list_targets(RUN)
    assert target.continuous == "RING"
    time.sleep(2.5)  # at least two complete windows
    t_request = time.time()
    assert cli(runtime, "capture", "snap1", "--run", RUN, "--kind", "snapshot",
               "--duration", "2s") == 0
    snap = finished(runtime, "snap1")
    assert snap.state == REPORTED and snap.kind == "snapshot"
    # A snapshot covers time before the request: it did not wait for new windows.
    assert snap.hosts["w0"].arrived_at - t_request < 1.5
    # On-demand while the profiler is busy with the ring: served from it, not refused.
    assert cli(runtime, "capture", "od-ring", "--run", RUN, "--duration", "1s") == 0
    assert finished(runtime, "od-ring").state == REPORTED
    assert cli(runtime, "continuous", "stop", "--run", RUN) == 0
    assert runtime.state.list_targets(RUN)[0].continuous == "OFF"
    capsys.readouterr()
    assert cli(runtime, "capture", "snap2", "--run", RUN, "--kind", "snapshot") == 1
    assert "continuous profiling is off on w0" in capsys.readouterr().err


def test_programmatic_xprof_uploads_one_session(runtime: LocalRuntime, launch: Launch) -> None:
    proc = launch("w0", "--programmatic", "prog1", wait_target=False)
    s = finished(runtime, "prog1")
    assert s.state == REPORTED, s.reason
    assert s.kind == "programmatic" and s.expected_hosts == ["w0"]
    assert (runtime.storage.root / RUN / "plugins/profile/prog1/w0.xplane.pb").is_file()
    # Uploaded as soon as the trace was written, while the job still trains.
    assert proc.poll() is None


def test_one_session_id_on_two_hosts_is_one_multi_host_session(
        runtime: LocalRuntime, launch: Launch) -> None:
    for host in ("w0", "w1"):
        launch(host, "--programmatic", "shared", "--wait-targets", "2", wait_target=False)
    s = finished(runtime, "shared")
    assert s.state == REPORTED, s.reason
    assert sorted(s.expected_hosts) == ["w0", "w1"] and sorted(s.hosts) == ["w0", "w1"]
    assert s.version == 1  # analysed once, with both hosts
    analysis = json.loads((runtime.storage.root / RUN / "plugins/profile/shared/analysis"
                           / "analysis.json").read_text())
    assert sorted(analysis["session"]["hosts"]) == ["w0", "w1"]


def test_control_commands_fail_with_one_clear_line(
        runtime: LocalRuntime, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(runtime, "capture", "x", "--run", "nope") == 1
    assert capsys.readouterr().err.strip().startswith("mldiag: error: unknown run 'nope'")
    assert cli(runtime, "runs", "create", RUN) == 0
    capsys.readouterr()
    assert cli(runtime, "capture", "x", "--run", RUN) == 1
    assert "has no profiler targets" in capsys.readouterr().err
    runtime.state.upsert_target(TargetRecord(run=RUN, host="w9", port=free_port(),
                                             last_heartbeat=time.time() - 3600))
    assert cli(runtime, "capture", "x", "--run", RUN) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "target down: w9" in err and "last heartbeat" in err
    assert cli(runtime, "continuous", "start", "--run", RUN) == 1
    assert "target down: w9" in capsys.readouterr().err


def test_demo_names_the_injected_stall_at_p0_and_cleans_up(tmp_path: Path) -> None:
    env = {**os.environ, "MLDIAG_HOME": str(tmp_path / "home"), "JAX_PLATFORMS": "cpu"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mldiag.cli.main", "demo"], env=env,
                          capture_output=True, text=True, timeout=180, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "P0 host_bound" in done.stdout
    assert "(trigger: alert, kind: snapshot)" in done.stdout
    assert "baseline (healthy):" in done.stdout
    # The report says what changed since the pinned baseline, the stall ranked first.
    changed = done.stdout.split("what changed since ", 1)[1]
    first = next(line for line in changed.splitlines() if line.strip().startswith("1."))
    assert "waits longer for the host" in first, changed
    assert "diff: " in changed and changed.split("diff: ", 1)[1].split()[0].endswith(
        "diff.html")
    assert time.monotonic() - started < 180
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path / "home")], capture_output=True,
                              text=True)
    assert leftover.stdout.strip() == "", "the demo left processes behind"


def test_tpu_targets_use_xprofs_native_continuous_profiling(
        runtime: LocalRuntime, launch: Launch, capsys: pytest.CaptureFixture[str]) -> None:
    # xprof's native continuous profiling is TPU-only: on a CPU profiler server it answers OK
    # and records nothing. Posing as a TPU target drives the native path against a real server
    # and shows that an empty native snapshot fails the host with the reason.
    launch("w0")
    (target,) = runtime.state.list_targets(RUN)
    runtime.state.update_target(RUN, target.host, target.port, platform="tpu")
    assert cli(runtime, "continuous", "start", "--run", RUN) == 0
    assert runtime.state.list_targets(RUN)[0].continuous == "NATIVE"
    assert cli(runtime, "capture", "nat1", "--run", RUN, "--kind", "snapshot") == 1
    s = finished(runtime, "nat1")
    assert s.state == FAILED and "wrote no .xplane.pb" in s.hosts["w0"].reason
    assert cli(runtime, "continuous", "stop", "--run", RUN) == 0
    assert runtime.state.list_targets(RUN)[0].continuous == "OFF"
