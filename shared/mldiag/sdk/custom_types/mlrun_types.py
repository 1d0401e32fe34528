"""Run types, as in `google_cloud_mldiagnostics.custom_types.mlrun_types`: the enums of
`machinelearning_run`'s arguments and `ConfigDict`. (`MLRun` itself is `mldiag.sdk.MLRun`.)"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any


class RunPhase(enum.Enum):
    """Where a run is in its life."""

    PHASE_UNSPECIFIED = "RUN_PHASE_UNSPECIFIED"
    PHASE_ACTIVE = "ACTIVE"
    PHASE_COMPLETED = "COMPLETED"
    PHASE_FAILED = "FAILED"


class Framework(enum.Enum):
    """The workload's ML framework (mldiag profiles JAX)."""

    JAX = "JAX"
    PYTORCH = "PYTORCH"


class ServingEngine(enum.Enum):
    """The serving engine of an inference workload."""

    NONE = "NONE"
    VLLM = "VLLM"


class AcceleratorOrchestrator(enum.Enum):
    """Who orchestrates the accelerators."""

    NONE = "NONE"
    PATHWAYS = "PATHWAYS"


class ApplicationFramework(enum.Enum):
    """The application framework on top of the ML framework."""

    NONE = "NONE"
    MAXTEXT = "MAXTEXT"
    AXLEARN = "AXLEARN"
    MAXDIFFUSION = "MAXDIFFUSION"


class RlOrchestrator(enum.Enum):
    """The RL orchestrator."""

    NONE = "NONE"
    TUNIX = "TUNIX"


class Orchestrator(enum.StrEnum):
    """The workload orchestrator, detected from the environment."""

    GKE = "GKE"
    SLURM = "SLURM"
    CUSTOM = "CUSTOM"
    NONE = "NONE"


class ConfigDict(dict[str, Any]):
    """A dict whose keys are also attributes: `run.configs.batch_size = 64`.

    Every change (item or attribute assignment, deletion, `update`, ...) is saved to the run's
    record, so `mldiag runs describe` and the console show it.
    """

    def __init__(self, *args: Any, on_change: Callable[[ConfigDict], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "_on_change", on_change)

    def _changed(self) -> None:
        callback = self.__dict__.get("_on_change")
        if callback is not None:
            callback(self)

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(
                f"'{type(self).__name__}' object has no attribute '{name}'") from exc

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError as exc:
            raise AttributeError(
                f"'{type(self).__name__}' object has no attribute '{name}'") from exc

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self._changed()

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._changed()

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self._changed()

    def setdefault(self, key: str, default: Any = None) -> Any:
        had = key in self
        value = super().setdefault(key, default)
        if not had:
            self._changed()
        return value

    def pop(self, key: str, *default: Any) -> Any:
        had = key in self
        value = super().pop(key, *default)
        if had:
            self._changed()
        return value

    def popitem(self) -> tuple[str, Any]:
        item = super().popitem()
        self._changed()
        return item

    def clear(self) -> None:
        super().clear()
        self._changed()

    def __ior__(self, other: Any) -> ConfigDict:  # type: ignore[override,misc]
        self.update(other)
        return self

    def __reduce__(self) -> Any:
        # Pickles and copies as a plain ConfigDict, without the run's callback.
        return (ConfigDict, (dict(self),))
