"""Captures that meet a busy profiler, with a real JAX process (an SDK target, which runs
its pulled captures itself): a second capture waits its turn, a profiler held by the workload
itself is named as such, never "unreachable"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from mldiag.bootstrap import LocalRuntime, bootstrap
from mldiag.messages import CaptureProfile
from mldiag.model import FAILED, HostRecord
from mldiag.settings import Settings
from tests.helpers.net import free_port
from tests.helpers.pipeline import FAST
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow
WORKLOAD = Path(__file__).with_name("sdk_workload.py")
RUN = "train"


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[LocalRuntime]:
    rt = bootstrap(Settings(home=tmp_path / "home", prebuild_viewer=False, capture_wait_s=1.0,
                            **FAST))
    rt.start()
    yield rt
    rt.stop()


@pytest.fixture
def busy_workload(runtime: LocalRuntime) -> Iterator[subprocess.Popen[bytes]]:
    """One target whose own trace holds its profiler for its first 8 seconds."""
    env = {**os.environ, "MLDIAG_HOME": str(runtime.services.settings.home),
           "MLDIAG_HOST_NAME": "w0", "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.Popen([sys.executable, str(WORKLOAD), "--run", RUN, "--port",
                             str(free_port()), "--busy", "8"], env=env, start_new_session=True)
    wait_until(lambda: any(t.pid == proc.pid for t in runtime.state.list_targets(RUN)),
               what="target w0", timeout=120, interval=0.1)
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def host_of(runtime: LocalRuntime, session: str) -> HostRecord:
    return wait_until(lambda: (
        s.hosts.get("w0") if (s := runtime.state.get_session(RUN, session)) else None),
        what=f"{session}'s host", timeout=120, interval=0.1)


def test_a_busy_profiler_is_named_and_captures_wait_their_turn(
        runtime: LocalRuntime, busy_workload: subprocess.Popen[bytes]) -> None:
    bus = runtime.services.bus
    # The workload's own trace holds the profiler, and this capture waits 1 s at most.
    bus.publish(CaptureProfile(run=RUN, session="busy", duration_s=0.5))
    host = host_of(runtime, "busy")
    assert host.status == "FAILED"
    # The SDK tried its own profiler for the request's 1 s and says who holds it.
    assert "another profiling session is active on w0" in host.reason
    assert "Only one profile may be run at a time" in host.reason
    assert "unreachable" not in host.reason and "no answer" not in host.reason
    s = runtime.state.get_session(RUN, "busy")
    assert s is not None and s.state == FAILED
    # Waiting long enough, a capture gets the profiler once the workload lets it go.
    runtime.services.settings = replace(runtime.services.settings, capture_wait_s=60.0)
    started = time.monotonic()
    bus.publish(CaptureProfile(run=RUN, session="waited", duration_s=0.5))
    assert host_of(runtime, "waited").status == "ARRIVED"
    # Two captures at once on one target: the second waits for the first, both arrive.
    bus.publish(CaptureProfile(run=RUN, session="first", duration_s=1.0))
    bus.publish(CaptureProfile(run=RUN, session="second", duration_s=1.0))
    first, second = host_of(runtime, "first"), host_of(runtime, "second")
    assert (first.status, second.status) == ("ARRIVED", "ARRIVED"), (first.reason,
                                                                     second.reason)
    assert abs(second.arrived_at - first.arrived_at) >= 0.9  # one after the other
    assert time.monotonic() - started < 60
