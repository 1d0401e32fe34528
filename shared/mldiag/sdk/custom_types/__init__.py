"""Types of the SDK, as in `google_cloud_mldiagnostics.custom_types`: `exceptions`,
`metric_types` and `mlrun_types`."""

from mldiag.sdk.custom_types import exceptions, metric_types, mlrun_types

__all__ = ["exceptions", "metric_types", "mlrun_types"]
