"""`google_cloud_mldiagnostics.api.mlrun`: where upstream defines `machinelearning_run`.

The same function as `mldiag.sdk.machinelearning_run`, for code that imports it from here.
"""

from mldiag.sdk.run import MLRun, current_run, machinelearning_run

__all__ = ["MLRun", "current_run", "machinelearning_run"]
