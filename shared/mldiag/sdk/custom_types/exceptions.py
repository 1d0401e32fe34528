"""The SDK's exceptions, with the names and bases of `google_cloud_mldiagnostics`'s.

Each is also an `MldiagError`, so the `mldiag` CLI and tools report it as one line.
"""

from __future__ import annotations

from mldiag.errors import MldiagError


class MLDiagnosticError(MldiagError):
    """Base exception for ML Diagnostic SDK."""


class MLRunConfigurationError(MldiagError, ValueError):
    """A bad argument to `machinelearning_run` (name, environment, region, ...)."""


class RecordingError(MldiagError, ValueError):
    """Recording metrics failed."""


class NoActiveRunError(MldiagError):
    """No active ML run: call `machinelearning_run(...)` first."""


class ProfilingError(MldiagError):
    """Profiling cannot run (no active run, profiler not initialised)."""


class ControlPlaneClientNotInitializedError(MldiagError):
    """The control plane client is not initialized."""
