"""`google_cloud_mldiagnostics.api`'s layout: `api.mlrun.machinelearning_run`, `api.metrics`."""

from mldiag.sdk.api import metrics, mlrun

machinelearning_run = mlrun.machinelearning_run

__all__ = ["machinelearning_run", "metrics", "mlrun"]
