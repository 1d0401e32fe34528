"""`metrics.record(...)`: workload metrics of the active run, kept in the run's state store.

Values are taken as `google_cloud_mldiagnostics` 1.0.10 takes them: a number, a list or tuple
of numbers (stored as their mean), None (dropped), a str or dict (stored as a log entry with
no value); anything else is dropped with a warning, never raised into the training loop. As
upstream, the process with index 0 stores them unless `record_on_all_hosts=True`, and the
system-utilization metrics are stored only for a run with `log_system_metrics=True`.

`record` only appends to a buffer (7-11 µs of the training thread's CPU; BENCHMARKS.md); a
background thread writes the buffer to the state store in one batch per `FLUSH_S` second (or
per `BATCH` points), and the run's `close()` (at exit too) writes what is left. Points
recorded before `machinelearning_run(...)` wait for it, as upstream's queue does. Every
STEP_TIME also goes to the run's degradation monitor.

A JAX array (a value, an element of a list, or a step) is not converted on the training
thread: `float()` of it waits for the device to compute it and copy it back, a sync that
stalls JAX's async dispatch once per record. `record` starts the copy to the host
(`copy_to_host_async`, which does not wait) and hands the array to the background thread,
which converts it; its point (and, for STEP_TIME, the monitor) follow from there.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mldiag.model import MetricPoint
from mldiag.sdk.current import current_run
from mldiag.sdk.metric_types import METRIC_UNITS, SYSTEM_METRICS, MetricType

if TYPE_CHECKING:
    from mldiag.messages import DegradationDetected
    from mldiag.sdk.monitor import Degradation

    # For the annotations only: `run` imports this module (a run flushes its metrics on
    # close), so importing it back at run time would be a circle. The current run comes
    # from the leaf `current`.
    from mldiag.sdk.run import MLRun

log = logging.getLogger(__name__)

_KEEP = 10_000  # in-memory history per metric (`history`)
MAX_PENDING = 100_000  # unwritten points kept while the store is unreachable
FLUSH_S = 1.0
BATCH = 1000
# The name under which the SDK's degradation monitor records its alerts with the metrics.
ALERT_METRIC = "mldiag_alert"
STEP_TIME = MetricType.STEP_TIME.value


@dataclass(frozen=True)
class Sample:
    """One recorded value (what `history` returns)."""

    name: str
    value: float
    step: int | None
    at: float
    labels: Mapping[str, str] = field(default_factory=dict)


def _name(metric: Any) -> str | None:
    if isinstance(metric, MetricType):
        return metric.value
    if isinstance(metric, str) and metric:
        return metric
    return None


def _number(name: str, value: Any) -> float | None:
    """Upstream's value rule: numbers as float, sequences as their mean, else None."""
    if isinstance(value, list | tuple):
        if not value:
            log.warning("mldiag: metric %r has an empty list value", name)
            return None
        try:
            mean = float(statistics.mean(value))
        except (statistics.StatisticsError, TypeError, ValueError):
            log.warning("mldiag: could not take the mean of metric %r: %.80r", name, value)
            return None
        return mean if math.isfinite(mean) else None
    if isinstance(value, int | float):
        number = float(value)
        if not math.isfinite(number):
            log.warning("mldiag: metric %r value %r is not finite, dropped", name, value)
            return None
        return number
    try:  # NumPy and JAX scalars
        number = float(value)
    except (TypeError, ValueError):
        log.warning("mldiag: unsupported value type %s for metric %r, dropped",
                    type(value).__name__, name)
        return None
    return number if math.isfinite(number) else None


# What the training thread appends: (name, at, value, step, labels, body, all_hosts, host).
# Points are built from these on the writer's thread, so a record costs a tuple and a lock.
# `labels` None stands for just the metric's unit.
Entry = tuple[str, float, float | None, int | None, dict[str, str] | None,
              str | dict[str, Any] | None, bool, str]


