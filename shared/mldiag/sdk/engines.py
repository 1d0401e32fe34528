"""Profiler engines: what `xprof()` and `on_demand_xprof` drive in each framework.

- `jax`, for `Framework.JAX` (the default): `jax.profiler.start_trace`, and the server
  `jax.profiler.start_server`; pull delivery (the SDK takes its own requests).
- `torch_tpu`, for `Framework.PYTORCH` where `torch_tpu` imports (TorchTPU, TPU only):
  `torch.profiler.profile` with `torch.tpu.profiler.TpuProfilerConfig`, and the server
  `torch_tpu._internal.profiler.start_server`; push delivery.
- `torch_xla`, for `Framework.PYTORCH` where `torch_xla` imports (PyTorch/XLA, any XLA
  device): `torch_xla.debug.profiler.start_trace`, and the server
  `torch_xla.debug.profiler.start_server`; push delivery.

`MLDIAG_PROFILER_ENGINE=jax|torch_xla|torch_tpu` overrides the choice. The torch engines reach
the SDK's pull machinery (a JAX profiler in-process) not at all: their targets are plain
profiler servers that the capture stage connects to (push), as `mldiag profiler-target create`
registers any other server. Every engine writes the standard logdir
(`<logdir>/plugins/profile/<session>/<host>.xplane.pb`); `trace_file` finds the xplane in it.

Nothing is imported here until an engine is used: torch and jax stay out of processes that
do not profile with them.
"""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path
from typing import Any, Protocol

from mldiag.sdk.custom_types.exceptions import MLRunConfigurationError
from mldiag.sdk.custom_types.mlrun_types import Framework

log = logging.getLogger(__name__)

ENGINE_ENV = "MLDIAG_PROFILER_ENGINE"


class ProfilerEngine(Protocol):
    """One framework's profiler, as the SDK drives it."""

    name: str
    framework: str  # the target's `framework` field
    pulls: bool  # the SDK takes this target's capture requests itself

    def version(self) -> str: ...
    def process_index(self) -> int: ...
    def process_count(self) -> int:
        """Processes of the job this one belongs to (1 outside a multi-process job)."""
        ...

    def platform(self) -> str: ...
    def start_trace(self, logdir: Path) -> None: ...
    def stop_trace(self) -> None: ...
    def start_server(self, port: int) -> Any:
        """Start the on-demand server; returns a handle (never None) for `stop_server`."""
        ...

    def stop_server(self, server: Any) -> None: ...


