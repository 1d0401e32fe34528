"""Capture with real JAX processes using the SDK: on-demand, continuous snapshots, programmatic
capture, CLI errors, and the demo (degradation → alert → auto-capture → report).

SDK targets take their requests by pull: nothing connects into them, they keep no secret in
the state store, and a workload that stops answering is reported as such."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from mldiag.bootstrap import LocalRuntime, bootstrap
from mldiag.cli.main import main
from mldiag.messages import CaptureProfile
from mldiag.model import FAILED, REPORTED, SessionRecord, TargetRecord
from mldiag.settings import Settings
from tests.helpers.net import free_port
from tests.helpers.pipeline import FAST
from tests.helpers.pipeline import finished as finished_in
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = Path(__file__).with_name("sdk_workload.py")
RUN = "train"

Launch = Callable[..., subprocess.Popen[bytes]]


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
        tmp = scratch(runtime, host)
        tmp.mkdir(parents=True, exist_ok=True)
        # Its own temp dir, where the test can see its continuous-profiling ring.
        env = {**os.environ, "MLDIAG_HOME": str(home), "MLDIAG_HOST_NAME": host,
               "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3", "TMPDIR": str(tmp)}
        proc = subprocess.Popen([sys.executable, str(WORKLOAD), "--run", RUN,
                                 "--port", str(free_port()), *args], env=env,
                                start_new_session=True)
        procs.append(proc)
        if wait_target:
            wait_until(lambda: any(t.pid == proc.pid for t in runtime.state.list_targets(RUN)),
                       what=f"target {host}", timeout=120, interval=0.1)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def scratch(runtime: LocalRuntime, host: str) -> Path:
    """The temp dir of the workload `host` (TMPDIR)."""
    return runtime.services.settings.home.parent / f"tmp-{host}"


def ring_windows(runtime: LocalRuntime, host: str) -> list[Path]:
    """The windows of `host`'s continuous-profiling ring on its disk. The ring writes a
    window's file just before it holds the window."""
    return sorted(scratch(runtime, host).glob("mldiag-ring-*/window-*.xplane.pb"))


def finished(runtime: LocalRuntime, session: str) -> SessionRecord:
    return finished_in(runtime, RUN, session)


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
    wait_until(lambda: len(ring_windows(runtime, "w0")) >= 2, timeout=30, interval=0.05,
               what=lambda: f"two complete windows in w0's ring: {ring_windows(runtime, 'w0')}")
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
    # The snapshot asks the target (a workload may run continuous profiling itself, issue
    # 34): this one's is off, so its host fails with the target's own word, and so does the
    # command.
    assert cli(runtime, "capture", "snap2", "--run", RUN, "--kind", "snapshot") == 1
    printed = capsys.readouterr()
    assert "continuous profiling is off on w0" in printed.out + printed.err
    assert runtime.state.get_session(RUN, "snap2").state == FAILED


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
    # and records nothing. A plain profiler server (a push target, no SDK) posing as a TPU
    # drives the native path against a real server (the workload's own JAX server) and shows
    # that an empty native snapshot fails the host with the reason.
    launch("w0")
    (sdk,) = runtime.state.list_targets(RUN)
    runtime.state.upsert_target(TargetRecord(run=RUN, host="tpu0", port=sdk.port,
                                             platform="tpu", last_heartbeat=time.time() + 600))
    args = ("--run", RUN, "--targets", "tpu0")
    assert cli(runtime, "continuous", "start", *args) == 0
    assert pushed(runtime, "tpu0").continuous == "NATIVE"
    # A native session mldiag did not start (the workload's own, as far as the state store
    # knows): `continuous start` adopts it instead of failing with ALREADY_EXISTS.
    runtime.state.update_target(RUN, "tpu0", sdk.port, continuous="OFF")
    assert cli(runtime, "continuous", "start", *args) == 0
    assert pushed(runtime, "tpu0").continuous == "NATIVE"
    assert cli(runtime, "capture", "nat1", *args, "--kind", "snapshot") == 1
    s = finished(runtime, "nat1")
    assert s.state == FAILED and "answered with no trace (it records device traces on TPU " \
        "only" in s.hosts["tpu0"].reason
    assert cli(runtime, "continuous", "stop", *args) == 0
    assert pushed(runtime, "tpu0").continuous == "OFF"


