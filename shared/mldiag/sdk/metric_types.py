"""Metric names, as in `google_cloud_mldiagnostics.metric_types`."""

from __future__ import annotations

import enum


class MetricType(enum.Enum):
    """Predefined metrics. STEP_TIME (seconds) feeds mldiag's degradation monitor."""

    LEARNING_RATE = "learning_rate"
    LOSS = "loss"
    GRADIENT_NORM = "gradient_norm"
    TOTAL_WEIGHTS = "total_weights"
    STEP_TIME = "step_time"
    THROUGHPUT = "throughput"
    LATENCY = "latency"
    MFU = "mfu"
    TFLOPS = "tflops"
    STEP = "step"
