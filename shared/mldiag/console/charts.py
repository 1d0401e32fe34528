"""The run page's step-time chart: step time per host over wall time, with the alerts and
the captures marked, as plain geometry for the template to draw as inline SVG (no scripts,
no external resources: the console's CSP allows neither)."""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from typing import Any

from mldiag.model import MetricPoint, SessionRecord

WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 58, 12, 12, 30
# At most this many vertices per host line: a long run is averaged per pixel column.
MAX_VERTICES = WIDTH - LEFT - RIGHT
STEP_TIME, ALERT = "step_time", "mldiag_alert"
# How long after a monitor alert its capture's session may be created and still be that alert's.
ALERT_TO_CAPTURE_S = 60.0


def _clock(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%H:%M:%S")


def _nice_step(span: float, ticks: int = 4) -> float:
    raw = span / ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)


def step_time_chart(points: Sequence[MetricPoint],
                    sessions: Sequence[SessionRecord]) -> dict[str, Any] | None:
    """Lines, markers and axes of the chart, in SVG user units; None without step times.

    `points` are the run's recorded metrics (STEP_TIME in seconds, and the SDK monitor's
    alerts); alert-triggered sessions are alerts too, every session is a capture.
    """
    steps = [p for p in points if p.name == STEP_TIME and p.value is not None]
    if not steps:
        return None
    alerts: list[tuple[float, str]] = [
        (p.at, str(p.body.get("summary", "alert")) if isinstance(p.body, dict)
         else str(p.body)) for p in points if p.name == ALERT]
    # A capture an alert triggered marks that alert too, unless the monitor's own record of
    # it (just before) does already: alerts from Cloud Monitoring arrive only this way.
    monitor_times = [at for at, _ in alerts]
    alerts += [(s.created_at, s.note or f"alert → {s.session}")
               for s in sessions if s.trigger == "alert"
               and not any(0 <= s.created_at - at <= ALERT_TO_CAPTURE_S for at in monitor_times)]
    t0, t1 = min(p.at for p in steps), max(p.at for p in steps)
    t1 = max(t1, t0 + 1.0)
    top_ms = max(p.value for p in steps if p.value is not None) * 1e3 * 1.1 or 1.0
    y_step = _nice_step(top_ms)
    top_ms = math.ceil(top_ms / y_step) * y_step
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return round(LEFT + (t - t0) / (t1 - t0) * plot_w, 1)

    def y(ms: float) -> float:
        return round(TOP + plot_h - ms / top_ms * plot_h, 1)

    lines = []
    hosts = sorted({p.host for p in steps})
    for i, host in enumerate(hosts):
        columns: dict[int, list[float]] = {}
        for p in steps:
            if p.host == host and p.value is not None:
                col = int((p.at - t0) / (t1 - t0) * (MAX_VERTICES - 1))
                columns.setdefault(col, []).append(p.value * 1e3)
        vertices = [(LEFT + c / (MAX_VERTICES - 1) * plot_w, sum(v) / len(v))
                    for c, v in sorted(columns.items())]
        values = [v for vs in columns.values() for v in vs]
        lines.append({
            "host": host, "series": i % 4,
            "points": " ".join(f"{round(px, 1)},{y(ms)}" for px, ms in vertices),
            "count": len(values),
            "median_ms": round(sorted(values)[len(values) // 2], 2),
        })
    in_range = [(at, label) for at, label in alerts if t0 <= at <= t1]
    captures = [{"x": x(s.created_at), "session": s.session, "kind": s.kind,
                 "trigger": s.trigger, "state": s.state, "at": _clock(s.created_at)}
                for s in sorted(sessions, key=lambda s: s.created_at)
                if t0 <= s.created_at <= t1]
    y_ticks = [{"y": y(v), "label": f"{v:g}"}
               for v in (i * y_step for i in range(int(round(top_ms / y_step)) + 1))]
    x_ticks = [{"x": x(t0 + f * (t1 - t0)), "label": _clock(t0 + f * (t1 - t0)),
                "anchor": "start" if f == 0 else "end" if f == 1 else "middle"}
               for f in (0.0, 0.25, 0.5, 0.75, 1.0)]
    return {
        "width": WIDTH, "height": HEIGHT, "left": LEFT, "right": WIDTH - RIGHT, "top": TOP,
        "bottom": HEIGHT - BOTTOM, "lines": lines, "y_ticks": y_ticks, "x_ticks": x_ticks,
        "alerts": [{"x": x(at), "at": _clock(at), "label": label} for at, label in in_range],
        "captures": captures, "points": len(steps),
        "from": _clock(t0), "to": _clock(t1),
        "outside": len(alerts) - len(in_range),
    }
