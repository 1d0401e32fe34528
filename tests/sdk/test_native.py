"""xprof's native continuous profiling, started by the workload itself, is adopted; and a
capture from a continuous session never silently drops the tracer levels it asked for.

Two servers: jax's real profiler server in this process (CPU: its native session holds the
profiler but records nothing), and a stand-in gRPC ProfilerService (tests/sdk/
profiler_standin.py) whose buffer is a real trace, for what only a TPU would record.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from mldiag.capture import remote, targets
from mldiag.messages import CaptureProfile, ContinuousProfiling
from mldiag.model import ControlRequest, TargetRecord
from mldiag.sdk import machinelearning_run
from mldiag.sdk.continuous import NoWindows, RingBuffer, missing_levels
from mldiag.sdk.pull import Puller
from mldiag.sdk.xspace import parse_xspace
from tests.helpers.net import free_port
from tests.sdk.profiler_standin import StandInProfiler

LEVELS = {"host_tracer_level": 2, "device_tracer_level": 1, "python_tracer_level": 0}


@pytest.fixture(scope="module")
def xspace() -> bytes:
    """A real CPU trace: what the stand-in's buffer holds."""
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            jax.block_until_ready(jnp.ones((64, 64)) @ jnp.ones((64, 64)))
        (found,) = Path(tmp).glob("plugins/profile/*/*.xplane.pb")
        return found.read_bytes()


@pytest.fixture
def standin(xspace: bytes) -> Iterator[StandInProfiler]:
    server = StandInProfiler(buffer=xspace).start()
    yield server
    server.stop()


def _planes(data: bytes) -> list[tuple[str, int]]:
    """The planes of an XSpace and their event counts (xprof's client re-serializes it)."""
    space = parse_xspace(data)
    return sorted((p.name, sum(len(line.events) for line in p.lines)) for p in space.planes)


def _push_target(server: StandInProfiler, platform: str = "cpu") -> TargetRecord:
    return TargetRecord(run="r", host="tpu-0", port=server.port, address="127.0.0.1",
                        platform=platform, last_heartbeat=time.time())


# The push path against the stand-in: the code that runs for a TPU workload.


def test_native_session_is_found_and_read_through_xprofs_own_client(
        standin: StandInProfiler, xspace: bytes) -> None:
    assert remote.native_running(standin.address)
    with pytest.raises(remote.NativeAlreadyRunning, match="already runs"):
        remote.native_start(standin.address)
    assert _planes(remote.native_snapshot(standin.address)) == _planes(xspace)
    remote.native_stop(standin.address)
    assert not remote.native_running(standin.address)
    # The probe of a free profiler started a session and stopped it again.
    assert standin.calls[-2:] == ["Start", "Stop"] and not standin.native
    with pytest.raises(remote.NativeOff):
        remote.native_snapshot(standin.address)


@pytest.mark.parametrize("platform", ["tpu", "cpu"])
def test_continuous_start_on_a_native_target_adopts_it(standin: StandInProfiler,
                                                       platform: str) -> None:
    state = targets.set_continuous(_push_target(standin, platform),
                                   ContinuousProfiling(run="r", action="start"))
    assert state == "NATIVE"
    assert standin.native  # the workload's session runs on, untouched
    assert "GetSnapshot" not in standin.calls


def test_snapshot_and_on_demand_of_an_unregistered_native_session_read_its_buffer(
        standin: StandInProfiler, xspace: bytes) -> None:
    target = _push_target(standin)  # continuous OFF: nobody told mldiag
    snap = CaptureProfile(run="r", session="s", capture="snapshot")
    assert _planes(targets.capture(target, snap, time.time())) == _planes(xspace)
    od = CaptureProfile(run="r", session="o", capture="on_demand", duration_s=0.5)
    started = time.time()
    assert _planes(targets.capture(target, od, started)) == _planes(xspace)
    assert time.time() - started >= 0.5  # read once the interval was over, not refused
    deep = CaptureProfile(run="r", session="p", capture="on_demand", duration_s=0.5,
                          python_tracer_level=1)
    with pytest.raises(remote.CaptureFailed, match="on-demand sessions can't be captured "
                       "while continuous profiling is active.*python_tracer_level=1"):
        targets.capture(target, deep, time.time())
    standin.native = False
    with pytest.raises(remote.CaptureFailed, match="continuous profiling is off"):
        targets.capture(target, snap, time.time())


# The SDK (pull) path with jax's real server on CPU.


@pytest.fixture
def native_run(sdk_home: Path) -> Iterator[tuple[object, str]]:
    from xprof.api import continuous_profiling_snapshot

    port = free_port()
    run = machinelearning_run(name="native", on_demand_xprof=True, port=port,
                              heartbeat_s=1.0)
    address = f"localhost:{port}"
    # What the workload does, as the product's docs show it.
    continuous_profiling_snapshot.start_continuous_profiling(address, {})
    yield run, address
    try:
        continuous_profiling_snapshot.stop_continuous_profiling(address)
    except RuntimeError:
        pass  # stopped by the test
    run.close()


