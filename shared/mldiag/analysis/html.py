from __future__ import annotations

import base64
import functools
import hashlib
import html
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import resources
from typing import Any

_GB_PER_GIB = 1.073741824
_PRIORITY_RANK = {"P0": 0, "P1": 1, "P2": 2}
_DETECTORS = (
    ("detect_layout_mismatch_copies", "Layout-mismatch copies"),
    ("detect_unfused_reshapes", "Unfused reshapes"),
    ("detect_unnecessary_convert_reduce", "Unnecessary convert → reduce"),
)
_BACKTICK = re.compile(r"`([^`\n]+)`")

@functools.cache
def _css() -> str:
    """The stylesheet the report inlines and the console links: `mldiag/web/static/mldiag.css`."""
    return (resources.files("mldiag.web") / "static" / "mldiag.css").read_text(encoding="utf-8")



# ---------------------------------------------------------------- small helpers


def _e(value: object) -> str:
    if value is None:
        return ""
    return html.escape(str(value), quote=True)


def _prose(value: object) -> str:
    # Escape first, then turn `code` spans into <code>: backticks survive escaping,
    # so the markup we add can only wrap already-escaped text.
    return _BACKTICK.sub(r"<code>\1</code>", _e(value))


def prose_html(value: object) -> str:
    """A finding's text as HTML: escaped, with its `code` spans as <code> (as the report
    shows them; the console's pages use it too)."""
    return _prose(value)


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _measured(value: object) -> float | None:
    """A non-negative finite number, or None when absent or XProf's -1 "unknown"."""
    if isinstance(value, bool):
        return None
    number: float | None = None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        text = value.strip().rstrip("%").replace(",", "")
        try:
            number = float(text)
        except ValueError:
            return None
    if number is None or not math.isfinite(number) or number < 0:
        return None
    return number


def _na(note: str = "") -> str:
    title = f' title="{_e(note)}"' if note else ""
    return f'<span class="na"{title}>n/a</span>'


def _group(number: float, decimals: int) -> str:
    return f"{number:,.{decimals}f}"


def _ms_text(number: float) -> str:
    return f"{_group(number, 1 if number >= 100 else 2)} ms"


def _fmt_ms(value: object) -> str:
    number = _measured(value)
    return _na("not measured") if number is None else _ms_text(number)


def _fmt_pct(value: object) -> str:
    number = _measured(value)
    if number is None:
        return _na("not measured")
    # Two decimals below 10% so small shares and the summary's own figures still match.
    return f"{number:.2f}%" if number < 10 else f"{number:.1f}%"


def _fmt_gib(value: object) -> str:
    number = _measured(value)
    return _na("not measured") if number is None else f"{number:,.2f} GiB"


def _fmt_mem_gib(value: object) -> str:
    """A size given in GiB; below 0.1 GiB it is shown in MiB so it never reads "0.00 GiB"."""
    number = _measured(value)
    if number is None:
        return _na("not measured")
    if 0 < number < 0.1:
        mib = number * 1024
        return f"{mib:.1f} MiB" if mib >= 0.1 else f"{mib:.3g} MiB"
    return f"{number:,.2f} GiB"


def _fmt_mib(value: object) -> str:
    number = _measured(value)
    if number is None:
        return _na("not measured")
    if number >= 1024:
        return f"{_group(number, 1)} MiB ({number / 1024:.2f} GiB)"
    return f"{number:,.3g} MiB" if number < 1 else f"{_group(number, 1)} MiB"


def _fmt_si(value: object, unit: str = "") -> str:
    number = _measured(value)
    if number is None:
        return _na("not measured")
    for factor, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if number >= factor:
            return f"{number / factor:.2f} {suffix}{unit}"
    return f"{number:.4g} {unit}".rstrip()


def _fmt_plain(value: object, decimals: int = 2) -> str:
    number = _measured(value)
    if number is None:
        return _na("not measured")
    if number != 0 and number < 10 ** (-decimals):
        return f"{number:.2g}"
    return _group(number, decimals)


def _with_unit(value: object, unit: str, decimals: int = 2) -> str:
    number = _measured(value)
    return _na("not measured") if number is None else f"{_fmt_plain(number, decimals)} {unit}"


def _raw(value: object) -> str:
    """Verbatim rendering of a tool value, so evidence stays traceable to tool output."""
    if isinstance(value, str):
        return _e(value)
    return _e(json.dumps(value, ensure_ascii=False, sort_keys=True, default=str))


def _breakable(value: object) -> str:
    """Escaped text with line-break opportunities after ``_`` and ``.`` (tool and field names)."""
    return re.sub(r"([_.])", r"\1<wbr>", _e(value))


def _evidence_value(value: object) -> str:
    """Long values (HLO neighbourhoods) fold away so the evidence table stays readable."""
    text = value if isinstance(value, str) else json.dumps(
        value, ensure_ascii=False, sort_keys=True, default=str)
    if len(text) <= 120:
        return _raw(value)
    first = text.splitlines()[0][:80]
    return (f'<details class="evlong"><summary>{_e(first)}…</summary>'
            f'<pre class="mono">{_e(text)}</pre></details>')


def _tool(snapshot: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    return _map(_map(snapshot.get("tools")).get(name))


def _data(entry: Mapping[str, Any]) -> Mapping[str, Any] | None:
    if entry.get("status") != "DATA":
        return None
    data = entry.get("data")
    return data if isinstance(data, Mapping) else None


def _status_chip(status: object) -> str:
    text = _str(status) or "?"
    css = text if text in ("DATA", "NO_DATA", "ERROR") else "other"
    return f'<span class="st st-{css}">{_e(text)}</span>'


def _table(
    headers: Sequence[tuple[str, str]],
    rows: Iterable[Sequence[str]],
    *,
    collapse_after: int = 0,
    row_classes: Sequence[str] = (),
) -> str:
    """Rows hold ready-made (escaped) cell HTML; header tuples are (label, css class).

    ``row_classes`` optionally gives each row a CSS class (by position; "" for none).
    """
    head = "".join(
        f'<th class="{"num" if css == "num" else ""}">{_e(label)}</th>' for label, css in headers
    )
    body = []
    for index, row in enumerate(rows):
        css_row = row_classes[index] if index < len(row_classes) else ""
        opening = f'<tr class="{_e(css_row)}">' if css_row else "<tr>"
        body.append(
            opening
            + "".join(
                f'<td class="{css}">{cell}</td>'
                for (_, css), cell in zip(headers, row, strict=True)
            )
            + "</tr>"
        )
    if not body:
        return '<p class="why">No rows.</p>'

    def render(chunk: list[str]) -> str:
        return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(chunk)}</tbody></table>"

    if collapse_after and len(body) > collapse_after:
        rest = body[collapse_after:]
        return (
            render(body[:collapse_after])
            + f"<details><summary>Show {len(rest)} more rows</summary>{render(rest)}</details>"
        )
    return render(body)


def _device_type(analysis: Mapping[str, Any], snapshot: Mapping[str, Any]) -> str:
    candidates = [
        _map(analysis.get("session")).get("device_type"),
        _map(_data(_tool(snapshot, "get_device_information"))).get("device_type"),
        _map(_map(_data(_tool(snapshot, "get_xprof_overview"))).get("run_environment")).get(
            "device_type"
        ),
    ]
    return next((c for c in candidates if isinstance(c, str) and c.strip()), "")


def _is_cpu(device_type: str) -> bool:
    return "cpu" in device_type.lower()


def _is_gpu(device_type: str) -> bool:
    return "gpu" in device_type.lower()


def _cpu_profile(analysis: Mapping[str, Any], snapshot: Mapping[str, Any]) -> bool:
    """True when the session or XProf's run environment says the profile is of CPU devices."""
    env = _map(_map(_data(_tool(snapshot, "get_xprof_overview"))).get("run_environment"))
    return any(
        _is_cpu(_str(candidate))
        for candidate in (_map(analysis.get("session")).get("device_type"), env.get("device_type"))
    )


def _tool_reason(entry: Mapping[str, Any]) -> str:
    """Why a tool has no data, in its own words (``data.reason``, or older ``message``)."""
    data = _map(entry.get("data"))
    for key in ("reason", "message", "info"):
        text = _str(data.get(key)).strip()
        if text:
            return text
    return ""