def _torch_world_size() -> int:
    """The job's process count as torchrun sets it (1 when it did not)."""
    raw = os.environ.get("WORLD_SIZE", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


def _torch_rank() -> int | None:
    """The process's rank as torchrun and torch.distributed set it, if they did."""
    for key in ("RANK", "PROCESS_INDEX"):
        raw = os.environ.get(key)
        if raw and raw.isdigit():
            return int(raw)
    return None


class JaxEngine:
    """JAX's profiler (also what Tunix and vLLM's TPU worker use)."""

    name = "jax"
    framework = "jax"
    pulls = True

    def version(self) -> str:
        import jax

        return jax.__version__

    def process_index(self) -> int:
        import jax

        return int(jax.process_index())

    def process_count(self) -> int:
        import jax

        return int(jax.process_count())

    def platform(self) -> str:
        import jax

        return str(jax.devices()[0].platform)

    def start_trace(self, logdir: Path) -> None:
        import jax

        jax.profiler.start_trace(str(logdir))

    def stop_trace(self) -> None:
        import jax

        jax.profiler.stop_trace()

    def start_server(self, port: int) -> Any:
        import jax

        return jax.profiler.start_server(port)

    def stop_server(self, server: Any) -> None:
        import jax

        jax.profiler.stop_server()


class TorchXlaEngine:
    """PyTorch/XLA's profiler (`torch_xla.debug.profiler`), on any XLA device (CPU, TPU, GPU)."""

    name = "torch_xla"
    framework = "pytorch"
    pulls = False

    def version(self) -> str:
        import torch
        import torch_xla

        return f"{torch.__version__} (torch_xla {torch_xla.__version__})"

    def process_index(self) -> int:
        rank = _torch_rank()
        if rank is not None:
            return rank
        import torch_xla.runtime as xr

        return int(xr.process_index())

    def process_count(self) -> int:
        return _torch_world_size()

    def platform(self) -> str:
        import torch_xla.runtime as xr

        kind = str(xr.device_type() or "").lower()
        return {"cuda": "gpu"}.get(kind, kind)

    def start_trace(self, logdir: Path) -> None:
        import torch_xla.debug.profiler as xp

        xp.start_trace(str(logdir))

    def stop_trace(self) -> None:
        import torch_xla.debug.profiler as xp

        xp.stop_trace()

    def start_server(self, port: int) -> Any:
        import torch_xla.debug.profiler as xp

        # The returned object is the server: it stops when garbage collected, so the run
        # keeps it (`MLRun.profiler_server`).
        return xp.start_server(port)

    def stop_server(self, server: Any) -> None:
        # torch_xla has no stop call: dropping the last reference stops the server.
        del server


class TorchTpuEngine:
    """TorchTPU's profiler: `torch.profiler.profile` with a `TpuProfilerConfig`, which writes
    an xplane (TPU only; torch_tpu needs libtpu)."""

    name = "torch_tpu"
    framework = "pytorch"
    pulls = False

    def __init__(self) -> None:
        self._profile: Any = None

    def version(self) -> str:
        import torch
        import torch_tpu

        return f"{torch.__version__} (torch_tpu {getattr(torch_tpu, '__version__', '?')})"

    def process_index(self) -> int:
        rank = _torch_rank()
        return 0 if rank is None else rank

    def process_count(self) -> int:
        return _torch_world_size()

    def platform(self) -> str:
        return "tpu"

    def start_trace(self, logdir: Path) -> None:
        import torch
        from torch.tpu.profiler import TpuProfilerConfig

        config = TpuProfilerConfig(host_tracer_level=2, device_tracer_level=1,
                                   run_dir=str(logdir), worker_rank=str(self.process_index()))
        activities = [torch.profiler.ProfilerActivity.CPU,
                      torch.profiler.ProfilerActivity.PrivateUse1]
        profile = torch.profiler.profile(activities=activities, experimental_config=config)
        profile.start()
        self._profile = profile

    def stop_trace(self) -> None:
        profile, self._profile = self._profile, None
        if profile is None:
            raise RuntimeError("no TorchTPU trace is running")
        profile.stop()

    def start_server(self, port: int) -> Any:
        from torch_tpu._internal.profiler import start_server

        start_server(port)
        return self  # the handle the run keeps: torch_tpu stops its one server by a call

    def stop_server(self, server: Any) -> None:
        from torch_tpu._internal.profiler import stop_server

        stop_server()


ENGINES: dict[str, type[JaxEngine] | type[TorchXlaEngine] | type[TorchTpuEngine]] = {
    "jax": JaxEngine, "torch_tpu": TorchTpuEngine, "torch_xla": TorchXlaEngine}


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def select(framework: Framework | None, *, profiling: bool = True) -> ProfilerEngine:
    """The engine for a run of `framework`: JAX unless PYTORCH; for PYTORCH, TorchTPU where
    `torch_tpu` imports, else PyTorch/XLA where `torch_xla` imports.

    `$MLDIAG_PROFILER_ENGINE` names one instead. A PYTORCH run with neither package raises
    MLRunConfigurationError when it profiles (`profiling`); a run that profiles nothing
    (`metric_only_run`, the vLLM wrapper) gets the JAX engine for its process index."""
    forced = os.environ.get(ENGINE_ENV, "").strip().lower()
    if forced:
        if forced not in ENGINES:
            raise MLRunConfigurationError(
                f"{ENGINE_ENV}={forced!r}: use one of {', '.join(sorted(ENGINES))}")
        return ENGINES[forced]()
    if framework is not Framework.PYTORCH:
        return JaxEngine()
    if _importable("torch_tpu"):
        return TorchTpuEngine()
    if _importable("torch_xla"):
        return TorchXlaEngine()
    if not profiling:
        return JaxEngine()
    raise MLRunConfigurationError(
        "framework=PYTORCH profiles with torch_xla (PyTorch/XLA) or torch_tpu (TorchTPU), "
        "and neither imports in this environment: install one, or set "
        f"{ENGINE_ENV}=jax for a JAX profiler")


def trace_file(logdir: Path) -> Path | None:
    """The newest xplane an engine wrote under `logdir` (the standard layout first)."""
    found = sorted(logdir.glob("plugins/profile/*/*.xplane.pb")) or sorted(
        logdir.rglob("*.xplane.pb"))
    return found[-1] if found else None
