"""The report's SVG charts as geometry: every coordinate and label the templates in
`report/charts.html` draw, already formatted (as `console/charts.py` does for the console)."""

from __future__ import annotations

import math
from typing import Any

from mldiag.analysis.report.model import ms_text, si_text


def _log_ticks(lo: float, hi: float) -> list[float]:
    return [10.0**k for k in range(round(math.log10(lo)), round(math.log10(hi)) + 1)]


def _tick_label(value: float) -> str:
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:g}{suffix}"
    return f"{value:g}"


def on_chart(point: tuple[float, float]) -> bool:
    # Bounds far outside any real device keep the log axes finite on corrupt input.
    return 1e-9 <= point[0] <= 1e9 and 1e-9 <= point[1] <= 1e12


def share_bar(percent: float, label: str) -> dict[str, str]:
    """A thin progress bar drawn as SVG geometry: no inline style, so a hash-only CSP keeps
    it."""
    return {"label": label, "width": f"{min(max(percent, 0.0), 100.0):.1f}"}


def roofline(peak_gflops: float, bw_gbs: float, program: tuple[float, float] | None,
             ops: list[tuple[str, str, float, float]]) -> dict[str, Any]:
    width, height = 620, 360
    left, right, top, bottom = 62, 20, 16, 46
    ridge = peak_gflops / bw_gbs
    xs = [ridge] + [p[2] for p in ops] + ([program[0]] if program else [])
    ys = [p[3] for p in ops] + ([program[1]] if program else [])
    x_lo = 10.0 ** math.floor(math.log10(min(xs) / 3))
    x_hi = 10.0 ** math.ceil(math.log10(max(xs) * 3))
    y_lo = 10.0 ** math.floor(math.log10(min(ys + [bw_gbs * x_lo, peak_gflops])))
    y_hi = 10.0 ** math.ceil(math.log10(peak_gflops * 2))

    def px(x: float) -> float:
        frac = (math.log10(x) - math.log10(x_lo)) / (math.log10(x_hi) - math.log10(x_lo))
        return left + frac * (width - left - right)

    def py(y: float) -> float:
        frac = (math.log10(y) - math.log10(y_lo)) / (math.log10(y_hi) - math.log10(y_lo))
        return height - bottom - frac * (height - top - bottom)

    roof_start = max(x_lo, y_lo / bw_gbs)
    slope_x = math.sqrt(roof_start * ridge)
    angle = -math.degrees(
        math.atan2(py(bw_gbs * roof_start) - py(peak_gflops), px(ridge) - px(roof_start)))
    points = []
    labels: dict[tuple[int, int], list[str]] = {}
    for rank, name, x, y in ops:
        cx, cy = px(x), py(y)
        points.append({"cx": f"{cx:.1f}", "cy": f"{cy:.1f}",
                       "title": f"#{rank} {name}: {x:.4g} FLOP/B, {y:.4g} GFLOP/s"})
        labels.setdefault((round(cx / 6), round(cy / 6)), []).append(rank)
    marker = None
    if program:
        cx, cy = px(program[0]), py(program[1])
        marker = {"cx": f"{cx:.1f}", "cy": f"{cy:.1f}", "lx": f"{cx + 10:.1f}",
                  "ly": f"{cy + 4:.1f}",
                  "title": f"program: {program[0]:.4g} FLOP/B, {program[1]:.4g} GFLOP/s"}
    return {
        "width": width, "height": height, "left": left, "top": top,
        "plot_w": width - left - right, "plot_h": height - top - bottom,
        "right_x": width - right, "bottom_y": height - bottom,
        "x_ticks": [{"x": f"{px(t):.1f}", "label": _tick_label(t)}
                    for t in _log_ticks(x_lo, x_hi)],
        "x_tick_y": height - bottom + 14,
        "y_ticks": [{"y": f"{py(t):.1f}", "ty": f"{py(t) + 4:.1f}", "label": _tick_label(t)}
                    for t in _log_ticks(y_lo, y_hi)],
        "y_tick_x": left - 6,
        "x_title": f"{(left + width - right) / 2:.0f}", "x_title_y": height - 8,
        "y_title": f"{(top + height - bottom) / 2:.0f}",
        "roof": (f"{px(roof_start):.1f},{py(bw_gbs * roof_start):.1f} "
                 f"{px(ridge):.1f},{py(peak_gflops):.1f} {px(x_hi):.1f},{py(peak_gflops):.1f}"),
        "ridge_x": f"{px(ridge):.1f}", "ridge_y": f"{py(peak_gflops):.1f}",
        "ridge_label_x": f"{px(ridge) + 4:.1f}", "ridge_label_y": height - bottom - 6,
        "ridge": f"{ridge:,.1f}",
        "roof_label_x": width - right - 4, "roof_label_y": f"{py(peak_gflops) - 6:.1f}",
        "peak": si_text(peak_gflops * 1e9, "FLOP/s"),
        "slope_x": f"{px(slope_x):.1f}", "slope_y": f"{py(bw_gbs * slope_x) - 6:.1f}",
        "angle": f"{angle:.1f}", "bandwidth": f"{bw_gbs:,.0f}",
        "points": points,
        "labels": [{"x": gx * 6 + 7, "y": gy * 6 - 5, "text": ",".join(ranks)}
                   for (gx, gy), ranks in labels.items()],
        "program": marker,
    }


