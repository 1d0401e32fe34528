"""`google_cloud_mldiagnostics.api.metrics`: `record`, `record_metrics` (mldiag.sdk.metrics)."""

from mldiag.sdk.metrics import record, record_metrics

__all__ = ["record", "record_metrics"]
