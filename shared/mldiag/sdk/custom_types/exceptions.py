"""The SDK's exceptions, with the names and bases of `google_cloud_mldiagnostics`'s.

Each is also an `MldiagError`, so the `mldiag` CLI and tools report it as one line. All are
permanent: the same call fails again.
"""

from __future__ import annotations

from mldiag.errors import MldiagError


class MLDiagnosticError(MldiagError):
    """Base exception for ML Diagnostic SDK; each subclass says whether it is transient."""


class MLRunConfigurationError(MldiagError, ValueError):
    """A bad argument to `machinelearning_run` (name, environment, region, ...). Permanent."""


class RecordingError(MldiagError, ValueError):
    """Recording metrics failed. Permanent."""


class NoActiveRunError(MldiagError):
    """No active ML run: call `machinelearning_run(...)` first. Permanent until then."""


class ProfilingError(MldiagError):
    """Profiling cannot run (no active run, profiler not initialised). Permanent."""


class ControlPlaneClientNotInitializedError(MldiagError):
    """The control plane client is not initialized. Permanent."""