def memory_bar(peak: float, cap: float, stack: float | None,
               heap: float | None) -> dict[str, Any]:
    width, bar_h = 560, 26
    scale = width / max(cap, peak)
    if stack is not None and heap is not None and abs(stack + heap - peak) < 0.05 * max(peak, 1):
        segments = [(stack, "#0969da", "stack reservation"), (heap, "#54aeff", "heap")]
    else:
        segments = [(peak, "#0969da", "peak usage")]
    rects, x = [], 0.0
    for size, color, label in segments:
        rects.append({"x": f"{x:.1f}", "width": f"{size * scale:.1f}", "fill": color,
                      "title": f"{label}: {size:.2f} GiB"})
        x += size * scale
    share = peak / cap * 100 if cap else 0
    return {"width": width, "height": bar_h + 24, "bar_h": bar_h,
            "cap_w": f"{cap * scale:.1f}", "cap_x": f"{cap * scale - 1:.1f}",
            "line_y2": bar_h + 2, "text_y": bar_h + 16, "end_x": width - 2,
            "rects": rects, "peak": f"{peak:.2f}", "share": f"{share:.1f}", "cap": f"{cap:.2f}"}


def category_bars(rows: list[tuple[str, float, float | None]]) -> dict[str, Any]:
    label_w, bar_w, value_w, row_h = 170, 330, 190, 20
    top = max((frac for _, frac, _ in rows), default=0.0) or 1.0
    bars = []
    for i, (category, frac, ms) in enumerate(rows):
        y = i * row_h + 3
        bar = max(bar_w * frac / top, 1.0 if frac > 0 else 0.0)
        bars.append({
            "y": y + 13, "bar_y": y + 2, "width": f"{bar:.1f}", "category": category,
            "shown": category if len(category) <= 24 else category[:23] + "…",
            "fill": "#8c959f" if category.upper() == "IDLE" else "#0969da",
            "value_x": f"{label_w + bar + 6:.1f}",
            "value": f"{frac * 100:.1f}%" + (f" · {ms_text(ms)}" if ms is not None else "")})
    width = label_w + bar_w + value_w
    return {"width": width, "height": row_h * len(rows) + 6, "label_x": label_w - 6,
            "bar_x": label_w, "bar_h": row_h - 6, "bars": bars}


# The host × step heat map: its size does not grow with the pod (the pass shows at most 16
# hosts and a summary row, at most 64 step columns), so 256 hosts draw as 8 do.
HEAT_LABEL_W, HEAT_PLOT_W, HEAT_ROW_H, HEAT_MAX_ROWS, HEAT_MAX_COLS = 186, 640, 16, 17, 64
HEAT_TOP, HEAT_GAP, HEAT_BOTTOM = 8, 6, 74
# Host names longer than this are cut in the label (the cell titles keep them whole).
HEAT_LABEL_CHARS = 22
# Width of one character of the labels (the stylesheet's 12.5 px monospace), generously:
# labels are spaced and cut by it.
CHAR_W = 7.8
_LATE, _EARLY, _ZERO = (207, 34, 46), (9, 105, 218), (255, 255, 255)
HEAT_SHADES = 5


def _shade(level: int) -> str:
    """Fill of a lateness level, -HEAT_SHADES (earliest) .. +HEAT_SHADES (latest)."""
    end = _LATE if level > 0 else _EARLY
    t = abs(level) / HEAT_SHADES
    return "#" + "".join(f"{round(z + (e - z) * t):02x}" for z, e in zip(_ZERO, end, strict=True))


def _level(value: float, scale: float) -> int:
    return max(-HEAT_SHADES, min(HEAT_SHADES, round(value / scale * HEAT_SHADES)))


