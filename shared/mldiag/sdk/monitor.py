"""The built-in degradation monitor: step time against a rolling baseline.

So auto-capture works without Google Cloud Monitoring: every STEP_TIME sample goes here, and
when the median of the newest `recent` samples stays at least `threshold` above the baseline
for `sustain_s`, one alert is raised. Sustaining matters twice: a single slow step (a
checkpoint, a recompile) is not a degradation, and a continuous-profiling snapshot taken at
the alert must hold degraded steps, not the healthy ones before them.

The baseline is the median of the newest `baseline` healthy samples after `warmup`; degraded
samples never enter it, so a long degradation does not become the new normal. After an
alert the monitor stays quiet until step time recovers (below half the threshold), then
re-arms.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


def _median(values: deque[float]) -> float:
    """statistics.median, without its overhead (it runs on every step)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@dataclass(frozen=True)
class Degradation:
    """What the monitor saw when it raised an alert."""

    baseline_s: float
    current_s: float
    since: float
    at: float

    @property
    def ratio(self) -> float:
        return self.current_s / self.baseline_s

    def summary(self) -> str:
        # The monitor's own baseline: the running median of the workload's recorded step
        # times, not a profiled session's step time (a diff's baseline reads otherwise).
        return (f"step time {self.current_s * 1e3:.1f} ms is {100 * (self.ratio - 1):.0f}% "
                f"above the baseline {self.baseline_s * 1e3:.1f} ms (the running median of "
                f"recorded step times) for {self.at - self.since:.1f} s")


class StepTimeMonitor:
    """Feed it step times; it calls `on_alert` once per degradation episode."""

    def __init__(self, on_alert: Callable[[Degradation], None], *, threshold: float = 0.15,
                 warmup: int = 5, baseline: int = 50, min_baseline: int = 10, recent: int = 5,
                 sustain_s: float = 3.0) -> None:
        if threshold <= 0:
            raise ValueError("threshold must be positive")
        self.on_alert = on_alert
        self.threshold = threshold
        self.warmup = warmup
        self.min_baseline = min_baseline
        self.recent_n = recent
        self.sustain_s = sustain_s
        self._baseline: deque[float] = deque(maxlen=baseline)
        self._recent: deque[float] = deque(maxlen=recent)
        self._seen = 0
        self._degraded_since: float | None = None
        self._alerted = False
        self._lock = threading.Lock()
        self.alerts: list[Degradation] = []
        # The baseline's median, kept until the baseline changes (observe runs every step).
        self._baseline_median: float | None = None

    @property
    def baseline_s(self) -> float | None:
        """The current baseline step time, or None while it is still being learned."""
        if len(self._baseline) < self.min_baseline:
            return None
        if self._baseline_median is None:
            self._baseline_median = _median(self._baseline)
        return self._baseline_median

    def _learn(self, step_time_s: float) -> None:
        self._baseline.append(step_time_s)
        self._baseline_median = None

    def observe(self, step_time_s: float, at: float) -> Degradation | None:
        """Take one sample; returns the degradation when this sample raised an alert."""
        with self._lock:
            self._seen += 1
            if self._seen <= self.warmup or step_time_s <= 0:
                return None
            base = self.baseline_s
            self._recent.append(step_time_s)
            if base is None:
                self._learn(step_time_s)
                return None
            current = _median(self._recent)
            if current >= base * (1 + self.threshold):
                if self._degraded_since is None:
                    self._degraded_since = at
                if self._alerted or at - self._degraded_since < self.sustain_s:
                    return None
                self._alerted = True
                found = Degradation(baseline_s=base, current_s=current,
                                    since=self._degraded_since, at=at)
                self.alerts.append(found)
            else:
                if current < base * (1 + self.threshold / 2):
                    self._degraded_since = None
                    self._alerted = False
                if step_time_s < base * (1 + self.threshold):
                    self._learn(step_time_s)
                return None
        self.on_alert(found)
        return found
