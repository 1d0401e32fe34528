"""Metric names and units, as in `google_cloud_mldiagnostics.metric_types`."""

from __future__ import annotations

import enum


class MetricType(enum.Enum):
    """Predefined metrics. STEP_TIME (seconds) also feeds mldiag's degradation monitor."""

    # Model quality
    LEARNING_RATE = "learning_rate"
    LOSS = "loss"
    GRADIENT_NORM = "gradient_norm"
    TOTAL_WEIGHTS = "total_weights"

    # Model performance
    STEP_TIME = "step_time"
    THROUGHPUT = "throughput"
    LATENCY = "latency"
    MFU = "mfu"
    TFLOPS = "tflops"

    # System utilization (recorded only with `log_system_metrics=True`)
    TPU_DUTY_CYCLE = "tpu_duty_cycle"
    TPU_TENSORCORE_UTILIZATION = "tpu_tensorcore_utilization"
    HBM_UTILIZATION = "hbm_utilization"
    GPU_DUTY_CYCLE = "gpu_duty_cycle"
    GPU_UTILIZATION = "gpu_utilization"
    GPU_TENSORCORE_UTILIZATION = "gpu_tensorcore_utilization"
    VRAM_UTILIZATION = "vram_utilization"
    HOST_CPU_UTILIZATION = "host_cpu_utilization"
    HOST_MEMORY_UTILIZATION = "host_memory_utilization"

    # The step itself, when it is recorded on its own
    STEP = "step"


# The unit label each metric is stored with; other names get "1".
METRIC_UNITS: dict[str, str] = {
    MetricType.LEARNING_RATE.value: "1",
    MetricType.LOSS.value: "1",
    MetricType.GRADIENT_NORM.value: "1",
    MetricType.TOTAL_WEIGHTS.value: "1",
    MetricType.STEP_TIME.value: "s",
    MetricType.THROUGHPUT.value: "1/s",
    MetricType.LATENCY.value: "s",
    MetricType.MFU.value: "%",
    MetricType.TFLOPS.value: "TFLOPS",
    MetricType.TPU_DUTY_CYCLE.value: "%",
    MetricType.TPU_TENSORCORE_UTILIZATION.value: "%",
    MetricType.HBM_UTILIZATION.value: "%",
    MetricType.GPU_DUTY_CYCLE.value: "%",
    MetricType.GPU_UTILIZATION.value: "%",
    MetricType.GPU_TENSORCORE_UTILIZATION.value: "%",
    MetricType.VRAM_UTILIZATION.value: "%",
    MetricType.HOST_CPU_UTILIZATION.value: "%",
    MetricType.HOST_MEMORY_UTILIZATION.value: "%",
    MetricType.STEP.value: "1",
}

# Metrics dropped unless the run was created with log_system_metrics=True (as upstream).
SYSTEM_METRICS = frozenset({
    MetricType.TPU_DUTY_CYCLE.value, MetricType.TPU_TENSORCORE_UTILIZATION.value,
    MetricType.HBM_UTILIZATION.value, MetricType.GPU_DUTY_CYCLE.value,
    MetricType.GPU_UTILIZATION.value, MetricType.GPU_TENSORCORE_UTILIZATION.value,
    MetricType.VRAM_UTILIZATION.value, MetricType.HOST_CPU_UTILIZATION.value,
    MetricType.HOST_MEMORY_UTILIZATION.value,
})


class AcceleratorType(enum.Enum):
    """An accelerator type."""

    TPU = "tpu"
    GPU = "gpu"
    CPU = "cpu"
    UNKNOWN = "unknown"
