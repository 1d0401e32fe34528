"""diff.html, and the report's "What changed" section, in summary.html's style.

The page follows summary.html's rules: one document, one inline style block (the shared
stylesheet), inline markup only, no scripts and no network fetches, every profile-derived
string escaped, unknown values shown as "n/a".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mldiag.analysis.html import (
    _breakable,
    _css,
    _e,
    _evidence_value,
    _list,
    _map,
    _na,
    _prose,
    _section,
    _str,
    _table,
    content_security_policy,
)

_KINDS = {
    "host_wait": "host wait", "device_idle": "device idle", "new_collective": "new collective",
    "removed_collective": "collective removed", "layout_change": "layout change",
    "removed_copy": "copy removed", "new_ops": "new ops", "removed_ops": "ops removed",
    "shape_change": "input shapes", "recompile": "recompiled", "same_program": "same HLO",
    "new_program": "new program", "removed_program": "program removed",
    "device_type_change": "device type",
}


def _num(value: object, unit: str = "", decimals: int = 2, signed: bool = False) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _na("not measured")
    text = f"{value:+,.{decimals}f}" if signed else f"{value:,.{decimals}f}"
    return f"{text} {_e(unit)}".rstrip() if unit else text


def _share(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _na("no step-time delta to share")
    return f"{100.0 * value:.0f}%"


def _delta(item: Mapping[str, Any]) -> str:
    if item.get("delta_ms") is not None:
        return _num(item["delta_ms"], "ms", signed=True)
    return _num(item.get("delta_points"), "pts", signed=True)


def _evidence_table(evidence: Sequence[Any]) -> str:
    rows = [(_e(_map(e).get("side")), f'<span class="mono">{_breakable(_map(e).get("tool"))}'
             "</span>", f'<span class="mono">{_breakable(_map(e).get("field"))}</span>',
             _evidence_value(_map(e).get("value"))) for e in evidence]
    if not rows:
        return '<p class="why">No tool field measures this change.</p>'
    return _table([("Side", ""), ("Tool", "ev"), ("Field", "mono"), ("Value", "mono")], rows)


def _explanation(items: Sequence[Any], *, evidence: bool = True) -> str:
    if not items:
        return '<p class="why">No change was found between the two sessions.</p>'
    rows = []
    for raw in items:
        item = _map(raw)
        kind = _str(item.get("kind"))
        cell = (f'<span class="chip">{_e(_KINDS.get(kind, kind))}</span> '
                f'{_prose(item.get("change"))}')
        if evidence:
            cell += (f'<details><summary>Evidence ({len(_list(item.get("evidence")))})'
                     f'</summary>{_evidence_table(_list(item.get("evidence")))}</details>')
        rows.append((_e(item.get("rank")), cell, _delta(item), _share(item.get(
            "share_of_delta"))))
    return _table([("#", "num"), ("Change", "desc"), ("Δ per step", "num"),
                   ("Share of Δ", "num")], rows)


def _notes(doc: Mapping[str, Any]) -> str:
    notes = _list(_map(doc.get("comparability")).get("notes"))
    if not notes:
        return ""
    items = "".join(
        f"<li><b>{_e(_map(n).get('aspect'))}</b> (A: {_e(_map(n).get('a'))}, "
        f"B: {_e(_map(n).get('b'))}): {_e(_map(n).get('consequence'))}</li>" for n in notes)
    level = _e(_map(doc.get("comparability")).get("level"))
    return (f'<div class="notjudged"><b>What cannot be compared</b> (comparison: {level})'
            f"<ul>{items}</ul></div>")


def _kpis(doc: Mapping[str, Any]) -> str:
    rows = []
    for raw in _list(doc.get("kpis")):
        k = _map(raw)
        unit = _str(k.get("unit"))
        note = ""
        if k.get("name") == "step time":
            parts = [f"± {_num(k.get('a_stddev'))} / ± {_num(k.get('b_stddev'))} ms "
                     f"over {_e(k.get('a_steps'))} / {_e(k.get('b_steps'))} steps"]
            if k.get("noise_ms") is not None:
                verdict = ("beyond" if k.get("significant") else "within")
                parts.append(f"{verdict} run-to-run variation (±{_num(k['noise_ms'])} ms)")
            note = "; ".join(parts)
        rows.append((_e(k.get("name")), _num(k.get("a"), unit), _num(k.get("b"), unit),
                     _num(k.get("delta"), unit, signed=True),
                     _num(k.get("delta_percent"), "%", 1, signed=True), note))
    return _table([("Metric", ""), ("A", "num"), ("B", "num"), ("Δ", "num"), ("Δ %", "num"),
                   ("Note", "")], rows)


def _op_rows(rows: Sequence[Any], unit: str) -> list[tuple[str, ...]]:
    return [(f'<span class="mono">{_breakable(_map(r).get("module"))}</span>',
             f'<code>{_e(_map(r).get("op"))}</code>',
             f'<span class="mono">{_e(_map(r).get("kind"))}</span>',
             _num(_map(r).get("a"), unit, 3), _num(_map(r).get("b"), unit, 3),
             _num(_map(r).get("delta"), unit, 3, signed=True)) for r in rows]


def _ops(doc: Mapping[str, Any]) -> str:
    ops = _map(doc.get("ops"))
    unit = "ms" if ops.get("unit") == "ms per step" else "pts"
    head = [("Module", ""), ("Op", "op"), ("Signature", "mono"), ("A", "num"), ("B", "num"),
            ("Δ", "num")]
    body = f'<p class="why">{_e(ops.get("note"))}</p>' if ops.get("note") else ""
    for key, title in (("changed", "Largest changes"), ("new", "New ops"),
                       ("vanished", "Vanished ops")):
        rows = _list(ops.get(key))
        if rows:
            body += f"<h3>{title}</h3>" + _table(head, _op_rows(rows, unit), collapse_after=8)
    return body


def _hlo(doc: Mapping[str, Any]) -> str:
    hlo = _map(doc.get("hlo"))
    if not hlo.get("available"):
        return f'<p class="why">{_e(hlo.get("note") or "No HLO digests.")}</p>'
    rows = []
    for raw in _list(hlo.get("modules")):
        m = _map(raw)
        params = "; ".join(f"{_e(_map(p).get('name'))}: {_e(_map(p).get('a'))} → "
                           f"{_e(_map(p).get('b'))} ({_e(_map(p).get('change'))})"
                           for p in _list(m.get("parameters")))
        ops = "; ".join(
            [f"+ {_e(sig)} ×{len(_list(names)) or 1}"
             for sig, names in _map(m.get("ops_added")).items()]
            + [f"− {_e(sig)} ×{len(_list(names)) or 1}"
               for sig, names in _map(m.get("ops_removed")).items()])
        refused = _list(m.get("ops_refused"))
        if refused:
            ops += ("; " if ops else "") + "fusion changed: " + ", ".join(
                _e(n) for n in refused[:5])
        rows.append((f'<span class="mono">{_breakable(m.get("module"))}</span>',
                     _e(m.get("status")) + ("" if m.get("ran_in_steps") else
                                            ' <span class="subnote">not in the steps</span>'),
                     f'<span class="mono">{params}</span>', f'<span class="mono">{ops}</span>'))
    changed = [r for r, m in zip(rows, _list(hlo.get("modules")), strict=True)
               if _map(m).get("status") != "unchanged"]
    same = [r for r, m in zip(rows, _list(hlo.get("modules")), strict=True)
            if _map(m).get("status") == "unchanged"]
    head = [("Module", ""), ("Status", ""), ("Entry parameters changed", "mono"),
            ("Op signatures added (+) / removed (−)", "mono")]
    out = _table(head, changed) if changed else (
        '<p class="why">Every module that both sessions compiled has the same fingerprint.'
        "</p>")
    if same:
        out += f"<details><summary>{len(same)} unchanged module(s)</summary>" + _table(
            head, same) + "</details>"
    return out


def _kernels(doc: Mapping[str, Any]) -> str:
    k = _map(doc.get("kernels"))
    body = f'<p class="why">{_e(k.get("note"))}</p>' if k.get("note") else ""
    if not k.get("available"):
        return body
    total = _map(k.get("total_device_ms"))
    if total:
        body += (f'<p>Total device time (xprof, whole capture): {_num(total.get("a"), "ms")} → '
                 f'{_num(total.get("b"), "ms")} ({_num(total.get("delta"), "ms", signed=True)})'
                 "</p>")
    rows = [(f'<span class="mono">{_breakable(_map(r).get("kernel"))}</span>',
             _num(_map(r).get("a_ms"), "ms", 3), _num(_map(r).get("b_ms"), "ms", 3),
             _num(_map(r).get("delta_ms"), "ms", 3, signed=True))
            for r in _list(k.get("kernels"))]
    return body + _table([("Kernel", "desc"), ("A", "num"), ("B", "num"), ("Δ", "num")], rows,
                         collapse_after=10)


def _findings(doc: Mapping[str, Any]) -> str:
    f = _map(doc.get("findings"))
    out = (f"<p>Verdict: <b>{_e(f.get('a_status'))}</b> → <b>{_e(f.get('b_status'))}</b></p>")
    for key, title in (("new", "New in B"), ("resolved", "Resolved since A"),
                       ("changed_priority", "Priority changed"), ("unchanged", "In both")):
        rows = [(f'<span class="prio {_e(_map(x).get("priority"))}">'
                 f'{_e(_map(x).get("priority"))}</span>'
                 + (f' <span class="subnote">was {_e(_map(x).get("a_priority"))}</span>'
                    if _map(x).get("a_priority") else ""),
                 f'<span class="mono">{_e(_map(x).get("category"))}</span>',
                 _prose(_map(x).get("title"))) for x in _list(f.get(key))]
        if rows:
            out += f"<h3>{title}</h3>" + _table([("Priority", ""), ("Category", ""),
                                                 ("Finding", "desc")], rows)
    return out


def _config(doc: Mapping[str, Any]) -> str:
    c = _map(doc.get("config"))
    rows = [(_e(_map(x).get("key")), f'<span class="mono">{_e(_map(x).get("a"))}</span>',
             f'<span class="mono">{_e(_map(x).get("b"))}</span>')
            for x in _list(c.get("changed"))]
    out = (_table([("Setting", ""), ("A", "mono"), ("B", "mono")], rows) if rows else
           '<p class="why">Run configs, framework, versions, device type and hosts are the '
           "same.</p>")
    for side in ("a", "b"):
        env = _map(c.get(side))
        cells = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v) if v not in (None, '', {}, []) else _na()}"
                        "</dd>" for k, v in env.items())
        out += (f"<details><summary>Environment of {side.upper()}</summary>"
                f'<dl class="kv">{cells}</dl></details>')
    return out


def _side_meta(doc: Mapping[str, Any]) -> str:
    spans = []
    for key in ("a", "b"):
        s = _map(doc.get(key))
        device = s.get("device_type") or "device ?"
        spans.append(f"<span>{key.upper()}: <b class=\"mono\">{_e(s.get('label'))}</b> "
                     f"({_e(s.get('status') or 'unknown')}, {_e(device)}, "
                     f"{_e(s.get('hosts'))} host(s), {_e(s.get('steps'))} step(s); "
                     f"{_e(s.get('source'))})</span>")
    return '<div class="meta capture">' + "".join(spans) + "</div>"


def render_diff_html(doc: Mapping[str, Any]) -> str:
    """The self-contained diff.html of one diff.json document."""
    a, b = _map(doc.get("a")), _map(doc.get("b"))
    title = f"{_str(a.get('label'))} → {_str(b.get('label'))}"
    toc = ('<nav class="toc"><a href="#explanation">What changed</a><a href="#kpis">KPIs</a>'
           '<a href="#ops">Ops</a><a href="#hlo">HLO</a><a href="#kernels">Kernels</a>'
           '<a href="#findings">Findings</a><a href="#config">Config</a>'
           '<a href="#about">About</a></nav>')
    header = (f'<header class="top"><h1><span class="mono">diff</span><span class="mono">'
              f"{_e(title)}</span></h1>{_side_meta(doc)}</header>")
    body = (
        _section("explanation", "What changed",
                 f'<div class="summary">{_prose(doc.get("headline"))}</div>' + _notes(doc)
                 + _explanation(_list(doc.get("explanation"))) + _unattributed(doc))
        + _section("kpis", "KPIs", _kpis(doc))
        + _section("ops", "Op deltas", _ops(doc))
        + _section("hlo", "HLO changes", _hlo(doc))
        + _section("kernels", "Kernel deltas", _kernels(doc))
        + _section("findings", "Findings", _findings(doc))
        + _section("config", "Config and environment", _config(doc))
        + _section("about", "About this diff", _about(doc))
    )
    footer = (f"<footer>Generated by mldiag {_e(doc.get('mldiag_version'))} from the health "
              "snapshots and analyses of both sessions (diff.json).</footer>")
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{content_security_policy()}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>mldiag diff · {_e(title)}</title><style>{_css()}</style></head><body>"
        f"{header}{toc}<main>{body}{footer}</main></body></html>\n"
    )


def _unattributed(doc: Mapping[str, Any]) -> str:
    u = _map(doc.get("unattributed"))
    parts = []
    if u.get("smaller_changes_count"):
        parts.append(f"{_e(u.get('smaller_changes_count'))} smaller change(s) not listed: "
                     f"{_num(u.get('smaller_changes'), 'ms', signed=True)}")
    if isinstance(u.get("delta_ms"), int | float) and abs(u["delta_ms"]) >= 0.001:
        parts.append(f"not attributed to a change: {_num(u['delta_ms'], 'ms', signed=True)}"
                     + (f" ({_e(u.get('note'))})" if u.get("note") else ""))
    return f'<p class="why">{"; ".join(parts)}</p>' if parts else ""


def _about(doc: Mapping[str, Any]) -> str:
    return (
        "<p>The step splits into the time the device waits for the host and the time it is "
        "busy; the busy time splits into each program's ops, scaled so that they add up to it. "
        "A program with the same HLO fingerprint on both sides that ran slower is one change; "
        "a recompiled program splits into the op signatures it gained or lost (a collective, "
        "a layout copy) and the rest of its ops, which a change of its input shapes accounts "
        "for when there is one. Each change cites the tool fields it was read from.</p>"
        "<p>xprof's own <code>diff_sessions</code> (the <code>xprof</code> CLI) compares kernel "
        "totals and shows both sessions' KPIs side by side; mldiag uses it for the kernel "
        "deltas where kernel statistics exist, and goes further: figures per step rather than "
        "per capture, the step-time spread and whether a delta exceeds run-to-run variation, "
        "host wait, HLO fingerprints and op signatures, findings, configs, one ranked "
        "explanation of the step-time delta with evidence, and what the two sessions do not "
        "share (device type, step markers, hosts), from the stored snapshots without "
        "converting either profile again.</p>"
        f'<dl class="kv"><dt>Schema</dt><dd>{_e(doc.get("schema_version"))}</dd>'
        f'<dt>Created</dt><dd>{_e(doc.get("created_at"))}</dd>'
        f'<dt>xprof</dt><dd>{_e(doc.get("xprof_version"))}</dd></dl>'
    )


def render_what_changed(regression: Mapping[str, Any]) -> str:
    """The "What changed" section at the top of an alert-triggered session's summary.html:
    the diff against the run's healthy baseline, or why there is none."""
    baseline = _map(regression.get("baseline"))
    if not baseline:
        return _section("what-changed", "What changed", (
            f'<div class="notjudged">{_prose(regression.get("reason") or "No baseline.")}'
            "</div>"))
    why = _str(baseline.get("why"))
    lead = (f'<p class="why">Compared with <b class="mono">{_e(baseline.get("run"))}/'
            f'{_e(baseline.get("session"))}</b> ({_e(why)}, {_e(baseline.get("status"))})'
            " — the full comparison is in "
            f'<a href="{_e(regression.get("diff_html") or "diff.html")}">diff.html</a>.</p>')
    notes = _notes({"comparability": regression.get("comparability") or {}})
    return _section("what-changed", "What changed", (
        f'<div class="summary">{_prose(regression.get("headline"))}</div>' + lead + notes
        + _explanation(_list(regression.get("explanation")))))