def _why_absent(name: str, entry: Mapping[str, Any], device_type: str, cpu_reason: str) -> str:
    status = entry.get("status")
    if not entry:
        text = f"{name} was not collected for this session."
        if _is_cpu(device_type) and cpu_reason:
            text = f"{cpu_reason} ({name} was not collected)."
        return f'<p class="why">{_e(text)}</p>'
    if status == "ERROR":
        return (
            f'<p class="why">{_e(name)} failed, so this could not be analysed:</p>'
            f'<p class="err">{_e(entry.get("error") or "no error text recorded")}</p>'
        )
    message = _tool_reason(entry)
    if _is_cpu(device_type) and cpu_reason:
        detail = f' <span class="mono">({_e(name)}: {_e(message)})</span>' if message else ""
        return f'<p class="why">{_e(cpu_reason)}{detail}</p>'
    reason = message or "the tool returned no data for this trace."
    return f'<p class="why">{_e(name)} returned {_e(status or "no status")}: {_e(reason)}</p>'


def _section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{_e(title)}</h2>{body}</section>'


def _tool_block(anchor: str, title: str, body: str) -> str:
    return f'<div class="tool" id="{anchor}"><h3>{_e(title)}</h3>{body}</div>'


# ---------------------------------------------------------------- 1. summary


def _metric_card(label: str, value_html: str, note_html: str, extra: str = "") -> str:
    return (
        f'<div class="card metric"><div class="label">{_e(label)}</div>'
        f'<div class="value">{value_html}</div><div class="note">{note_html}</div>{extra}</div>'
    )


def _share_bar(percent: float, label: str) -> str:
    """A thin progress bar drawn as SVG geometry: no inline style, so a hash-only CSP keeps it."""
    width = min(max(percent, 0.0), 100.0)
    return (
        '<svg class="minibar" width="100%" height="6" viewBox="0 0 100 6" '
        f'preserveAspectRatio="none" role="img" aria-label="{_e(label)}">'
        '<rect width="100" height="6" fill="#eaeef2"/>'
        f'<rect class="fill" width="{width:.1f}" height="6" fill="#0969da"/></svg>'
    )


def _render_summary(analysis: Mapping[str, Any], snapshot: Mapping[str, Any]) -> str:
    metrics = _map(analysis.get("metrics"))
    not_measured = "not measured"
    cpu = _cpu_profile(analysis, snapshot)

    step = _measured(metrics.get("step_time_ms"))
    idle = _measured(metrics.get("device_idle_percent"))
    roof = _measured(metrics.get("roofline_efficiency_percent"))
    peak = _measured(metrics.get("peak_memory_gib"))
    cap = _measured(metrics.get("memory_capacity_gib"))
    risk = _str(metrics.get("oom_risk")).upper()
    # get_peak_allocations measures the largest compiled program's buffer assignment, not a
    # runtime peak; say so rather than calling it "peak memory".
    from_allocations = _str(metrics.get("peak_memory_source")) == "get_peak_allocations"

    mem_label = "Largest allocation" if from_allocations else "Peak memory"
    mem_note = not_measured
    mem_bar = ""
    if peak is not None and cap is not None and cap > 0:
        share = peak / cap * 100
        mem_note = f"of {cap:,.2f} GiB capacity ({share:.1f}%)"
        mem_bar = _share_bar(share, f"{share:.1f}% of capacity")
    elif peak is not None:
        mem_note = "capacity not measured"
    if from_allocations and peak is not None:
        program = _str(metrics.get("peak_memory_program"))
        ran = ("in the measured steps" if metrics.get("step_time_ms") is not None else
               "in the capture")
        mem_note = (f"live buffers of {program}, the largest program run {ran} "
                    f"(get_peak_allocations); {mem_note}" if program else
                    f"largest compiled-program allocation (get_peak_allocations); {mem_note}")

    if cpu and _str(metrics.get("device_idle_window")) == "capture window":
        # No step markers: the XLA:CPU threads' idle share of the capture window.
        idle_card = _metric_card(
            "Device idle",
            _fmt_pct(idle),
            "of the capture window, XLA:CPU idle (timeline; no step markers)"
            if idle is not None else not_measured,
        )
    elif cpu:
        idle_card = _metric_card(
            "Host wait (device idle)",
            _fmt_pct(idle),
            "of each step, XLA:CPU idle" if idle is not None else not_measured,
        )
    else:
        window = _str(metrics.get("device_idle_window"))
        source = _str(metrics.get("device_idle_source"))
        note = ("of each step" if window == "steps" else "of the capture window")
        if source:
            note += f" ({source})"
        idle_card = _metric_card(
            "Device idle",
            _fmt_pct(idle),
            _e(note) if idle is not None else not_measured,
        )

    if not risk:
        risk_note = not_measured
    elif cap is None:
        risk_note = "memory capacity not measured"
    else:
        risk_note = "peak memory vs capacity"

    cards = [
        _metric_card(
            "Step time",
            _fmt_ms(step),
            _step_note(metrics) if step is not None else not_measured,
        ),
        idle_card,
        _metric_card(
            "Roofline efficiency",
            _fmt_pct(roof),
            "achieved vs attainable FLOP rate" if roof is not None else not_measured,
        ),
        _metric_card(mem_label, _fmt_mem_gib(peak), _e(mem_note), mem_bar),
        _metric_card(
            "OOM risk",
            f'<span class="risk-{_e(risk)}">{_e(risk)}</span>' if risk else _na(not_measured),
            risk_note,
        ),
    ]

    summary = _str(analysis.get("summary"))
    summary_html = (
        f'<p class="summary">{_prose(summary)}</p>'
        if summary
        else '<p class="summary why">No summary was written for this session.</p>'
    )
    not_judged = [item for item in _list(analysis.get("not_judged")) if item]
    if not_judged:
        items = "".join(f"<li>{_prose(item)}</li>" for item in not_judged)
        judged = (
            '<div class="notjudged"><h4>Not judged (missing data is not evidence of health)</h4>'
            f"<ul>{items}</ul></div>"
        )
    else:
        judged = '<p class="why">Every triage criterion had data; nothing was left unjudged.</p>'
    return _section(
        "summary",
        "Analysis summary",
        summary_html + f'<div class="cards">{"".join(cards)}</div>' + _render_checks(analysis)
        + judged + _render_collection_note(analysis, snapshot),
    )


def _step_note(metrics: Mapping[str, Any]) -> str:
    """Average per step, with the same steps' spread and outliers when they were measured."""
    spread = _map(metrics.get("step_time_spread"))
    if not spread:
        return "average per step"
    note = (f"average of {spread.get('steps')} steps; ± {spread.get('stddev_ms')} ms, "
            f"{spread.get('min_ms')}–{spread.get('max_ms')} ms")
    outliers = _list(spread.get("outliers"))
    if outliers:
        worst = _map(outliers[0])
        note += (f"; {spread.get('outlier_count')} outlier step(s) over "
                 f"{spread.get('outlier_threshold_ms')} ms, slowest #{worst.get('step_index')} "
                 f"at {worst.get('step_time_ms')} ms")
    return _e(note)


def _render_checks(analysis: Mapping[str, Any]) -> str:
    """Every OPTIMAL check with its measured value, threshold, source and result."""
    checks = [c for c in _list(analysis.get("checks")) if isinstance(c, Mapping)]
    if not checks:
        return ""
    rows = []
    for c in checks:
        passed = c.get("passed")
        result = ('<span class="st st-DATA">passed</span>' if passed is True else
                  '<span class="st st-ERROR">failed</span>' if passed is False else
                  '<span class="st st-NO_DATA">not judged</span>')
        value = c.get("value")
        shown = _na("no data") if value is None or passed is None and value == "UNKNOWN" else (
            _e(f"{value:g}") if isinstance(value, int | float) else _e(str(value)))
        rows.append(f"<tr><td>{_e(_str(c.get('check')))}</td><td class=\"num\">{shown}</td>"
                    f"<td class=\"nw\">{_e(_str(c.get('target')))}</td><td>{result}</td>"
                    f"<td>{_e(_str(c.get('source')))}</td></tr>")
    over = _str(_map(analysis.get("metrics")).get("judged_over"))
    caption = (f'<p class="why">Judged over the {_e(over)}.</p>' if over else "")
    return ('<h3>Health checks</h3><table class="checks"><thead><tr><th>Check</th>'
            '<th class="num">Measured</th><th>Threshold</th><th>Result</th><th>Source</th>'
            f'</tr></thead><tbody>{"".join(rows)}</tbody></table>{caption}')


