"""`python -m mldiag.sdk.commands.run_vllm`: vLLM under a run, with a stand-in for vLLM's TPU
worker (tests/sdk/vllm_standin.py) that starts a JAX profiler server and writes a phased trace
directory, as tpu-inference's worker does with the variables the wrapper sets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mldiag.bootstrap import LocalRuntime, bootstrap
from mldiag.cli.main import main as cli_main
from mldiag.model import PUSH, REPORTED, SessionRecord
from mldiag.sdk.commands.run_vllm import _torch_profiler_dir
from mldiag.settings import Settings
from tests.helpers.net import free_port
from tests.helpers.pipeline import FAST
from tests.helpers.pipeline import finished as finished_in
from tests.helpers.wait import wait_until

STANDIN = Path(__file__).with_name("vllm_standin.py")
RUN = "vllm-run"


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[LocalRuntime]:
    rt = bootstrap(Settings(home=tmp_path / "home", **FAST))
    rt.start()
    yield rt
    rt.stop()


def finished(runtime: LocalRuntime, session: str) -> SessionRecord:
    return finished_in(runtime, RUN, session)


def test_vllms_profiler_server_is_a_push_target_and_its_phases_land_in_the_run(
        runtime: LocalRuntime, tmp_path: Path) -> None:
    home = runtime.services.settings.home
    port, stop = free_port(), tmp_path / "stop"
    env = {**os.environ, "MLDIAG_HOME": str(home), "MLDIAG_HOST_NAME": "node0",
           "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("PHASED_PROFILING_DIR", None)
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "mldiag.sdk.commands.run_vllm", "--mlrun_name", RUN,
         "--jax_profiler_port", str(port), "--phased_profiling_dir", str(tmp_path / "phased"),
         "--target_platform", "cpu", "--configs", '{"model": "tiny"}',
         "--vllm_command", f"{sys.executable} {STANDIN} --stop-file {stop}",
         "serve", "Qwen/Qwen2-1.5B", "--port=8000"], env=env, start_new_session=True)
    try:
        # The worker's server is the run's push target, live once it accepts connections.
        target = wait_until(lambda: next(
            (t for t in runtime.state.list_targets(RUN) if t.last_heartbeat > 0), None),
            what="a live vllm target", timeout=120, interval=0.1)
        assert (target.host, target.port, target.delivery, target.framework) == (
            "node0-vllm", port, PUSH, "vllm")
        assert target.pid != wrapper.pid  # the server's process: vLLM, not the wrapper
        assert runtime.state.get_run(RUN).configs == {"model": "tiny"}
        # The phase vLLM traced is a session of the run, analysed like any other.
        phased = wait_until(lambda: [
            s for s in runtime.state.list_sessions(RUN) if s.session.startswith("decode_heavy-")],
            what="the phased session", timeout=120, interval=0.1)
        s = finished(runtime, phased[0].session)
        assert s.state == REPORTED, s.reason
        assert s.kind == "programmatic" and list(s.hosts.values())[0].status == "ARRIVED"
        # An on-demand capture reaches the server by push, from the CLI.
        assert cli_main(["capture", "od1", "--run", RUN, "--duration", "1s",
                         "--home", str(home)]) == 0
        s = finished(runtime, "od1")
        assert s.state == REPORTED and s.hosts["node0-vllm"].status == "ARRIVED"
        stop.touch()
        assert wrapper.wait(timeout=60) == 0
        # vLLM is gone: its target is down, so no capture waits on it.
        (gone,) = runtime.state.list_targets(RUN)
        assert gone.last_heartbeat == 0.0
    finally:
        if wrapper.poll() is None:
            os.killpg(wrapper.pid, signal.SIGKILL)
            wrapper.wait()


def test_the_torch_profiler_directory_flag_is_pointed_at_the_staging_directory() -> None:
    args, found = _torch_profiler_dir(
        ["serve", "m", "--profiler-config.torch_profiler_dir=gs://b/p", "--port=8000"], "/s")
    assert (args, found) == (
        ["serve", "m", "--profiler-config.torch_profiler_dir=/s", "--port=8000"], "gs://b/p")
    args, found = _torch_profiler_dir(
        ["serve", "--profiler-config", '{"profiler": "torch", "torch_profiler_dir": "/x"}'],
        "/s")
    assert found == "/x"
    assert args == ["serve", '--profiler-config={"profiler": "torch", "torch_profiler_dir": '
                             '"/s"}']
    # Without the directory the arguments go to vLLM as they were.
    assert _torch_profiler_dir(["serve", "m", "--", "--x"], "/s") == (
        ["serve", "m", "--", "--x"], None)
