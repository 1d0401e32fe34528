"""Profiler engine selection and the torch engines' calls, without torch: stand-in modules for
torch, torch_xla and torch_tpu in sys.modules record what the SDK calls and write an xplane
where the real profilers write theirs."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from mldiag.adapters.local.state import SqliteStateStore
from mldiag.model import PUSH
from mldiag.sdk import engines, machinelearning_run, xprof
from mldiag.sdk.custom_types.exceptions import MLRunConfigurationError
from mldiag.sdk.custom_types.mlrun_types import Framework, ServingEngine
from mldiag.settings import Settings


def module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> types.ModuleType:
    m = types.ModuleType(name)
    for k, v in attrs.items():
        setattr(m, k, v)
    monkeypatch.setitem(sys.modules, name, m)
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        monkeypatch.setattr(sys.modules[parent], child, m, raising=False)
    return m


def absent(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError


def write_xplane(logdir: str, host: str = "fakehost") -> None:
    out = Path(logdir) / "plugins" / "profile" / "2026_01_01_00_00_00"
    out.mkdir(parents=True)
    (out / f"{host}.xplane.pb").write_bytes(b"xplane-of-" + host.encode())


@pytest.fixture
def calls() -> list[tuple[str, Any]]:
    return []


@pytest.fixture
def fake_torch_xla(monkeypatch: pytest.MonkeyPatch, calls: list[tuple[str, Any]]) -> None:
    state: dict[str, str] = {}

    def start_trace(logdir: str) -> None:
        calls.append(("start_trace", logdir))
        state["logdir"] = logdir

    def stop_trace() -> None:
        calls.append(("stop_trace", None))
        write_xplane(state.pop("logdir"), "xla-host")

    def start_server(port: int) -> object:
        calls.append(("start_server", port))
        return object()

    module(monkeypatch, "torch", __version__="2.9.0")
    module(monkeypatch, "torch_xla", __version__="2.9.0")
    module(monkeypatch, "torch_xla.runtime", process_index=lambda: 0,
           device_type=lambda: "CPU")
    module(monkeypatch, "torch_xla.debug")
    module(monkeypatch, "torch_xla.debug.profiler", start_trace=start_trace,
           stop_trace=stop_trace, start_server=start_server)


def test_jax_is_the_engine_unless_the_framework_is_pytorch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(engines.ENGINE_ENV, raising=False)
    assert engines.select(None).name == "jax"
    assert engines.select(Framework.JAX).name == "jax"


def test_pytorch_takes_torch_tpu_first_then_torch_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(engines.ENGINE_ENV, raising=False)
    module(monkeypatch, "torch_xla")
    absent(monkeypatch, "torch_tpu")
    assert engines.select(Framework.PYTORCH).name == "torch_xla"
    module(monkeypatch, "torch_tpu")
    assert engines.select(Framework.PYTORCH).name == "torch_tpu"
    monkeypatch.setenv(engines.ENGINE_ENV, "torch_xla")
    assert engines.select(Framework.PYTORCH).name == "torch_xla"
    monkeypatch.setenv(engines.ENGINE_ENV, "tensorflow")
    with pytest.raises(MLRunConfigurationError, match="jax, torch_tpu, torch_xla"):
        engines.select(Framework.PYTORCH)


def test_pytorch_without_torch_xla_or_torch_tpu_says_what_it_needs(
        monkeypatch: pytest.MonkeyPatch, sdk_home: Path) -> None:
    monkeypatch.delenv(engines.ENGINE_ENV, raising=False)
    absent(monkeypatch, "torch_xla", "torch_tpu")
    with pytest.raises(MLRunConfigurationError, match="torch_xla .* or torch_tpu"):
        machinelearning_run(name="r", framework=Framework.PYTORCH)
    # A run that profiles nothing (the vLLM wrapper's) needs neither.
    assert engines.select(Framework.PYTORCH, profiling=False).name == "jax"
    run = machinelearning_run(name="r", framework=Framework.PYTORCH, metric_only_run=True,
                              serving_engine=ServingEngine.VLLM)
    assert run.serving_engine is ServingEngine.VLLM and run.framework is Framework.PYTORCH


def test_a_pytorch_xla_run_profiles_through_torch_xla_and_is_a_push_target(
        monkeypatch: pytest.MonkeyPatch, sdk_home: Path, sdk_state: SqliteStateStore,
        fake_torch_xla: None, calls: list[tuple[str, Any]]) -> None:
    monkeypatch.delenv(engines.ENGINE_ENV, raising=False)
    absent(monkeypatch, "torch_tpu")
    run = machinelearning_run(name="xla-run", framework="pytorch", on_demand_xprof=True,
                              port=9123)
    assert calls == [("start_server", 9123)]
    (target,) = sdk_state.list_targets("xla-run")
    assert (target.delivery, target.framework, target.platform, target.port) == (
        PUSH, "pytorch", "cpu", 9123)
    assert "torch_xla 2.9.0" in target.framework_version
    assert run.puller is None  # nothing takes requests by pull: the capture stage connects
    with xprof(session_id="s1") as prof:
        pass
    assert [c[0] for c in calls] == ["start_server", "start_trace", "stop_trace"]
    name = prof.upload.result(timeout=30)
    assert name == "xla-run/plugins/profile/s1/h0.xplane.pb"
    assert (Settings(home=sdk_home).bucket_dir / name).read_bytes() == b"xplane-of-xla-host"
    with pytest.raises(MLRunConfigurationError, match="continuous profiling"):
        machinelearning_run(name="xla-run", framework=Framework.PYTORCH, continuous=True)


def test_torch_tpu_traces_with_a_tpu_profiler_config_for_this_rank(
        monkeypatch: pytest.MonkeyPatch, sdk_home: Path, calls: list[tuple[str, Any]]) -> None:
    monkeypatch.delenv(engines.ENGINE_ENV, raising=False)
    monkeypatch.setenv("RANK", "3")

    class Profile:
        def __init__(self, activities: list[str], experimental_config: dict[str, Any]) -> None:
            calls.append(("profile", (activities, experimental_config)))
            self.config = experimental_config

        def start(self) -> None:
            calls.append(("start", None))

        def stop(self) -> None:
            calls.append(("stop", None))
            write_xplane(self.config["run_dir"], "tpu-host")

    activity = types.SimpleNamespace(CPU="CPU", PrivateUse1="PrivateUse1")
    module(monkeypatch, "torch", __version__="2.9.0",
           profiler=types.SimpleNamespace(profile=Profile, ProfilerActivity=activity))
    module(monkeypatch, "torch.tpu")
    module(monkeypatch, "torch.tpu.profiler", TpuProfilerConfig=lambda **kw: kw)
    module(monkeypatch, "torch_tpu", __version__="0.2.0")
    module(monkeypatch, "torch_tpu._internal")
    module(monkeypatch, "torch_tpu._internal.profiler",
           start_server=lambda port: calls.append(("start_server", port)),
           stop_server=lambda: calls.append(("stop_server", None)))
    run = machinelearning_run(name="tpu-run", framework=Framework.PYTORCH,
                              on_demand_xprof=True, port=9124)
    assert (run.engine.name, run.target.platform, run.target.process_index) == (
        "torch_tpu", "tpu", 3)
    with xprof(session_id="s1") as prof:
        pass
    prof.upload.result(timeout=30)
    (activities, config), = [c[1] for c in calls if c[0] == "profile"]
    assert activities == ["CPU", "PrivateUse1"]
    assert (config["host_tracer_level"], config["device_tracer_level"],
            config["worker_rank"]) == (2, 1, "3")
    run.close()
    assert [c[0] for c in calls] == ["start_server", "profile", "start", "stop", "stop_server"]