# A value the background thread converts: (name, at, value, step, labels, all_hosts).
Raw = tuple[str, float, Any, Any, dict[str, str], bool]


def _device_array(value: Any) -> bool:
    """Whether `value` is a JAX array, whose conversion waits for the device. JAX is looked
    up, never imported: a workload without it has no such value."""
    jax = sys.modules.get("jax")
    array = getattr(jax, "Array", None) if jax is not None else None
    return array is not None and isinstance(value, array)


def _on_device(value: Any, step: Any) -> list[Any]:
    """The JAX arrays among a value (or its list's elements) and a step: what converting on
    the training thread would wait for."""
    items = list(value) if isinstance(value, list | tuple) else [value]
    return [x for x in (*items, step) if _device_array(x)]


def _point(e: Entry, host: str) -> MetricPoint:
    name, at, value, step, labels, body, _, own_host = e
    return MetricPoint(name=name, at=at, value=value, step=step, host=own_host or host,
                       labels=labels if labels is not None
                       else {"unit": METRIC_UNITS.get(name, "1")}, body=body)


class _Recorder:
    """The buffer of points not yet stored, and the thread that stores them in batches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: list[Entry] = []
        # Values on a device, converted by the background thread (`defer`).
        self._raw: list[Raw] = []
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._flushing = threading.Lock()
        self.dropped = 0
        self.series: dict[str, deque[Entry]] = {}

    def add(self, entry: Entry) -> None:
        with self._lock:
            pending = self._pending
            pending.append(entry)
            if entry[2] is not None:
                series = self.series.get(entry[0])
                if series is None:
                    series = self.series[entry[0]] = deque(maxlen=_KEEP)
                series.append(entry)
            if len(pending) == BATCH:
                # A full batch: write it now rather than at the next tick.
                self._wake.notify()
            elif len(pending) > MAX_PENDING:
                del pending[:BATCH]
                self.dropped += BATCH
                log.warning("mldiag: %d metric points dropped: the state store is not "
                            "taking them", self.dropped)
            self._start()

    def defer(self, raw: Raw) -> None:
        """Hand a value on a device to the background thread, which converts it (`_convert`)
        and records its point: the caller does not wait for the device."""
        with self._lock:
            self._raw.append(raw)
            self._start()
            self._wake.notify()

    def _start(self) -> None:
        # Under the lock. Started on first use (not at import), and again in a forked child.
        if self._pid != _getpid():
            self._pid = _getpid()
            self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        flushed = time.monotonic()
        while True:
            with self._lock:
                if not self._raw:
                    self._wake.wait(max(0.0, FLUSH_S - (time.monotonic() - flushed)))
                full = len(self._pending) >= BATCH
            self._convert()
            if full or time.monotonic() - flushed >= FLUSH_S:
                flushed = time.monotonic()
                run = current_run()
                if run is not None:
                    self.flush(run)

    def _convert(self) -> None:
        """Convert the values handed over by `defer` (waiting for their devices) and record
        their points, as `record_metrics` records a number."""
        with self._lock:
            batch, self._raw = self._raw, []
        for name, at, raw, step, labels, all_hosts in batch:
            try:
                if isinstance(raw, list | tuple):
                    # The mean of the elements' values (a list of JAX scalars has no mean).
                    raw = [float(x) if _device_array(x) else x for x in raw]
                value = _number(name, raw)
                step_number = _step(step)
            except Exception as e:  # noqa: BLE001 - a deleted (donated) array: one point lost
                log.warning("mldiag: metric %r could not be read from its device, dropped: %s",
                            name, e)
                continue
            if value is None:
                continue
            self.add((name, at, value, step_number, labels, None, all_hosts, ""))
            if name == STEP_TIME:
                _observe(value, at)

    def flush(self, run: MLRun) -> int:
        """Write every pending point to `run`'s store (values still on a device converted
        first); returns how many were written. Points stay pending when the write fails (the
        next flush tries again)."""
        self._convert()
        with self._flushing:
            with self._lock:
                batch, self._pending = self._pending, []
            keep = [e for e in batch if _stored_by(run, e[0], e[6])]
            if not keep:
                return 0
            try:
                for i in range(0, len(keep), BATCH):
                    run.plane.state.record_metrics(
                        run.name, [_point(e, run.host) for e in keep[i:i + BATCH]])
            except Exception as e:  # noqa: BLE001 - metrics must never stop training
                log.warning("mldiag: storing %d metric points failed (kept for the next "
                            "try): %s", len(keep), e)
                with self._lock:
                    self._pending[:0] = keep
                return 0
            return len(keep)

    def clear(self) -> None:
        with self._lock:
            self.series.clear()


def _stored_by(run: MLRun, name: str, all_hosts: bool) -> bool:
    if name in SYSTEM_METRICS and not run.log_system_metrics:
        return False
    return all_hosts or run.target.process_index == 0


# The background thread's name (the SDK names its threads `mldiag-<what>`).
THREAD_NAME = "mldiag-metrics"
_recorder = _Recorder()
_getpid = os.getpid
_PLAIN_STEP = (int, type(None))


def record(metric_name: MetricType | str, value: Any, step: int | None = None,
           labels: dict[str, str] | None = None, record_on_all_hosts: bool = False) -> None:
    """Record one value of a metric (STEP_TIME in seconds) for the active run.

    Example::

        metrics.record(MetricType.LEARNING_RATE, learning_rate)
        metrics.record(MetricType.LEARNING_RATE, learning_rate, step=1)
    """
    if (type(value) is float and labels is None and type(step) in _PLAIN_STEP
            and type(metric_name) is MetricType and math.isfinite(value)):
        # The common per-step call, without the general path's checks (same result).
        name = metric_name.value
        now = time.time()
        _recorder.add((name, now, value, step, None, None, record_on_all_hosts, ""))
        if name == STEP_TIME:
            _observe(value, now)
        return
    record_metrics([{"metric_name": metric_name, "value": value, "step": step,
                     "labels": labels}], record_on_all_hosts=record_on_all_hosts)


def _observe(seconds: float, at: float) -> None:
    run = current_run()
    if run is not None:
        run.observe_step_time(seconds, at)


def record_metrics(metrics_data: Sequence[Mapping[str, Any]], record_on_all_hosts: bool = False,
                   step: int | None = None) -> None:
    """Record several metrics: dicts with `metric_name` and `value`, and optionally `step`
    and `labels`; `step` applies to every dict without one.

    Example::

        metrics.record_metrics([
            {"metric_name": MetricType.LOSS, "value": 0.5},
            {"metric_name": "custom_metric", "value": 56.7},
        ], step=1)
    """
    now = time.time()
    step_times: list[float] = []
    for item in metrics_data:
        try:
            name = _name(item.get("metric_name"))
            raw = item.get("value")
        except AttributeError:
            log.warning("mldiag: metric %.80r is not a dict, dropped", item)
            continue
        if name is None or raw is None:
            # As upstream: a missing name or a None value is dropped, not an error.
            log.debug("mldiag: metric without a name or value dropped: %.80r", item)
            continue
        # As upstream: `step` fills in only where a dict has no "step" key at all.
        item_step = item["step"] if "step" in item else step
        labels = {str(k): str(v) for k, v in dict(item.get("labels") or {}).items()}
        labels.setdefault("unit", METRIC_UNITS.get(name, "1"))
        if isinstance(raw, str | dict):
            labels.setdefault("namespace", name)
            _recorder.add((name, now, None, _step(item_step), labels,
                           raw if isinstance(raw, str) else dict(raw), record_on_all_hosts, ""))
            continue
        on_device = _on_device(raw, item_step)
        if on_device:
            for array in on_device:
                _copy_to_host(array)
            _recorder.defer((name, now, raw, item_step, labels, record_on_all_hosts))
            continue
        value = _number(name, raw)
        if value is None:
            continue
        _recorder.add((name, now, value, _step(item_step), labels, None, record_on_all_hosts,
                       ""))
        if name == STEP_TIME:
            step_times.append(value)
    for seconds in step_times:
        _observe(seconds, now)


def _copy_to_host(array: Any) -> None:
    """Start copying a JAX array to the host, without waiting for it."""
    try:
        array.copy_to_host_async()
    except Exception:  # noqa: BLE001 - the background conversion still reads it (or says why)
        log.debug("mldiag: copy_to_host_async failed", exc_info=True)


def _step(step: Any) -> int | None:
    if step is None or isinstance(step, bool):
        return None
    try:
        return int(step)
    except (TypeError, ValueError):
        log.warning("mldiag: step %.40r is not an integer, dropped from the point", step)
        return None


def record_alert(run: MLRun, alert: DegradationDetected, found: Degradation) -> None:
    """Keep an alert of the run's degradation monitor with its metrics (`mldiag_alert`)."""
    _recorder.add((ALERT_METRIC, found.at, None, None,
                   {"unit": "1", "namespace": ALERT_METRIC},
                   {"alert_id": alert.alert_id, "summary": alert.summary,
                    "baseline_s": found.baseline_s, "current_s": found.current_s}, True,
                   run.host))