def _short(name: str, chars: int) -> str:
    # Hosts of one pod share their prefix: the end (the worker's index) tells them apart.
    return name if len(name) <= chars else "…" + name[-(chars - 1):]


def heat_map(steps: list[str], rows: list[tuple[str, list[float], list[float], bool]],
             threshold_ms: float | None) -> dict[str, Any]:
    """Cells, labels and legend of the host × step lateness map.

    `rows`: (host, lateness ms per step column, collective wait ms per column, whether the
    row summarises other hosts), worst first as the pass ordered them. The colour scale is
    symmetric around 0 (late red, early blue) and reaches full colour at the largest
    lateness, or at twice the straggler threshold when that is larger: jitter well under the
    threshold stays pale."""
    steps = steps[:HEAT_MAX_COLS]
    rows = rows[:HEAT_MAX_ROWS]
    n_cols = max(len(steps), 1)
    cell_w = HEAT_PLOT_W / n_cols
    values = [abs(v) for _, late, _, _ in rows for v in late[:n_cols]]
    scale = max(max(values, default=0.0), 2 * (threshold_ms or 0.0)) or 1.0
    cells, labels = [], []
    y = float(HEAT_TOP)
    for i, (host, late, wait, summary) in enumerate(rows):
        if summary and i:
            y += HEAT_GAP
        labels.append({"y": f"{y + HEAT_ROW_H / 2 + 4:.1f}",
                       "text": _short(host, HEAT_LABEL_CHARS), "title": host,
                       "summary": summary})
        for c, step in enumerate(steps):
            if c >= len(late):
                break
            waited = wait[c] if c < len(wait) else None
            title = (f"{host}, step {step}: {late[c]:+.2f} ms late"
                     + (f", waited {waited:.2f} ms at the collectives"
                        if waited is not None else ""))
            cells.append({"x": f"{HEAT_LABEL_W + c * cell_w:.1f}", "y": f"{y:.1f}",
                          "w": f"{max(cell_w - 1, 1):.1f}", "fill": _shade(_level(late[c], scale)),
                          "title": title})
        y += HEAT_ROW_H
    plot_bottom = y
    # Step labels centred under their columns, every `stride` columns so none overlap.
    widest = max((len(s) for s in steps), default=1) * CHAR_W + 6
    stride = max(1, math.ceil(widest / cell_w))
    x_labels = [{"x": f"{HEAT_LABEL_W + (c + 0.5) * cell_w:.1f}", "text": s}
                for c, s in enumerate(steps) if c % stride == 0]
    legend_y = plot_bottom + 40
    swatch = 28
    legend = [{"x": HEAT_LABEL_W + (level + HEAT_SHADES) * swatch, "fill": _shade(level)}
              for level in range(-HEAT_SHADES, HEAT_SHADES + 1)]
    legend_end = HEAT_LABEL_W + (2 * HEAT_SHADES + 1) * swatch
    return {
        # Room on the right for half of the last step's label.
        "width": HEAT_LABEL_W + HEAT_PLOT_W + math.ceil(widest / 2),
        "height": f"{plot_bottom + HEAT_BOTTOM:.0f}",
        "left": HEAT_LABEL_W, "top": HEAT_TOP, "plot_w": HEAT_PLOT_W,
        "plot_bottom": f"{plot_bottom:.1f}", "plot_h": f"{plot_bottom - HEAT_TOP:.1f}",
        "row_h": HEAT_ROW_H,
        "label_x": HEAT_LABEL_W - 6, "cells": cells, "labels": labels,
        "x_labels": x_labels, "x_label_y": f"{plot_bottom + 13:.1f}",
        "x_title_x": HEAT_LABEL_W + HEAT_PLOT_W / 2, "x_title_y": f"{plot_bottom + 27:.1f}",
        "x_title": "step" if all("-" not in s for s in steps) else
                   f"steps ({len(steps)} columns, each the mean of its steps)",
        "legend": legend, "legend_y": f"{legend_y:.1f}", "swatch": swatch,
        "legend_text_y": f"{legend_y + 24:.1f}",
        "legend_lo_x": HEAT_LABEL_W, "legend_mid_x": HEAT_LABEL_W + (HEAT_SHADES + 0.5) * swatch,
        "legend_hi_x": legend_end,
        "legend_lo": f"{-scale:.2f} ms early", "legend_hi": f"+{scale:.2f} ms late",
        "legend_title_x": HEAT_LABEL_W - 6, "legend_title_y": f"{legend_y + 15:.1f}",
        "threshold": f"straggler threshold {threshold_ms:.2f} ms" if threshold_ms else "",
        "threshold_x": legend_end + 10,
    }