def _render_collection_note(analysis: Mapping[str, Any], snapshot: Mapping[str, Any]) -> str:
    """How long collection took and what it had to cut, with the reasons."""
    info = _map(analysis.get("collection") or snapshot.get("collection"))
    elapsed = info.get("elapsed_ms", snapshot.get("elapsed_ms"))
    size = _measured(info.get("session_bytes"))
    budget = _measured(info.get("memory_budget_bytes"))
    peak = _measured(info.get("worker_peak_rss_bytes"))
    ms = _measured(elapsed)
    took = (f"{ms / 1000:,.1f} s" if ms is not None and ms >= 1000 else _fmt_ms(elapsed))
    parts = [f"Collection took {took}"]
    if size is not None:
        parts.append(f"for {size / 1024**2:,.1f} MB of xplanes")
    job = _map(info.get("collect_job"))
    if job:
        parts.append(f"in the collect job (a Cloud Run job), because {_prose(job.get('why'))}")
    line = " ".join(parts)
    if peak is not None and budget is not None:
        line += (f"; the largest worker process peaked at {peak / 1024**3:,.2f} GiB "
                 f"(memory budget {budget / 1024**3:,.2f} GiB)")
    items = []
    for kind, label in (("killed", "Stopped"), ("skipped", "Skipped"), ("degraded", "Degraded")):
        for entry in _list(info.get(kind)):
            e = _map(entry)
            what = e.get("job") or e.get("tools")
            items.append(f'<li>{label}: <span class="mono">{_e(what)}</span>: '
                         f"{_prose(e.get('reason'))}</li>")
    if not items:
        return f'<p class="why">{line}; no tool was skipped, stopped or degraded.</p>'
    return (f'<div class="notjudged"><h4>{line}. What collection had to cut</h4>'
            f'<ul>{"".join(items)}</ul></div>')


# ---------------------------------------------------------------- 2. findings


def _finding_key(finding: Mapping[str, Any]) -> tuple[int, float]:
    rank = _PRIORITY_RANK.get(_str(finding.get("priority")).upper(), len(_PRIORITY_RANK))
    impact = _measured(_map(finding.get("impact")).get("value"))
    return rank, -(impact if impact is not None else -1.0)


def _render_finding(finding: Mapping[str, Any]) -> str:
    priority = _str(finding.get("priority")).upper()
    prio_css = priority if priority in _PRIORITY_RANK else ""
    evidence_rows = []
    for item in _list(finding.get("evidence")):
        ev = _map(item)
        evidence_rows.append(
            (
                f'<span class="mono">{_breakable(ev.get("tool"))}</span>',
                _breakable(ev.get("field")),
                _evidence_value(ev.get("value")),
            )
        )
    evidence = (
        _table(
            [("Tool", "mono ev"), ("Field", "mono ev"), ("Value", "mono")],
            evidence_rows,
            collapse_after=8,
        )
        if evidence_rows
        else '<p class="why">No evidence was attached to this finding.</p>'
    )
    impact = _map(finding.get("impact"))
    impact_value = _measured(impact.get("value"))
    headline = ""
    if impact_value is not None:
        unit = _str(impact.get("unit"))
        # An upper bound (roofline headroom, a fused transpose's whole fusion) says so.
        bound = "up to " if impact.get("upper_bound") else ""
        headline = (f'<div class="impact">{bound}'
                    f'{_e(f"{impact_value:,.2f}".rstrip("0").rstrip("."))}')
        separator = "" if unit.startswith("%") else " "
        headline += f"{separator}{_e(unit)}</div>" if unit else "</div>"
    impact_text = _str(impact.get("text"))
    fix = _str(finding.get("fix"))
    what = _str(finding.get("what"))
    return (
        f'<article class="finding {prio_css}"><h3>'
        f'<span class="prio {prio_css}">{_e(priority or "P?")}</span>'
        f"<span>{_e(finding.get('title') or 'Untitled finding')}</span>"
        f'<span class="chip">{_e(finding.get("category") or "other")}</span>'
        f'<span class="chip">{_e(finding.get("id"))}</span></h3>'
        '<div class="fgrid">'
        f"<div><h4>What's happening</h4><p>{_prose(what) or _na('not stated')}</p></div>"
        f"<div><h4>Evidence</h4>{evidence}</div>"
        f"<div><h4>Expected impact &amp; fix</h4>{headline}"
        f"<p>{_prose(impact_text)}</p>"
        f"<p><strong>Fix:</strong> {_prose(fix) or _na('no fix proposed')}</p></div>"
        "</div></article>"
    )


def _render_findings(analysis: Mapping[str, Any]) -> str:
    findings = [_map(f) for f in _list(analysis.get("findings")) if isinstance(f, Mapping)]
    findings.sort(key=_finding_key)
    if findings:
        body = "".join(_render_finding(f) for f in findings)
    elif analysis.get("status") == "OPTIMAL":
        body = '<p class="why">No bottleneck was found: the triage criteria for OPTIMAL hold.</p>'
    else:
        body = '<p class="why">No findings were produced for this session.</p>'
    return _section("bottlenecks", "Prioritized bottlenecks", body)


# ---------------------------------------------------------------- 3a. roofline


def _log_ticks(lo: float, hi: float) -> list[float]:
    return [10.0**k for k in range(round(math.log10(lo)), round(math.log10(hi)) + 1)]


def _tick_label(value: float) -> str:
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:g}{suffix}"
    return f"{value:g}"


def _on_chart(point: tuple[float, float]) -> bool:
    # Bounds far outside any real device keep the log axes finite on corrupt input.
    return 1e-9 <= point[0] <= 1e9 and 1e-9 <= point[1] <= 1e12


def _op_point(op: Mapping[str, Any]) -> tuple[float, float] | None:
    # The per-op rows carry no measured FLOP rate; achieved = attainable x efficiency.
    # Efficiencies above 100% come from ops with near-zero time and are not plottable.
    x = _measured(op.get("bottleneck_operational_intensity_flop_per_byte")) or _measured(
        op.get("operational_intensity_flop_per_byte")
    )
    optimal = _measured(op.get("optimal_flop_rate_gflops"))
    eff = _measured(op.get("roofline_efficiency_percent"))
    if not x or not optimal or not eff or eff > 100:
        return None
    point = (x, optimal * eff / 100)
    return point if _on_chart(point) else None


