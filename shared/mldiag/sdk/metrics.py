"""`metrics.record(...)`: workload metrics of the active run.

Values are kept in memory per metric (the newest 10 000), and every STEP_TIME goes to the
run's degradation monitor, which raises an alert when step time degrades.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mldiag.sdk.metric_types import MetricType

_KEEP = 10_000


@dataclass(frozen=True)
class Sample:
    """One recorded value."""

    name: str
    value: float
    step: int | None
    at: float
    labels: Mapping[str, str] = field(default_factory=dict)


_lock = threading.Lock()
_series: dict[str, deque[Sample]] = {}
_steps: dict[str, int] = {}


def _name(metric: MetricType | str) -> str:
    name = metric.value if isinstance(metric, MetricType) else str(metric)
    if not name:
        raise ValueError("metric name must not be empty")
    return name


def record(metric_name: MetricType | str, value: int | float, step: int | None = None,
           labels: dict[str, str] | None = None, record_on_all_hosts: bool = False) -> None:
    """Record one value of a metric (STEP_TIME in seconds) for the active run."""
    record_metrics([{"metric_name": metric_name, "value": value, "step": step,
                     "labels": labels}], record_on_all_hosts=record_on_all_hosts)


def record_metrics(metrics_data: Sequence[Mapping[str, Any]], record_on_all_hosts: bool = False,
                   step: int | None = None) -> None:
    """Record several metrics: dicts with metric_name, value, and optional step and labels."""
    from mldiag.sdk.run import current_run

    now = time.time()
    samples = []
    for item in metrics_data:
        name = _name(item["metric_name"])
        value = item["value"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"metric {name}: value must be a number, got {value!r}")
        samples.append(Sample(name=name, value=float(value),
                              step=item.get("step", step), at=now,
                              labels=dict(item.get("labels") or {})))
    with _lock:
        for s in samples:
            if s.step is None:
                _steps[s.name] = _steps.get(s.name, -1) + 1
                s = Sample(s.name, s.value, _steps[s.name], s.at, s.labels)
            else:
                _steps[s.name] = s.step
            _series.setdefault(s.name, deque(maxlen=_KEEP)).append(s)
    run = current_run()
    if run is not None:
        for s in samples:
            if s.name == MetricType.STEP_TIME.value:
                run.observe_step_time(s.value, s.at)


def history(metric_name: MetricType | str) -> list[Sample]:
    """The recorded values of a metric, oldest first."""
    with _lock:
        return list(_series.get(_name(metric_name), ()))


def clear() -> None:
    """Forget every recorded value (a new run starts with none)."""
    with _lock:
        _series.clear()
        _steps.clear()
