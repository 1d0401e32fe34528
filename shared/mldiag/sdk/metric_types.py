"""Metric names and units, as in `google_cloud_mldiagnostics.metric_types`."""

from mldiag.sdk.custom_types.metric_types import (
    METRIC_UNITS,
    SYSTEM_METRICS,
    AcceleratorType,
    MetricType,
)

__all__ = ["METRIC_UNITS", "SYSTEM_METRICS", "AcceleratorType", "MetricType"]