def _roofline_svg(
    peak_gflops: float,
    bw_gbs: float,
    program: tuple[float, float] | None,
    ops: list[tuple[str, str, float, float]],
) -> str:
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

    parts = [
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="Roofline chart">',
        f'<rect x="{left}" y="{top}" width="{width - left - right}" '
        f'height="{height - top - bottom}" fill="#fff" stroke="#d1d9e0"/>',
    ]
    for tick in _log_ticks(x_lo, x_hi):
        x = px(tick)
        parts.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{height - bottom}" stroke="#eaeef2"/>'
            f'<text x="{x:.1f}" y="{height - bottom + 14}" text-anchor="middle">'
            f"{_e(_tick_label(tick))}</text>"
        )
    for tick in _log_ticks(y_lo, y_hi):
        y = py(tick)
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#eaeef2"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_e(_tick_label(tick))}</text>'
        )
    parts.append(
        f'<text x="{(left + width - right) / 2:.0f}" y="{height - 8}" text-anchor="middle">'
        "Operational intensity (FLOP/byte)</text>"
        f'<text transform="translate(14 {(top + height - bottom) / 2:.0f}) rotate(-90)" '
        'text-anchor="middle">Performance (GFLOP/s)</text>'
    )
    roof_start = max(x_lo, y_lo / bw_gbs)
    parts.append(
        f'<polyline fill="none" stroke="#24292f" stroke-width="2" points="'
        f"{px(roof_start):.1f},{py(bw_gbs * roof_start):.1f} {px(ridge):.1f},{py(peak_gflops):.1f} "
        f'{px(x_hi):.1f},{py(peak_gflops):.1f}"><title>Roofline</title></polyline>'
        f'<line x1="{px(ridge):.1f}" y1="{py(peak_gflops):.1f}" x2="{px(ridge):.1f}" '
        f'y2="{height - bottom}" stroke="#8c959f" stroke-dasharray="4 3"/>'
        f'<text x="{px(ridge) + 4:.1f}" y="{height - bottom - 6}">'
        f"ridge {_e(f'{ridge:,.1f}')} FLOP/B</text>"
        f'<text x="{width - right - 4}" y="{py(peak_gflops) - 6:.1f}" text-anchor="end">'
        f"compute roof {_e(_fmt_si(peak_gflops * 1e9, 'FLOP/s'))}</text>"
    )
    slope_x = math.sqrt(roof_start * ridge)
    angle = -math.degrees(
        math.atan2(py(bw_gbs * roof_start) - py(peak_gflops), px(ridge) - px(roof_start))
    )
    parts.append(
        f'<text transform="translate({px(slope_x):.1f} {py(bw_gbs * slope_x) - 6:.1f}) '
        f'rotate({angle:.1f})" text-anchor="middle">'
        f"HBM {_e(f'{bw_gbs:,.0f}')} GB/s</text>"
    )
    labels: dict[tuple[int, int], list[str]] = {}
    for rank, name, x, y in ops:
        cx, cy = px(x), py(y)
        parts.append(
            f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4.5" fill="#0969da" fill-opacity=".75" '
            f'stroke="#fff"><title>#{_e(rank)} {_e(name)}: {_e(f"{x:.4g}")} FLOP/B, '
            f"{_e(f'{y:.4g}')} GFLOP/s</title></circle>"
        )
        labels.setdefault((round(cx / 6), round(cy / 6)), []).append(rank)
    for (gx, gy), ranks in labels.items():
        parts.append(
            f'<text x="{gx * 6 + 7}" y="{gy * 6 - 5}" class="mono" fill="#0969da">'
            f"{_e(','.join(ranks))}</text>"
        )
    if program:
        cx, cy = px(program[0]), py(program[1])
        parts.append(
            f'<circle class="program-point" cx="{cx:.1f}" cy="{cy:.1f}" r="7" fill="#cf222e" '
            f'stroke="#fff" stroke-width="2"><title>program: {_e(f"{program[0]:.4g}")} FLOP/B, '
            f"{_e(f'{program[1]:.4g}')} GFLOP/s</title></circle>"
            f'<text x="{cx + 10:.1f}" y="{cy + 4:.1f}" fill="#cf222e" font-weight="700">'
            "program</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _render_roofline(snapshot: Mapping[str, Any], device_type: str) -> str:
    entry = _tool(snapshot, "get_roofline_model")
    data = _data(entry)
    if data is None:
        return _why_absent(
            "get_roofline_model", entry, device_type, "CPU profile: XProf has no roofline for CPU."
        )
    device = _map(data.get("device_info")) or _map(_data(_tool(snapshot, "get_device_information")))
    program = _map(data.get("program"))
    peak = _measured(device.get("peak_flop_rate"))
    bw_gibs = _measured(device.get("peak_hbm_bw_gibs"))

    program_point: tuple[float, float] | None = None
    prog_x = _measured(program.get("bottleneck_operational_intensity_flop_per_byte")) or (
        _measured(program.get("operational_intensity_flop_per_byte"))
    )
    prog_y = _measured(program.get("measured_flop_rate_gflops"))
    if prog_x and prog_y and _on_chart((prog_x, prog_y)):
        program_point = (prog_x, prog_y)

    op_rows = [_map(op) for op in _list(data.get("top_operations")) if isinstance(op, Mapping)]
    plotted: list[tuple[str, str, float, float]] = []
    table_rows = []
    for index, op in enumerate(op_rows[:12]):
        rank = str(op.get("rank") or index + 1)
        point = _op_point(op)
        if point is not None:
            plotted.append((rank, _str(op.get("name")), point[0], point[1]))
        # Headroom: the self time it would save at its roofline (time x (1 - efficiency)).
        eff_value = _measured(op.get("roofline_efficiency_percent"))
        self_ms = _measured(op.get("total_self_time_ms"))
        headroom = (_fmt_ms(self_ms * max(0.0, 1.0 - eff_value / 100.0))
                    if point and eff_value is not None and self_ms is not None
                    else _na("zero FLOPs: its cost is the bytes it moves"))
        table_rows.append(
            (
                _e(rank),
                _e(op.get("name")),
                _e(op.get("category")),
                _fmt_ms(op.get("total_self_time_ms")),
                _fmt_pct(op.get("total_self_time_percent")),
                _fmt_plain(op.get("bottleneck_operational_intensity_flop_per_byte"), 3),
                _fmt_plain(point[1], 2) if point else _na("not plottable"),
                _fmt_pct(op.get("roofline_efficiency_percent"))
                if point
                else _na("not plottable: zero FLOPs or implausible efficiency"),
                headroom,
                _e(op.get("bound_by")),
            )
        )

    if peak and bw_gibs and _on_chart((peak / (bw_gibs * _GB_PER_GIB), peak)):
        bw_gbs = bw_gibs * _GB_PER_GIB
        chart = _roofline_svg(peak, bw_gbs, program_point, plotted)
        legend = (
            '<p class="legend"><span class="dot prog"></span>program'
            '<span class="dot ops"></span>top ops (label = rank; '
            "ops with zero FLOPs cannot sit on a log axis and are listed only in the table)</p>"
        )
    else:
        chart = (
            '<p class="why">The device peak FLOP rate or HBM bandwidth is unknown, '
            "so no roofline can be drawn.</p>"
        )
        legend = ""

    facts = [
        ("Bound by", _e(program.get("bound_by") or "unknown")),
        ("Roofline efficiency", _fmt_pct(program.get("roofline_efficiency_percent"))),
        ("Measured FLOP rate", _with_unit(program.get("measured_flop_rate_gflops"), "GFLOP/s")),
        ("Attainable FLOP rate", _with_unit(program.get("optimal_flop_rate_gflops"), "GFLOP/s")),
        (
            "Op. intensity (bottleneck / all spaces)",
            _fmt_plain(program.get("bottleneck_operational_intensity_flop_per_byte"), 4)
            + " / "
            + _fmt_plain(program.get("operational_intensity_flop_per_byte"), 4)
            + " FLOP/B",
        ),
        (
            "Ridge point",
            _with_unit(program.get("bound_by_ridge_point_flop_per_byte"), "FLOP/B"),
        ),
        ("HBM bandwidth used", _with_unit(program.get("hbm_bw_gibs"), "GiB/s")),
        ("HBM bandwidth peak", _with_unit(bw_gibs, "GiB/s")),
        ("Peak compute", _fmt_si((peak or 0) * 1e9, "FLOP/s") if peak else _na()),
        ("Compute efficiency", _fmt_pct(program.get("compute_efficiency_percent"))),
        ("FLOPs provenance", _e(program.get("flops_provenance") or "unknown")),
        ("Device", _e(device.get("device_type") or device_type or "unknown")),
    ]
    kv = '<dl class="kv">' + "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"
    table = _table(
        [
            ("#", "num"),
            ("Op", "mono op"),
            ("Category", ""),
            ("Self time", "num"),
            ("% time", "num"),
            ("Bottleneck OI (FLOP/B)", "num"),
            ("Achieved GFLOP/s", "num"),
            ("Roofline eff.", "num"),
            ("Headroom at roofline", "num"),
            ("Bound by", ""),
        ],
        table_rows,
        collapse_after=6,
    )
    return f'<div class="chartrow">{chart}<div>{kv}</div></div>{legend}<h4>Top ops</h4>{table}'


# ---------------------------------------------------------------- 3b. memory


def _memory_bar(peak: float, cap: float, stack: float | None, heap: float | None) -> str:
    width, bar_h, left = 560, 26, 0
    scale = width / max(cap, peak)
    parts = [
        f'<svg width="{width}" height="{bar_h + 24}" viewBox="0 0 {width} {bar_h + 24}" '
        'role="img" aria-label="Peak memory versus capacity">',
        f'<rect x="{left}" y="0" width="{cap * scale:.1f}" height="{bar_h}" fill="#eaeef2"/>',
    ]
    segments: list[tuple[float, str, str]] = []
    if stack is not None and heap is not None and abs(stack + heap - peak) < 0.05 * max(peak, 1):
        segments = [(stack, "#0969da", "stack reservation"), (heap, "#54aeff", "heap")]
    else:
        segments = [(peak, "#0969da", "peak usage")]
    x = float(left)
    for size, color, label in segments:
        parts.append(
            f'<rect x="{x:.1f}" y="0" width="{size * scale:.1f}" height="{bar_h}" fill="{color}">'
            f"<title>{_e(label)}: {_e(f'{size:.2f}')} GiB</title></rect>"
        )
        x += size * scale
    share = peak / cap * 100 if cap else 0
    parts.append(
        f'<line x1="{cap * scale - 1:.1f}" y1="-2" x2="{cap * scale - 1:.1f}" y2="{bar_h + 2}" '
        'stroke="#cf222e" stroke-width="2"/>'
        f'<text x="0" y="{bar_h + 16}">peak {_e(f"{peak:.2f}")} GiB ({_e(f"{share:.1f}")}%)</text>'
        f'<text x="{width - 2}" y="{bar_h + 16}" text-anchor="end">capacity '
        f"{_e(f'{cap:.2f}')} GiB</text></svg>"
    )
    return "".join(parts)


def _render_memory(snapshot: Mapping[str, Any], device_type: str) -> str:
    entry = _tool(snapshot, "get_memory_profile")
    data = _data(entry)
    parts: list[str] = []
    if data is None:
        parts.append(
            _why_absent(
                "get_memory_profile",
                entry,
                device_type,
                "CPU profile: XProf records no device memory profile for CPU.",
            )
        )
    else:
        details = _map(data.get("peak_usage_details"))
        peak = _measured(data.get("peak_memory_usage_gib"))
        cap = _measured(data.get("memory_capacity_gib"))
        if peak is not None and cap:
            parts.append(
                _memory_bar(
                    peak,
                    cap,
                    _measured(details.get("stack_reservation_gib")),
                    _measured(details.get("heap_allocation_gib")),
                )
            )
        else:
            parts.append(
                '<p class="why">Peak usage or capacity is unknown, so no bar is drawn.</p>'
            )
        facts = [
            ("Peak usage", _fmt_gib(peak)),
            ("Capacity", _fmt_gib(cap)),
            ("Utilization at peak", _fmt_pct(details.get("utilization_percent"))),
            ("Stack reservation", _fmt_gib(details.get("stack_reservation_gib"))),
            ("Heap allocation", _fmt_gib(details.get("heap_allocation_gib"))),
            (
                "Allocator free at peak",
                _fmt_gib(details.get("free_memory_gib"))
                + '<span class="subnote">memory free inside the allocator\'s reserved pool at '
                "the peak (XProf <code>peak_usage_details.free_memory_gib</code>), not capacity "
                "minus peak</span>",
            ),
            ("Fragmentation", _fmt_pct(details.get("fragmentation_percent"))),
        ]
        if peak is not None and cap and cap >= peak:
            facts.insert(
                2,
                (
                    "Headroom (capacity − peak)",
                    _fmt_gib(cap - peak)
                    + '<span class="subnote">device memory not in use at the peak</span>',
                ),
            )
        parts.append(
            '<dl class="kv">' + "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"
        )

    alloc_entry = _tool(snapshot, "get_peak_allocations")
    alloc = _data(alloc_entry)
    buffers_title = (
        "Largest buffers of the compiled programs (get_peak_allocations)"
        if _is_cpu(device_type)
        else "Top buffers at peak (get_peak_allocations)"
    )
    parts.append(f'<h4 class="gap">{_e(buffers_title)}</h4>')
    if alloc is None:
        parts.append(
            _why_absent(
                "get_peak_allocations",
                alloc_entry,
                device_type,
                "CPU profile: XProf has no HLO buffer assignment for CPU devices.",
            )
        )
        return "".join(parts)
    modules = [_map(m) for m in _list(alloc.get("modules")) if isinstance(m, Mapping)]
    buffers = []
    for module in modules:
        for buf in _list(module.get("top_buffers")):
            b = _map(buf)
            buffers.append((_measured(b.get("size_mib")) or 0.0, module, b))
    buffers.sort(key=lambda item: item[0], reverse=True)
    parts.append(
        _table(
            [("Buffer (instruction)", "mono"), ("HLO module", "mono"), ("Size", "num")],
            (
                (_e(b.get("instruction")), _e(m.get("module_name")), _fmt_mib(b.get("size_mib")))
                for _, m, b in buffers
            ),
            collapse_after=10,
        )
    )
    if modules:
        parts.append(
            f"<details><summary>{'Memory' if _is_cpu(device_type) else 'HBM'} by module "
            f"({len(modules)} modules)</summary>"
            + _table(
                [("HLO module", "mono"), ("Total" if _is_cpu(device_type) else "Total HBM", "num")],
                ((_e(m.get("module_name")), _fmt_mib(m.get("total_hbm_mib"))) for m in modules),
            )
            + "</details>"
        )
    return "".join(parts)


# ---------------------------------------------------------------- 3c. HLO op profile


def _category_chart(rows: list[tuple[str, float, float | None]]) -> str:
    label_w, bar_w, value_w, row_h = 170, 330, 190, 20
    width = label_w + bar_w + value_w
    height = row_h * len(rows) + 6
    top = max((frac for _, frac, _ in rows), default=0.0) or 1.0
    parts = [
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="Time by HLO category">'
    ]
    for i, (category, frac, ms) in enumerate(rows):
        y = i * row_h + 3
        shown = category if len(category) <= 24 else category[:23] + "…"
        bar = max(bar_w * frac / top, 1.0 if frac > 0 else 0.0)
        ms_text = f" · {_ms_text(ms)}" if ms is not None else ""
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end" class="mono">'
            f"<title>{_e(category)}</title>{_e(shown)}</text>"
            f'<rect x="{label_w}" y="{y + 2}" width="{bar:.1f}" height="{row_h - 6}" rx="2" '
            f'fill="{"#8c959f" if category.upper() == "IDLE" else "#0969da"}"/>'
            f'<text x="{label_w + bar + 6:.1f}" y="{y + 13}" class="mono">'
            f"{_e(f'{frac * 100:.1f}%')}{_e(ms_text)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _split_op_path(name: str) -> tuple[str, str]:
    # Grouped names look like by_program/<module>/<category>/.../<op>.
    segments = name.split("/")
    module = segments[1] if len(segments) >= 3 and segments[0] == "by_program" else ""
    return segments[-1], module


def _render_hlo_ops(snapshot: Mapping[str, Any], device_type: str) -> str:
    entry = _tool(snapshot, "get_hlo_op_profile")
    data = _data(entry)
    if data is None:
        return _why_absent(
            "get_hlo_op_profile",
            entry,
            device_type,
            "CPU profile: XProf builds no HLO op profile for CPU devices.",
        )
    total_ms = _measured(data.get("total_profile_time_ms"))
    cats: list[tuple[str, float, float | None]] = []
    for item in _list(data.get("category_summary")):
        cat = _map(item)
        ms = _measured(cat.get("total_self_time_ms"))
        frac = _measured(cat.get("fraction_of_total_time"))
        if frac is None and ms is not None and total_ms:
            frac = ms / total_ms
        if frac is None:
            continue
        cats.append((_str(cat.get("category")) or "?", frac, ms))
    cats.sort(key=lambda c: c[1], reverse=True)
    parts = [f'<p>Total profiled device time: <span class="mono">{_fmt_ms(total_ms)}</span></p>']
    if len(cats) > 14:
        rest = cats[13:]
        rest_ms = [c[2] for c in rest if c[2] is not None]
        cats = cats[:13] + [
            (f"{len(rest)} other categories", sum(c[1] for c in rest), sum(rest_ms))
        ]
    parts.append(
        _category_chart(cats)
        if cats
        else '<p class="why">category_summary is empty: no per-category times to chart.</p>'
    )

    ops: list[Mapping[str, Any]] = []
    for group in _map(data.get("grouped_operations")).values():
        ops.extend(_map(op) for op in _list(group) if isinstance(op, Mapping))
    ops.sort(key=lambda op: _measured(op.get("total_self_time_ms")) or 0.0, reverse=True)
    if ops:
        rows = []
        for op in ops[:25]:
            full = _str(op.get("name"))
            short, module = _split_op_path(full)
            ms = _measured(op.get("total_self_time_ms"))
            source = _str(op.get("source_file"))
            line = op.get("source_line")
            src = f"{source.rsplit('/', 1)[-1]}:{line}" if source else ""
            rows.append(
                (
                    f'<span title="{_e(full)}">{_e(short)}</span>',
                    _e(module),
                    _e(op.get("category")),
                    _fmt_ms(ms),
                    _fmt_pct(ms / total_ms * 100) if ms is not None and total_ms else _na(),
                    _e(op.get("occurrences")),
                    _fmt_si(op.get("flops")),
                    _fmt_si(op.get("bytes_accessed"), "B"),
                    f'<span title="{_e(source)}">{_e(src)}</span>',
                )
            )
        parts.append("<h4>Top ops by self time</h4>")
        parts.append(
            _table(
                [
                    ("Op", "mono op"),
                    ("Module", "mono"),
                    ("Category", ""),
                    ("Self time", "num"),
                    ("% time", "num"),
                    ("Count", "num"),
                    ("FLOPs", "num"),
                    ("Bytes", "num"),
                    ("Source", "mono"),
                ],
                rows,
                collapse_after=10,
            )
        )
    return "".join(parts)


# ---------------------------------------------------------------- 3d. kernel stats


def _kernel_records(data: object) -> list[Mapping[str, Any]]:
    # xprof returns a bare list, or an object with kernel_records when include_summary is set;
    # our get_kernel_stats follow-up returns {"kernel_count", "total_kernel_time_us", "kernels"}.
    if isinstance(data, list):
        source: object = data
    else:
        mapping = _map(data)
        source = mapping.get("kernels")
        if source is None:
            source = mapping.get("kernel_records")
    return [_map(r) for r in _list(source) if isinstance(r, Mapping)]


def _short_kernel_name(name: str) -> str:
    """``void ns::Kernel<huge template>(args)`` -> ``ns::Kernel<…>(…)``."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    out: list[str] = []
    depth = 0
    for char in text:
        if char in "<(":
            if depth == 0:
                out.append(char + "…" + (">" if char == "<" else ")"))
            depth += 1
        elif char in ">)":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(char)
    short = "".join(out).strip()
    return short if len(short) <= 90 else short[:89] + "…"


def _kernel_name_cell(record: Mapping[str, Any]) -> str:
    full = _str(record.get("kernel_name")) or _str(record.get("raw_name"))
    shown = _str(record.get("canonical_name")) or _short_kernel_name(full) or "?"
    op_name = _str(record.get("op_name"))
    op = f'<span class="subnote">op: <code>{_e(op_name)}</code></span>' if op_name else ""
    if not full or full == shown:
        return f"{_e(shown)}{op}"
    return (
        f'<details class="kname"><summary>{_e(shown)}</summary>'
        f'<pre class="mono">{_e(full)}</pre></details>{op}'
    )


def _yes_no(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return _na("not recorded")


def _kernel_table(records: list[Mapping[str, Any]]) -> str:
    rows = []
    # A trace without occupancy data reports 0% for every kernel: that is "not recorded",
    # not a measurement.
    occupancy_valid = any((_measured(r.get("occupancy_pct")) or 0) > 0 for r in records)
    for index, r in enumerate(records):
        rank = _measured(r.get("rank"))
        occurrences = r.get("occurrences", r.get("execution_count"))
        rows.append(
            (
                _e(f"{rank:g}" if rank is not None else index + 1),
                _kernel_name_cell(r),
                _fmt_plain(r.get("total_duration_us"), 1),
                _fmt_plain(r.get("avg_duration_us"), 2),
                _fmt_plain(occurrences, 0),
                _fmt_pct(r.get("occupancy_pct")) if "occupancy_pct" in r and occupancy_valid
                else _na("not recorded"),
                f'{_yes_no(r.get("is_op_tensor_core_eligible"))} / '
                f'{_yes_no(r.get("is_kernel_using_tensor_core"))}',
                _e(" / ".join(_str(r.get(k)) for k in ("grid_dim", "block_dim") if r.get(k))),
            )
        )
    return _table(
        [
            ("#", "num"),
            ("Kernel", "mono op"),
            ("Total µs", "num"),
            ("Avg µs", "num"),
            ("Occurrences", "num"),
            ("Occupancy", "num"),
            ("TensorCore eligible / used", ""),
            ("Grid / block", "mono nw"),
        ],
        rows,
        collapse_after=10,
    )


def _follow_ups(analysis: Mapping[str, Any], prefix: str) -> list[Mapping[str, Any]]:
    return [
        _map(f)
        for f in _list(analysis.get("follow_ups"))
        if isinstance(f, Mapping) and _str(f.get("tool")).startswith(prefix)
    ]


def _follow_up_lines(
    follow_ups: list[Mapping[str, Any]],
    shown_above: Callable[[Mapping[str, Any]], bool] | None = None,
) -> str:
    def result(f: Mapping[str, Any]) -> str:
        # A follow-up whose data is already rendered as a table would only repeat it here
        # as a truncated one-line dict.
        if shown_above is not None and shown_above(f):
            return '<span class="why">shown in the table above</span>'
        return _e(f.get("result_summary"))

    rows = (
        (
            f'<span class="mono">{_e(f.get("tool"))}</span>',
            _status_chip(f.get("status")),
            _e(f.get("purpose")),
            result(f),
        )
        for f in follow_ups
    )
    return _table([("Follow-up", ""), ("Status", ""), ("Purpose", ""), ("Result", "mono")], rows)


def _has_kernels(follow_up: Mapping[str, Any]) -> bool:
    return follow_up.get("status") == "DATA" and bool(_kernel_records(follow_up.get("data")))


def _render_kernels(
    analysis: Mapping[str, Any], snapshot: Mapping[str, Any], device_type: str
) -> str:
    entry = _tool(snapshot, "get_kernel_stats")
    follow = _follow_ups(analysis, "get_kernel_stats")
    parts: list[str] = []
    records = _kernel_records(entry.get("data")) if entry.get("status") == "DATA" else []
    follow_data = next((_map(f.get("data")) for f in follow if _has_kernels(f)), None)
    if records:
        parts.append(_kernel_table(records))
    elif follow_data is not None:
        count = _measured(follow_data.get("kernel_count"))
        total = _measured(follow_data.get("total_kernel_time_us"))
        shown = _kernel_records(follow_data)
        facts = []
        if count is not None:
            facts.append(f"<b>{_e(f'{count:,.0f}')}</b> distinct kernels")
        if total is not None:
            facts.append(f"<b>{_e(f'{total:,.1f}')} µs</b> total kernel time")
        if count is not None and count > len(shown):
            facts.append(f"top {len(shown)} by total time shown")
        if facts:
            parts.append(f"<p>{', '.join(facts)}.</p>")
        parts.append(_kernel_table(shown))
    elif entry:
        info = _str(_map(entry.get("data")).get("info"))
        if entry.get("status") == "DATA" and info:
            parts.append(f'<p class="why">{_e(info)}</p>')
        else:
            parts.append(
                _why_absent("get_kernel_stats", entry, device_type, "CPU profile: no GPU kernels.")
            )
    if follow:
        rendered = follow_data is not None and not records
        parts.append(_follow_up_lines(follow, _has_kernels if rendered else None))
    if not parts:
        reason = (
            "Not collected: get_kernel_stats is a follow-up tool and the investigator did not "
            "call it"
        )
        if _is_cpu(device_type):
            reason += "; a CPU profile has no GPU kernels."
        else:
            reason += "."
        parts.append(f'<p class="why">{_e(reason)}</p>')
    return "".join(parts)


# ---------------------------------------------------------------- 3e. detectors


def _join(value: object) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return "" if value is None else str(value)


def _transition(detection: Mapping[str, Any], field: str, gap: str = " ") -> str:
    """``input_<field> → output_<field>``; older detections carry a ``<field>s`` list."""
    before, after = detection.get(f"input_{field}"), detection.get(f"output_{field}")
    if before is None and after is None:
        return _e(_join(detection.get(f"{field}s")))
    return f"{_e(before) or '?'}{gap}→ {_e(after) or '?'}"


def _detection_row(d: Mapping[str, Any]) -> tuple[tuple[str, ...], str]:
    ran = d.get("executed_in_profile") is not False
    instruction = _e(d.get("instruction"))
    inner = _str(d.get("inner_instruction"))
    if inner and inner != d.get("instruction"):
        instruction += f'<span class="subnote">via <code>{_e(inner)}</code></span>'
    source = _str(d.get("source"))
    if source:
        instruction += f'<span class="subnote">{_e(source)}</span>'
    if ran:
        time_cell, pct_cell = _fmt_ms(d.get("time_ms")), _fmt_pct(d.get("percent_of_step"))
    else:
        time_cell = '<span class="subnote">did not run while profiling</span>'
        pct_cell = _na("did not run while profiling")
    size = _measured(d.get("bytes"))
    row = (
        _e(d.get("module")),
        instruction,
        _e(d.get("opcode")),
        _transition(d, "shape", "<br>").replace(",", ",<wbr>"),
        _transition(d, "layout"),
        _fmt_mib(size / 2**20) if size is not None else "",
        time_cell,
        pct_cell,
        _prose(d.get("description")),
    )
    return row, "" if ran else "noexec"


def _render_detectors(snapshot: Mapping[str, Any], device_type: str) -> str:
    parts: list[str] = []
    for name, label in _DETECTORS:
        entry = _tool(snapshot, name)
        status = entry.get("status")
        data = _map(entry.get("data"))
        detections = [_map(d) for d in _list(data.get("detections")) if isinstance(d, Mapping)]
        header = (
            f'<h4 class="gap">{_e(label)} <span class="mono">({_e(name)})</span> '
            f"{_status_chip(status or 'not run')}</h4>"
        )
        if detections:
            built = [_detection_row(d) for d in detections]
            # Without step markers the shares are of the capture window (device time).
            windowed = all(_str(d.get("share_of")) == "capture window" for d in detections)
            share_header = "% of device time" if windowed else "% of step"
            body = _table(
                [
                    ("Module", "mono id"),
                    ("Instruction", "mono id"),
                    ("Opcode", "mono"),
                    ("Shapes (in → out)", "mono shape"),
                    ("Layouts (in → out)", "mono nw"),
                    ("Bytes", "num"),
                    ("Time", "num"),
                    (share_header, "num"),
                    ("Description", "desc"),
                ],
                [row for row, _ in built],
                collapse_after=8,
                row_classes=[css for _, css in built],
            )
            sources = {_str(d.get("time_source")) for d in detections} | {
                _str(data.get("time_source"))
            }
            sources.discard("")
            if sources:
                body += (
                    '<p class="legend">Time source: '
                    + "; ".join(_e(src) for src in sorted(sources))
                    + "</p>"
                )
        elif status in ("ERROR", "NO_DATA") or not entry:
            body = _why_absent(name, entry, device_type, "")
        elif message := _tool_reason(entry):
            body = f'<p class="why">{_e(message)}</p>'
        else:
            scanned = _measured(data.get("modules_scanned"))
            where = f" ({scanned:,.0f} HLO modules scanned)" if scanned is not None else ""
            body = (
                f'<p class="why">No detections: the HLO has no instance of this pattern{where}.</p>'
            )
        parts.append(header + body)
    return "".join(parts)


# ---------------------------------------------------------------- 3f. custom kernels and LLO


def _render_llo(analysis: Mapping[str, Any], snapshot: Mapping[str, Any], device_type: str) -> str:
    parts: list[str] = []
    roof = _data(_tool(snapshot, "get_roofline_model"))
    custom = [
        _map(op)
        for op in _list(_map(roof).get("top_operations"))
        if isinstance(op, Mapping)
        and (
            "custom" in _str(op.get("category")).lower()
            or _str(op.get("flops_provenance")) in ("derived_from_shapes", "opaque_custom_call")
        )
    ]
    if custom:
        parts.append(
            _table(
                [("Custom call", "mono"), ("Self time", "num"), ("FLOPs provenance", "mono")],
                (
                    (
                        _e(op.get("name")),
                        _fmt_ms(op.get("total_self_time_ms")),
                        _e(op.get("flops_provenance")),
                    )
                    for op in custom
                ),
            )
        )
    elif roof is not None:
        parts.append(
            '<p class="why">No custom calls (Pallas/Mosaic or other kernels) among the '
            "roofline top ops.</p>"
        )
    # The custom calls found in the HLO (LAPACK/FFI on CPU), timed on the timeline.
    calls = [
        _map(c)
        for c in _list(_map(_data(_tool(snapshot, "detect_layout_mismatch_copies"))).get(
            "custom_calls"))
        if isinstance(c, Mapping) and c.get("time_ms") is not None
    ]
    if calls and not custom:
        share = ("Share of device time" if _str(calls[0].get("share_of")) == "capture window"
                 else "Share of step")
        parts.append(
            '<h4 class="gap">Custom calls in the HLO (detect_layout_mismatch_copies '
            "custom_calls): opaque to XLA, counted as 0 FLOPs</h4>"
            + _table(
                [("Custom call", "mono"), ("Target", "mono"), ("Source", "mono"),
                 ("Time", "num"), (share, "num")],
                (
                    (
                        _e(c.get("instruction")),
                        _e(c.get("target")),
                        _e(c.get("source")),
                        _fmt_ms(c.get("time_ms")),
                        _fmt_pct(c.get("percent_of_step")),
                    )
                    for c in calls[:10]
                ),
            )
        )
    llo_tools = [
        _map(v)
        for k, v in _map(snapshot.get("tools")).items()
        if str(k).startswith("llo_") and isinstance(v, Mapping)
    ]
    follow = _follow_ups(analysis, "llo_")
    for entry in llo_tools:
        if entry.get("status") == "ERROR":
            parts.append(_why_absent(_str(entry.get("name")) or "llo", entry, device_type, ""))
    if follow:
        parts.append(_follow_up_lines(follow))
    elif not llo_tools:
        if "tpu" in device_type.lower():
            reason = (
                "No LLO follow-up was run: the investigator did not need instruction-level "
                "(LLO) data for this session."
            )
        else:
            shown = device_type or "unknown device"
            reason = f"LLO_DATA_ABSENT: not a TPU trace ({shown}); LLO exists only on TPU."
        parts.append(f'<p class="why">{_e(reason)}</p>')
    return "".join(parts)


# ---------------------------------------------------------------- 3. overview + assembly


_OVERVIEW_FIELDS = (
    ("device_duty_cycle_percent", "Device duty cycle"),
    ("device_idle_time_percent", "Device idle time"),
    ("mxu_utilization_percent", "MXU utilization"),
    ("flop_rate_utilization_relative_to_roofline", "FLOP rate vs roofline"),
    ("hbm_bw_utilization_percent", "HBM BW utilization"),
    ("bound_by", "Bound by"),
    ("host_idle_time_percent", "Host idle time"),
)


def _render_overview(snapshot: Mapping[str, Any], cpu: bool, device_type: str) -> str:
    data = _data(_tool(snapshot, "get_xprof_overview"))
    if data is None:
        return ""
    perf = _map(data.get("performance_summary"))
    env = _map(data.get("run_environment"))
    step = _measured(perf.get("steptime_ms_average"))
    # XProf reports 0.00 ms when the trace has no steps: that is "unknown", not zero.
    step_text = f"{perf.get('steptime_ms_average')} ms" if step else None
    note = ""
    # One step set per page: every other step figure comes from the annotated steps
    # (get_step_trace and our timeline); say so when the overview's own set disagrees.
    trace = _map(_map(_data(_tool(snapshot, "get_step_trace"))).get("summary"))
    ours, count = _measured(trace.get("step_time_ms_average")), trace.get("total_steps")
    step_note = ""
    if step and ours and abs(step - ours) > 0.02 * ours:
        step_note = (f"<p class=\"why\">XProf's overview step time ({step_text}) averages the "
                     "steps of its op_stats step database, a different set from the annotated "
                     "steps; every other step figure on this page, get_step_trace's included, "
                     f"is over the {_e(count)} annotated steps ({_ms_text(ours)} on "
                     "average).</p>")
    if cpu:
        # Duty cycle, idle, MXU, cores... are device counters XProf does not fill for CPU
        # profiles; they read 0 and would only mislead.
        facts: list[tuple[str, object]] = [
            ("XProf step time (its steps)", step_text),
            ("Device type", env.get("device_type") or device_type),
            ("Hosts", env.get("host_count")),
            ("Training", env.get("is_training")),
        ]
        note = "<p class=\"why\">XProf's device metrics do not apply to CPU profiles.</p>"
    else:
        gpu = _is_gpu(_str(env.get("device_type")) or device_type)
        # Without a roofline ("Bound by: Unknown": no peak FLOP rate for the device) the
        # roofline-relative fields read 0.00% and mean nothing.
        no_roofline = _str(perf.get("bound_by")).strip().lower() in ("", "unknown")
        hidden = {"mxu_utilization_percent"} if gpu else set()
        if no_roofline:
            hidden |= {"flop_rate_utilization_relative_to_roofline",
                       "hbm_bw_utilization_percent", "bound_by"}
            note = ("<p class=\"why\">XProf could not place this program on a roofline (no peak "
                    "FLOP rate for this device), so its roofline-relative metrics are hidden.</p>")
        facts = [("XProf step time (its steps)", step_text)]
        facts += [
            (label, perf.get(key))
            for key, label in _OVERVIEW_FIELDS
            # MXU is a TPU unit: on GPU the field is always 0.
            if key in perf and key not in hidden
        ]
        facts += [
            ("Device type", env.get("device_type")),
            ("Device cores", env.get("device_core_count")),
            ("Hosts", env.get("host_count")),
            ("Training", env.get("is_training")),
        ]
    cells = "".join(
        f"<div><span>{_e(k)}</span><b>{_e(v)}</b></div>" for k, v in facts if v not in (None, "")
    )
    return _tool_block(
        "overview",
        "XProf overview",
        (f'<div class="facts">{cells}</div>' if cells else "") + note + step_note,
    )


def _render_tools(
    analysis: Mapping[str, Any], snapshot: Mapping[str, Any], device_type: str
) -> str:
    body = (
        _render_overview(snapshot, _cpu_profile(analysis, snapshot), device_type)
        + _tool_block("roofline", "Roofline", _render_roofline(snapshot, device_type))
        + _tool_block("memory", "Memory", _render_memory(snapshot, device_type))
        + _tool_block("hlo-ops", "HLO op profile", _render_hlo_ops(snapshot, device_type))
        + _tool_block(
            "kernels", "Kernel statistics", _render_kernels(analysis, snapshot, device_type)
        )
        + _tool_block("detectors", "Our detectors", _render_detectors(snapshot, device_type))
        + _tool_block("llo", "Custom kernels and LLO", _render_llo(analysis, snapshot, device_type))
    )
    return _section("tools", "Detailed tool analysis", body)


# ---------------------------------------------------------------- 4. provenance


def _render_provenance(analysis: Mapping[str, Any], snapshot: Mapping[str, Any]) -> str:
    snap_tools = _map(snapshot.get("tools"))
    listed: dict[str, Mapping[str, Any]] = {}
    for item in _list(analysis.get("tools")):
        tool = _map(item)
        if tool.get("name"):
            listed[str(tool["name"])] = tool
    for name, item in snap_tools.items():
        listed.setdefault(str(name), _map(item))

    rows = []
    for name, tool in listed.items():
        snap = _map(snap_tools.get(name))
        error = tool.get("error") or snap.get("error")
        note = ""
        if error:
            note = f'<span class="err">{_e(error)}</span>'
        elif tool.get("status") == "NO_DATA":
            note = _e(_tool_reason(snap) or _tool_reason(tool))
        rows.append(
            (
                f'<span class="mono">{_e(name)}</span>',
                _status_chip(tool.get("status")),
                _fmt_ms(tool.get("elapsed_ms")),
                note,
            )
        )
    tools_table = _table(
        [("Tool", ""), ("Status", ""), ("Elapsed", "num"), ("Error / note", "")], rows
    )

    follow_rows = []
    for item in _list(analysis.get("follow_ups")):
        f = _map(item)
        args = f.get("args")
        follow_rows.append(
            (
                f'<span class="mono">{_e(f.get("tool"))}</span>',
                _raw(args) if args is not None else "",
                _e(f.get("purpose")),
                _status_chip(f.get("status")),
                _fmt_ms(f.get("elapsed_ms")),
                _e(f.get("result_summary")),
            )
        )
    follow_table = (
        _table(
            [
                ("Tool", ""),
                ("Args", "mono"),
                ("Purpose", ""),
                ("Status", ""),
                ("Elapsed", "num"),
                ("Result", "mono"),
            ],
            follow_rows,
        )
        if follow_rows
        else '<p class="why">No follow-up tool calls were made.</p>'
    )

    session = _map(analysis.get("session"))
    hosts = _list(session.get("hosts"))
    fallback = _map(analysis.get("fallback"))
    check = _map(analysis.get("evidence_check"))
    facts = [
        ("Investigator", analysis.get("investigator")),
        ("Investigator fallback", (f"{_str(fallback.get('from'))} failed, so the rule-based "
                                   f"investigator ran: {_str(fallback.get('reason'))}")
         if fallback else "none"),
        ("Evidence check", (f"{len(_list(check.get('dropped')))} finding(s) dropped, "
                            f"{len(_list(check.get('corrected')))} value(s) corrected against "
                            "the tool outputs") if check else "not needed (rule-based)"),
        ("xprof version", analysis.get("xprof_version") or snapshot.get("xprof_version")),
        ("mldiag version", analysis.get("mldiag_version")),
        ("Schema version", analysis.get("schema_version")),
        ("Analysed at", session.get("analyzed_at")),
        ("Session path", session.get("path")),
        ("Hosts", ", ".join(str(h) for h in hosts) if hosts else None),
        ("Collection wall time", None),
    ]
    cells = "".join(
        f"<dt>{_e(k)}</dt><dd>{_e(v) if v not in (None, '') else _na('not recorded')}</dd>"
        for k, v in facts[:-1]
    )
    cells += f"<dt>Collection wall time</dt><dd>{_fmt_ms(snapshot.get('elapsed_ms'))}</dd>"
    # analysis.json keeps the collection summary; the per-job table is in the snapshot.
    jobs = _map(_map(snapshot.get("collection")).get("jobs"))
    if jobs:
        job_rows = [
            (f'<span class="mono">{_e(name)}</span>', _status_chip(_map(j).get("status")),
             _fmt_ms(_map(j).get("elapsed_ms")),
             _fmt_gib((_measured(_map(j).get("peak_rss_bytes")) or 0) / 1024**3)
             if _map(j).get("peak_rss_bytes") else _na("not sampled"))
            for name, j in jobs.items()]
        cells += "</dl><h3>Collection jobs (worker processes)</h3>" + _table(
            [("Job", ""), ("Status", ""), ("Elapsed", "num"), ("Worker peak RSS", "num")],
            job_rows) + '<dl class="kv">'

    return _section(
        "provenance",
        "Provenance",
        f'<dl class="kv">{cells}</dl><h3>Collection tools</h3>{tools_table}'
        f"<h3>Follow-ups</h3>{follow_table}",
    )


# ---------------------------------------------------------------- public


def style_hash() -> str:
    """CSP source for the page's one <style> block: ``'sha256-<base64 digest>'``."""
    digest = hashlib.sha256(_css().encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


def content_security_policy() -> str:
    """The strict policy summary.html renders under (and declares in its own <meta>)."""
    return f"default-src 'none'; style-src {style_hash()}; base-uri 'none'; form-action 'none'"


def _render_capture(capture: Mapping[str, Any]) -> str:
    """How the session was captured: kind, trigger, the alert behind it, hosts that failed."""
    if not capture:
        return ""
    kind = _str(capture.get("kind")).replace("_", "-") or "unknown"
    trigger = _str(capture.get("trigger")) or "unknown"
    lines = [f"<span>Capture: <b>{_e(kind)}</b>, triggered <b>{_e(trigger)}</b></span>"]
    note = _str(capture.get("note"))
    if note:
        lines.append(f"<span>{_e(note)}</span>")
    for host, reason in _map(capture.get("failed_hosts")).items():
        lines.append(f'<span class="warn">Host {_e(host)} not analysed: {_e(reason)}</span>')
    return '<div class="meta capture">' + "".join(lines) + "</div>"


def render_summary_html(analysis: Mapping[str, Any], snapshot: Mapping[str, Any]) -> str:
    """Render the self-contained summary.html for one analysed session.

    ``analysis`` is the analysis.json contract and ``snapshot`` the health_snapshot.json
    of the same session. The result is one HTML document with one inline <style> block and
    inline SVG only (no scripts, no external URLs, no ``style=""`` attributes), so it opens
    from ``file://`` and renders fully under ``default-src 'none'; style-src 'sha256-<hash of
    the style block>'``; the page carries that policy itself in a CSP <meta>. Every
    profile-derived string is HTML-escaped; unknown values (null, or XProf's -1) render as
    "n/a", never as 0.
    """
    session = _map(analysis.get("session"))
    device_type = _device_type(analysis, snapshot)
    status = _str(analysis.get("status")) or "UNKNOWN"
    badge_css = status if status in ("OPTIMAL", "NEEDS_ATTENTION", "FAILED") else "unknown"
    run = _str(session.get("run")) or "unknown run"
    name = _str(session.get("session")) or "unknown session"
    hosts = _list(session.get("hosts"))
    capture = _map(session.get("capture"))
    meta = [
        ("Device", device_type or "unknown"),
        ("Hosts", str(len(hosts)) if hosts else "unknown"),
        ("Analysed", _str(session.get("analyzed_at")) or "unknown"),
        ("Investigator", _str(analysis.get("investigator")) or "unknown"),
    ]
    toc = (
        '<nav class="toc"><a href="#summary">Summary</a><a href="#bottlenecks">Bottlenecks</a>'
        '<a href="#tools">Tool analysis</a><a class="sub" href="#roofline">Roofline</a>'
        '<a class="sub" href="#memory">Memory</a><a class="sub" href="#hlo-ops">HLO ops</a>'
        '<a class="sub" href="#kernels">Kernels</a><a class="sub" href="#detectors">Detectors</a>'
        '<a class="sub" href="#llo">LLO</a><a href="#provenance">Provenance</a></nav>'
    )
    header = (
        '<header class="top"><h1>'
        f'<span class="badge b-{badge_css}">{_e(status)}</span>'
        f'<span class="mono">{_e(run)} / {_e(name)}</span></h1><div class="meta">'
        + "".join(f"<span>{_e(k)}: <b>{_e(v)}</b></span>" for k, v in meta)
        + "</div>" + _render_capture(capture) + "</header>"
    )
    regression = _map(analysis.get("regression"))
    if regression:
        from mldiag.analysis.diff_html import render_what_changed

        toc = toc.replace('<a href="#summary">', '<a href="#what-changed">What changed</a>'
                          '<a href="#summary">', 1)
    body = (
        (render_what_changed(regression) if regression else "")
        + _render_summary(analysis, snapshot)
        + _render_findings(analysis)
        + _render_tools(analysis, snapshot, device_type)
        + _render_provenance(analysis, snapshot)
    )
    footer = (
        f"<footer>Generated by mldiag {_e(analysis.get('mldiag_version') or '')} from "
        f"XProf {_e(analysis.get('xprof_version') or snapshot.get('xprof_version') or '')} "
        "tool outputs (health_snapshot.json and analysis.json of this session).</footer>"
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        # The policy holds no quote or markup characters, so it goes in verbatim.
        f'<meta http-equiv="Content-Security-Policy" content="{content_security_policy()}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>mldiag · {_e(run)} / {_e(name)} · {_e(status)}</title>"
        f"<style>{_css()}</style></head><body>{header}{toc}<main>{body}{footer}</main>"
        "</body></html>\n"
    )