def test_a_plain_profiler_server_is_still_captured_by_push_within_the_byte_cap(
        runtime: LocalRuntime, launch: Launch) -> None:
    # A workload without the SDK: only JAX's profiler server (here the one a workload runs
    # with on_demand_xprof=True), registered as a push target.
    launch("w0")
    (sdk,) = runtime.state.list_targets(RUN)
    runtime.state.upsert_target(TargetRecord(run=RUN, host="plain0", port=sdk.port,
                                             last_heartbeat=time.time() + 600))
    assert cli(runtime, "capture", "push1", "--run", RUN, "--targets", "plain0",
               "--duration", "1s") == 0
    s = finished(runtime, "push1")
    assert s.state == REPORTED and s.hosts["plain0"].status == "ARRIVED"
    # The answer is capped before it is read.
    runtime.services.settings = replace(runtime.services.settings, max_host_bytes=1024)
    runtime.services.bus.publish(CaptureProfile(run=RUN, session="push-big", duration_s=0.5,
                                                targets=["plain0"]))
    s = finished(runtime, "push-big")
    assert s.state == FAILED and "over the 1,024-byte cap" in s.hosts["plain0"].reason


def pushed(runtime: LocalRuntime, host: str) -> TargetRecord:
    (target,) = [t for t in runtime.state.list_targets(RUN) if t.host == host]
    return target


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (from /proc: its sockets in LISTEN state)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_sdk_targets_pull_their_captures_and_expose_nothing(
        runtime: LocalRuntime, launch: Launch, capsys: pytest.CaptureFixture[str]) -> None:
    proc = launch("w0", "--no-server")
    (target,) = runtime.state.list_targets(RUN)
    assert target.delivery == "pull"
    # No secret at rest: the stored record carries no control endpoint or token at all.
    rows = runtime.state.connection().execute("SELECT data FROM targets").fetchall()
    stored = json.loads(rows[0][0])
    assert stored["control_token"] == "" and stored["control_port"] == 0
    # Nothing listens in the workload: no control endpoint, and (without on_demand_xprof) no
    # profiler server.
    assert listening_ports(proc.pid) == set()
    assert cli(runtime, "capture", "od-pull", "--run", RUN, "--duration", "1s") == 0
    s = finished(runtime, "od-pull")
    assert s.state == REPORTED and s.hosts["w0"].status == "ARRIVED"
    assert (runtime.storage.root / RUN / "plugins/profile/od-pull/w0.xplane.pb").is_file()
    assert cli(runtime, "targets", "list", "--run", RUN) == 0
    out = capsys.readouterr().out
    assert "DELIVERY" in out and " pull " in out
    assert listening_ports(proc.pid) == set()


def test_a_capture_the_workload_cannot_take_fails_its_host_with_the_workloads_reason(
        runtime: LocalRuntime, launch: Launch) -> None:
    launch("w0", "--no-server")
    # Past the CLI's check, the request reaches the workload, which has no ring to cut from.
    runtime.services.bus.publish(CaptureProfile(run=RUN, session="snap-off", capture="snapshot"))
    s = finished(runtime, "snap-off")
    assert s.state == FAILED
    assert s.hosts["w0"].reason.startswith("w0: continuous profiling is off on w0")
    assert "no answer" not in s.reason


def test_a_workload_that_stopped_answering_fails_its_host_and_never_serves_the_request(
        runtime: LocalRuntime, launch: Launch) -> None:
    launch("w0", "--no-server")
    stuck = launch("w1", "--no-server")
    dead = launch("w2", "--no-server")
    os.kill(stuck.pid, signal.SIGSTOP)  # alive, but takes nothing (its heartbeat stops too)
    os.killpg(dead.pid, signal.SIGKILL)
    dead.wait()
    started = time.monotonic()
    runtime.services.bus.publish(CaptureProfile(run=RUN, session="gone", duration_s=1.0,
                                                targets=["w0", "w1", "w2"]))
    s = finished(runtime, "gone")
    assert s.state == REPORTED, s.reason
    assert {h: r.status for h, r in s.hosts.items()} == {
        "w0": "ARRIVED", "w1": "FAILED", "w2": "FAILED"}
    assert s.hosts["w1"].reason.startswith("w1: no answer from w1 within ")
    assert "it never took the request, last heartbeat" in s.hosts["w1"].reason
    assert s.hosts["w2"].reason.startswith("w2: no answer from w2 within ")
    assert f"its process {dead.pid} is gone" in s.hosts["w2"].reason
    assert time.monotonic() - started < 30  # told by the heartbeat, not the full deadline
    # Woken up, the workload finds its request expired: it never uploads that capture.
    os.kill(stuck.pid, signal.SIGCONT)
    wait_until(lambda: time.time() - pushed(runtime, "w1").last_heartbeat < 1.5,
               what="w1's heartbeat", timeout=120, interval=0.1)
    # A later request that w1 takes and answers (it has no ring to cut a snapshot from):
    # by then it has polled its requests since it woke up.
    runtime.services.bus.publish(CaptureProfile(run=RUN, session="later", capture="snapshot",
                                                targets=["w1"]))
    later = finished(runtime, "later")
    assert later.hosts["w1"].reason.startswith("w1: continuous profiling is off on w1"), \
        later.hosts["w1"].reason
    assert not (runtime.storage.root / RUN / "plugins/profile/gone/w1.xplane.pb").exists()
    assert runtime.state.take_requests(RUN, "w1", time.time()) == []