def test_sdk_adopts_the_workloads_native_session_and_names_it_in_the_ring(
        native_run: tuple[object, str], sdk_state: object) -> None:
    from mldiag.sdk.run import MLRun

    run, address = native_run
    assert isinstance(run, MLRun)
    run.start_continuous(window_s=0.5)
    (target,) = sdk_state.list_targets("native")  # type: ignore[attr-defined]
    assert target.continuous == "NATIVE" and target.last_error == ""
    assert run.ring is not None and not run.ring.active  # no second session fighting for it

    # A ring started anyway waits, and says who holds the profiler (not a timing message).
    ring = RingBuffer()
    ring.holder = run._profiler_holder
    ring.start(window_s=0.5)
    try:
        deadline = time.monotonic() + 10
        while ring.held_by is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ring.held_by is not None and "native continuous profiling" in ring.held_by
        with pytest.raises(NoWindows, match="profiler is held by xprof's native continuous "
                           "profiling"):
            ring.snapshot()
        assert "no complete window yet" not in ring.status()["reason"]
    finally:
        ring.stop()

    # A pulled snapshot reads xprof's buffer; on CPU it is empty, and the reason says so.
    puller = Puller(run, 0.1)
    request = ControlRequest(id="q1", run="native", host=run.host, action="snapshot",
                             session="snap", created_at=time.time(), expires_at=time.time() + 60,
                             start_at=time.time())
    puller._serve(request)
    s = sdk_state.get_session("native", "snap")  # type: ignore[attr-defined]
    assert "answered with no trace (it records device traces on TPU only" in s.hosts[
        run.host].reason

    run.stop_continuous()
    assert not remote.native_running(address.replace("localhost", "127.0.0.1"))


def test_on_demand_while_the_native_session_holds_the_profiler_does_not_wait_out_its_time(
        native_run: tuple[object, str], sdk_state: object) -> None:
    from mldiag.sdk.run import MLRun

    run, _ = native_run
    assert isinstance(run, MLRun)
    puller = Puller(run, 0.1)
    now = time.time()
    request = ControlRequest(id="q2", run="native", host=run.host, action="on_demand",
                             session="od", created_at=now, expires_at=now + 300, start_at=now,
                             duration_s=0.5, wait_s=120.0, options=dict(LEVELS))
    puller._serve(request)
    assert time.time() - now < 30  # not the 120 s wait for a busy profiler
    s = sdk_state.get_session("native", "od")  # type: ignore[attr-defined]
    assert "TPU only" in s.hosts[run.host].reason


# Tracer levels of captures served from the SDK's ring.


def test_missing_levels_names_what_a_continuous_trace_lacks() -> None:
    assert missing_levels(LEVELS, LEVELS) == ""
    assert missing_levels({"python_tracer_level": 0}, {"python_tracer_level": 1,
                                                        "host_tracer_level": 2}) == ""
    assert missing_levels({"python_tracer_level": 1}, {"python_tracer_level": 0}) == (
        "python_tracer_level=1 (recorded: 0)")
    assert missing_levels(LEVELS, None) == ""
    assert missing_levels({**LEVELS, "host_tracer_level": 3}, None) == (
        "host_tracer_level=3 (its levels are unknown)")


def test_on_demand_asking_for_levels_the_ring_does_not_record_is_refused(
        sdk_home: Path, sdk_state: object) -> None:
    run = machinelearning_run(name="levels", heartbeat_s=1.0)
    run.start_continuous(window_s=0.5)
    puller = Puller(run, 0.1)
    now = time.time()
    request = ControlRequest(id="q3", run="levels", host=run.host, action="on_demand",
                             session="py", created_at=now, expires_at=now + 60, start_at=now,
                             duration_s=0.5, wait_s=5.0,
                             options={**LEVELS, "python_tracer_level": 1})
    puller._serve(request)
    s = sdk_state.get_session("levels", "py")  # type: ignore[attr-defined]
    reason = s.hosts[run.host].reason
    assert "on-demand sessions can't be captured while continuous profiling is active" in reason
    assert "python_tracer_level=1 (recorded: 0)" in reason
    # What the ring records is served.
    request = ControlRequest(id="q4", run="levels", host=run.host, action="on_demand",
                             session="plain", created_at=now, expires_at=now + 60,
                             start_at=time.time(), duration_s=0.5, wait_s=5.0,
                             options=dict(LEVELS))
    puller._serve(request)
    (uploaded,) = run.wait_uploads(timeout=60)
    assert uploaded.endswith("plugins/profile/plain/h0.xplane.pb")