def flush_to(run: MLRun) -> int:
    """Write every pending point to `run`'s store now (the run's close() calls it)."""
    return _recorder.flush(run)


def history(metric_name: MetricType | str) -> list[Sample]:
    """The numeric values of a metric recorded in this process, oldest first."""
    name = _name(metric_name)
    if name is None:
        raise ValueError(f"not a metric name: {metric_name!r}")
    with _recorder._lock:
        entries = list(_recorder.series.get(name, ()))
    # By when each was recorded: a value converted in the background joins its series late.
    entries.sort(key=lambda e: e[1])
    return [Sample(p.name, p.value, p.step, p.at, p.labels)
            for p in (_point(e, "") for e in entries) if p.value is not None]


def clear() -> None:
    """Forget the in-memory history (a new run starts with none). Points not yet stored
    are kept: they go to the next run, as upstream's queue does."""
    _recorder.clear()


# System metrics (log_system_metrics=True)


def _cpu_times() -> tuple[float, float] | None:
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields), idle


def host_memory_utilization() -> float | None:
    """Used share of the host's memory, in %, from /proc/meminfo (None elsewhere)."""
    info: dict[str, float] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                info[key] = float(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return None
    total, available = info.get("MemTotal"), info.get("MemAvailable")
    if not total or available is None:
        return None
    return 100.0 * (total - available) / total


def start_system_metrics(run: MLRun, interval_s: float) -> threading.Thread:
    """Record HOST_CPU_UTILIZATION and HOST_MEMORY_UTILIZATION every `interval_s` while
    `run` is open (upstream also reads TPU/GPU utilization through libtpu and NVML, which
    mldiag does not)."""

    def loop() -> None:
        before = _cpu_times()
        labels = {"hostname": run.host, "process_index": str(run.target.process_index)}
        while not run._stop.wait(interval_s):
            now = _cpu_times()
            data: list[dict[str, Any]] = []
            if before and now and now[0] > before[0]:
                busy = 1.0 - (now[1] - before[1]) / (now[0] - before[0])
                data.append({"metric_name": MetricType.HOST_CPU_UTILIZATION,
                             "value": 100.0 * busy, "labels": labels})
            before = now
            memory = host_memory_utilization()
            if memory is not None:
                data.append({"metric_name": MetricType.HOST_MEMORY_UTILIZATION,
                             "value": memory, "labels": labels})
            record_metrics(data, record_on_all_hosts=True)

    thread = threading.Thread(target=loop, name="mldiag-system-metrics", daemon=True)
    thread.start()
    return thread
