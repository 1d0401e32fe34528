"""The view of diff.html, and of the "What changed" section summary.html opens with for an
alert-triggered session."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mldiag.analysis.report.model import (
    KV,
    NA,
    Block,
    Box,
    Callout,
    Cell,
    Code,
    Folded,
    Heading,
    Link,
    Nested,
    Para,
    Prio,
    Prose,
    Section,
    Span,
    Strong,
    Wbr,
    as_list,
    as_map,
    as_str,
    evidence_value,
    fmt_pct,
    mono,
    na,
    parts,
    table,
    text,
    why,
)
from mldiag.analysis.report.page import Page, TocEntry, render

_KINDS = {
    "host_wait": "host wait", "device_idle": "device idle", "new_collective": "new collective",
    "removed_collective": "collective removed", "layout_change": "layout change",
    "removed_copy": "copy removed", "new_ops": "new ops", "removed_ops": "ops removed",
    "shape_change": "input shapes", "recompile": "recompiled", "same_program": "same HLO",
    "new_program": "new program", "removed_program": "program removed",
    "device_type_change": "device type", "dtype_change": "dtype change",
    "fusion_change": "fusion boundary",
}
_TOC = (TocEntry("explanation", "What changed"), TocEntry("kpis", "KPIs"),
        TocEntry("ops", "Ops"), TocEntry("hlo", "HLO"), TocEntry("kernels", "Kernels"),
        TocEntry("findings", "Findings"), TocEntry("config", "Config"),
        TocEntry("about", "About"))


def _num(value: object, unit: str = "", decimals: int = 2, signed: bool = False) -> str | NA:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return na("not measured")
    shown = f"{value:+,.{decimals}f}" if signed else f"{value:,.{decimals}f}"
    return f"{shown} {unit}".rstrip() if unit else shown


def _share(value: object) -> str | NA:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return na("no step-time delta to share")
    return f"{100.0 * value:.0f}%"


def _delta(item: Mapping[str, Any]) -> str | NA:
    if item.get("delta_ms") is not None:
        return _num(item["delta_ms"], "ms", signed=True)
    return _num(item.get("delta_points"), "pts", signed=True)


def _evidence(evidence: Sequence[Any]) -> Block:
    rows = [(text(as_map(e).get("side")), Span(Wbr(text(as_map(e).get("tool"))), "mono"),
             Span(Wbr(text(as_map(e).get("field"))), "mono"),
             evidence_value(as_map(e).get("value"))) for e in evidence]
    if not rows:
        return why("No tool field measures this change.")
    return table([("Side", ""), ("Tool", "ev"), ("Field", "mono"), ("Value", "mono")], rows)


def _explanation(items: Sequence[Any]) -> Block:
    if not items:
        return why("No change was found between the two sessions.")
    rows = []
    for raw in items:
        item = as_map(raw)
        kind = as_str(item.get("kind"))
        evidence = as_list(item.get("evidence"))
        change = parts(Span(_KINDS.get(kind, kind), "chip"), " ",
                       Prose(text(item.get("change"))))
        rows.append((text(item.get("rank")), parts(change, Nested([Folded(
            f"Evidence ({len(evidence)})", [_evidence(evidence)])])),
            _delta(item), _share(item.get("share_of_delta"))))
    return table([("#", "num"), ("Change", "desc"), ("Δ per step", "num"),
                  ("Share of Δ", "num")], rows)


def _notes(comparability: object) -> list[Block]:
    notes = as_list(as_map(comparability).get("notes"))
    if not notes:
        return []
    items: list[Cell] = [parts(Strong(text(as_map(n).get("aspect"))),
                               f" (A: {text(as_map(n).get('a'))}, B: {text(as_map(n).get('b'))})"
                               f": {text(as_map(n).get('consequence'))}") for n in notes]
    level = text(as_map(comparability).get("level"))
    return [Callout(parts(Strong("What cannot be compared"), f" (comparison: {level})"), items,
                    heading=False)]


def _test(test: Mapping[str, Any]) -> Cell:
    """The rank test on the step times: its name, statistic, p-value and effect sizes."""
    effect = as_map(test.get("effect"))
    ci = as_list(effect.get("median_shift_ci_ms"))
    interval: list[Cell] = ([f" ({100 * float(effect.get('ci_level') or 0.95):.0f}% CI ",
                             _num(ci[0], signed=True), " to ", _num(ci[1], "ms", signed=True),
                             ")"] if len(ci) == 2 else [])
    return parts(f"{text(test.get('test'))} ({text(test.get('method'))}) on "
                 f"{text(test.get('a_steps'))} / {text(test.get('b_steps'))} step times: "
                 f"U = {text(test.get('u'))}, p = {text(test.get('p_value'))} "
                 f"(α {text(test.get('alpha'))}); median shift ",
                 _num(effect.get("median_shift_ms"), "ms", signed=True), *interval,
                 "; a step of B is slower than one of A with probability ",
                 _num(effect.get("probability_b_slower")))


def _kpis(doc: Mapping[str, Any]) -> Block:
    rows = []
    for raw in as_list(doc.get("kpis")):
        k = as_map(raw)
        unit = as_str(k.get("unit"))
        note: Cell = ""
        if k.get("name") == "step time":
            noted: list[Cell] = ["± ", _num(k.get("a_stddev")), " / ± ", _num(k.get("b_stddev")),
                                 f" ms over {text(k.get('a_steps'))} / {text(k.get('b_steps'))}"
                                 " steps"]
            test = as_map(k.get("variation"))
            verdict = "beyond" if k.get("significant") else "within"
            if test.get("p_value") is not None:
                noted += [f"; {verdict} run-to-run variation: ", _test(test)]
            elif k.get("noise_ms") is not None:
                noted += [f"; {verdict} run-to-run variation (±", _num(k["noise_ms"]), " ms)"]
            note = parts(*noted)
        rows.append((text(k.get("name")), _num(k.get("a"), unit), _num(k.get("b"), unit),
                     _num(k.get("delta"), unit, signed=True),
                     _num(k.get("delta_percent"), "%", 1, signed=True), note))
    return table([("Metric", ""), ("A", "num"), ("B", "num"), ("Δ", "num"), ("Δ %", "num"),
                  ("Note", "")], rows)


def _ops(doc: Mapping[str, Any]) -> list[Block]:
    ops = as_map(doc.get("ops"))
    unit = "ms" if ops.get("unit") == "ms per step" else "pts"
    head = [("Module", ""), ("Op", "op"), ("Signature", "mono"), ("A", "num"), ("B", "num"),
            ("Δ", "num")]
    blocks: list[Block] = [why(text(ops.get("note")))] if ops.get("note") else []
    for key, title in (("changed", "Largest changes"), ("new", "New ops"),
                       ("vanished", "Vanished ops")):
        rows = [(Span(Wbr(text(as_map(r).get("module"))), "mono"),
                 Code(text(as_map(r).get("op"))), mono(as_map(r).get("kind")),
                 _num(as_map(r).get("a"), unit, 3), _num(as_map(r).get("b"), unit, 3),
                 _num(as_map(r).get("delta"), unit, 3, signed=True))
                for r in as_list(ops.get(key))]
        if rows:
            blocks += [Heading(title, 3), table(head, rows, collapse_after=8)]
    return blocks


def _hlo(doc: Mapping[str, Any]) -> list[Block]:
    hlo = as_map(doc.get("hlo"))
    if not hlo.get("available"):
        return [why(text(hlo.get("note") or "No HLO digests."))]
    changed: list[tuple[Cell, ...]] = []
    same: list[tuple[Cell, ...]] = []
    for raw in as_list(hlo.get("modules")):
        m = as_map(raw)
        params = "; ".join(f"{text(as_map(p).get('name'))}: {text(as_map(p).get('a'))} → "
                           f"{text(as_map(p).get('b'))} ({text(as_map(p).get('change'))})"
                           for p in as_list(m.get("parameters")))
        ops = "; ".join(
            [f"+ {sig} ×{len(as_list(names)) or 1}"
             for sig, names in as_map(m.get("ops_added")).items()]
            + [f"− {sig} ×{len(as_list(names)) or 1}"
               for sig, names in as_map(m.get("ops_removed")).items()])
        refused = as_list(m.get("ops_refused"))
        if refused:
            ops += ("; " if ops else "") + "fusion changed: " + ", ".join(
                text(n) for n in refused[:5])
        status: Cell = text(m.get("status"))
        if not m.get("ran_in_steps"):
            status = parts(status, " ", Span("not in the steps", "subnote"))
        row = (Span(Wbr(text(m.get("module"))), "mono"), status, Span(params, "mono"),
               Span(ops, "mono"))
        (same if m.get("status") == "unchanged" else changed).append(row)
    head = [("Module", ""), ("Status", ""), ("Entry parameters changed", "mono"),
            ("Op signatures added (+) / removed (−)", "mono")]
    blocks: list[Block] = [table(head, changed) if changed else why(
        "Every module that both sessions compiled has the same fingerprint.")]
    if same:
        blocks.append(Folded(f"{len(same)} unchanged module(s)", [table(head, same)]))
    return blocks


def _kernels(doc: Mapping[str, Any]) -> list[Block]:
    k = as_map(doc.get("kernels"))
    blocks: list[Block] = [why(text(k.get("note")))] if k.get("note") else []
    if not k.get("available"):
        return blocks
    total = as_map(k.get("total_device_ms"))
    if total:
        blocks.append(Para(parts(
            "Total device time (xprof, whole capture): ", _num(total.get("a"), "ms"), " → ",
            _num(total.get("b"), "ms"), " (", _num(total.get("delta"), "ms", signed=True), ")")))
    rows = [(Span(Wbr(text(as_map(r).get("kernel"))), "mono"),
             _num(as_map(r).get("a_ms"), "ms", 3), _num(as_map(r).get("b_ms"), "ms", 3),
             _num(as_map(r).get("delta_ms"), "ms", 3, signed=True))
            for r in as_list(k.get("kernels"))]
    return blocks + [table([("Kernel", "desc"), ("A", "num"), ("B", "num"), ("Δ", "num")],
                           rows, collapse_after=10)]


def _findings(doc: Mapping[str, Any]) -> list[Block]:
    f = as_map(doc.get("findings"))
    blocks: list[Block] = [Para(parts("Verdict: ", Strong(text(f.get("a_status"))), " → ",
                                      Strong(text(f.get("b_status")))))]
    for key, title in (("new", "New in B"), ("resolved", "Resolved since A"),
                       ("changed_priority", "Priority changed"), ("unchanged", "In both")):
        rows = []
        for raw in as_list(f.get(key)):
            x = as_map(raw)
            priority = text(x.get("priority"))
            was: Cell = parts(" ", Span(f"was {text(x.get('a_priority'))}", "subnote")) \
                if x.get("a_priority") else ""
            rows.append((parts(Prio(priority), was),
                         mono(x.get("category")), Prose(text(x.get("title")))))
        if rows:
            blocks += [Heading(title, 3),
                       table([("Priority", ""), ("Category", ""), ("Finding", "desc")], rows)]
    return blocks


def _config(doc: Mapping[str, Any]) -> list[Block]:
    c = as_map(doc.get("config"))
    rows = [(text(as_map(x).get("key")), mono(as_map(x).get("a")), mono(as_map(x).get("b")))
            for x in as_list(c.get("changed"))]
    blocks: list[Block] = [
        table([("Setting", ""), ("A", "mono"), ("B", "mono")], rows) if rows else why(
            "Run configs, framework, versions, device type and hosts are the same.")]
    for side in ("a", "b"):
        env = as_map(c.get(side))
        blocks.append(Folded(f"Environment of {side.upper()}", [KV([
            (str(k), text(v) if v not in (None, "", {}, []) else na()) for k, v in env.items()
        ])]))
    return blocks


def _before_after(side_a: object, side_b: object, delta: object, key: str,
                  signed: bool = False) -> Cell:
    a, b = as_map(side_a).get(key), as_map(side_b).get(key)
    if not side_a or not side_b:
        return _num(b if side_b else a, "ms", signed=signed)
    return parts(_num(a, signed=signed), " → ", _num(b, "ms", signed=signed), " ",
                 Span(parts("(", _num(as_map(delta).get(key), signed=True), ")"), "subnote"))


def _straggler_mark(row: Mapping[str, Any]) -> Cell:
    a, b = as_map(row.get("a")).get("straggler"), as_map(row.get("b")).get("straggler")
    mark = ("straggler in A and B" if a and b else "straggler in B (new)" if b else
            "straggler in A (gone)" if a else "")
    name = mono(row.get("host"))
    on = as_str(row.get("on"))
    said: list[Cell] = [Strong(name) if mark else name]
    if mark:
        said += [" ", Span(mark, "chip")]
    if on != "both":
        said += [" ", Span(on, "subnote")]
    return parts(*said)


def _hosts(doc: Mapping[str, Any]) -> list[Block]:
    """Two pods host by host (diff.json `hosts`)."""
    pods = as_map(doc.get("hosts"))
    said: list[Cell] = []
    for key, verb in (("appeared", "Appeared in B"), ("went_away", "Gone since A")):
        for s in as_list(as_map(pods.get("stragglers")).get(key)):
            x = as_map(s)
            said.append(parts(Strong(verb), ": straggler ", mono(x.get("host")),
                              f", {text(x.get('lateness_ms_per_step'))} ms late per step, the "
                              f"others waiting {text(x.get('others_wait_percent_of_step'))}% "
                              f"of their step (cause: {text(x.get('cause'))})"))
    for s in as_list(as_map(pods.get("stragglers")).get("stayed")):
        x = as_map(s)
        said.append(parts(Strong("In both"), ": straggler ", mono(x.get("host")), ", ",
                          _num(as_map(x.get("a")).get("lateness_ms_per_step")), " → ",
                          _num(as_map(x.get("b")).get("lateness_ms_per_step"), "ms"),
                          " late per step"))
    median, wait = as_map(pods.get("median_step_ms")), as_map(pods.get("collective_wait_percent"))
    count = as_map(pods.get("hosts"))
    lead = Para(parts(
        f"Hosts {text(count.get('a'))} → {text(count.get('b'))}; median step ",
        _num(median.get("a")), " → ", _num(median.get("b"), "ms"),
        "; share of collective time spent waiting ", fmt_pct(wait.get("a")), " → ",
        fmt_pct(wait.get("b")), ". Each figure is the host's median over its session's "
        "common steps; Δ is B − A."))
    rows = [(_straggler_mark(r),
             *(_before_after(r.get("a"), r.get("b"), r.get("delta"), key, key == "lateness_ms")
               for key in ("step_ms", "lateness_ms", "collective_wait_ms", "host_wait_ms",
                           "compute_ms")))
            for r in (as_map(x) for x in as_list(pods.get("rows")))]
    blocks: list[Block] = [
        Callout("Stragglers", said, heading=False) if said else
        why("Neither session has a straggler."), lead]
    blocks.append(table([("Host", ""), ("Step", "num"), ("Lateness", "num"),
                         ("Collective wait", "num"), ("Host wait", "num"), ("Compute", "num")],
                        rows, collapse_after=16))
    return blocks


def _unattributed(doc: Mapping[str, Any]) -> list[Block]:
    u = as_map(doc.get("unattributed"))
    said: list[Cell] = []
    if u.get("smaller_changes_count"):
        said += [f"{text(u.get('smaller_changes_count'))} smaller change(s) not listed: ",
                 _num(u.get("smaller_changes"), "ms", signed=True)]
    if isinstance(u.get("delta_ms"), int | float) and abs(u["delta_ms"]) >= 0.001:
        said += ["; " if said else "", "not attributed to a change: ",
                 _num(u["delta_ms"], "ms", signed=True),
                 f" ({text(u.get('note'))})" if u.get("note") else ""]
    return [why(parts(*said))] if said else []


def _side(doc: Mapping[str, Any], key: str) -> Cell:
    s = as_map(doc.get(key))
    device = s.get("device_type") or "device ?"
    return Span(parts(f"{key.upper()}: ", Strong(text(s.get("label")), "mono"),
                      f" ({text(s.get('status') or 'unknown')}, {text(device)}, "
                      f"{text(s.get('hosts'))} host(s), {text(s.get('steps'))} step(s); "
                      f"{text(s.get('source'))})"))


def what_changed(regression: Mapping[str, Any]) -> Section:
    """The "What changed" section at the top of an alert-triggered session's summary.html:
    the diff against the run's healthy baseline, or why there is none."""
    baseline = as_map(regression.get("baseline"))
    if not baseline:
        return Section("what-changed", "What changed", [Box(
            Prose(text(regression.get("reason") or "No baseline.")), "notjudged")])
    lead = why(parts("Compared with ", Strong(
        f"{text(baseline.get('run'))}/{text(baseline.get('session'))}", "mono"),
        f" ({as_str(baseline.get('why'))}, {text(baseline.get('status'))})"
        " — the full comparison is in ", Link(text(regression.get("diff_html") or "diff.html"),
                                             "diff.html"), "."))
    return Section("what-changed", "What changed", [
        Box(Prose(text(regression.get("headline"))), "summary"), lead,
        *_notes(regression.get("comparability") or {}),
        _explanation(as_list(regression.get("explanation")))])


def render_diff_html(doc: Mapping[str, Any]) -> str:
    """The self-contained diff.html of one diff.json document."""
    a, b = as_map(doc.get("a")), as_map(doc.get("b"))
    title = f"{as_str(a.get('label'))} → {as_str(b.get('label'))}"
    sections = [
        Section("explanation", "What changed", [
            Box(Prose(text(doc.get("headline"))), "summary"), *_notes(doc.get("comparability")),
            _explanation(as_list(doc.get("explanation"))), *_unattributed(doc)]),
        Section("kpis", "KPIs", [_kpis(doc)]),
        Section("ops", "Op deltas", _ops(doc)),
        Section("hlo", "HLO changes", _hlo(doc)),
        Section("kernels", "Kernel deltas", _kernels(doc)),
        *([Section("hosts", "Hosts", _hosts(doc))] if doc.get("hosts") else []),
        Section("findings", "Findings", _findings(doc)),
        Section("config", "Config and environment", _config(doc)),
    ]
    about = KV([("Schema", text(doc.get("schema_version"))),
                ("Created", text(doc.get("created_at"))),
                ("xprof", text(doc.get("xprof_version")))])
    toc: tuple[TocEntry, ...] = _TOC
    if doc.get("hosts"):
        at = toc.index(TocEntry("findings", "Findings"))
        toc = toc[:at] + (TocEntry("hosts", "Hosts"),) + toc[at:]
    return render("report/diff.html", page=Page(f"mldiag diff · {title}", toc), title=title,
                  sides=[_side(doc, "a"), _side(doc, "b")], sections=sections, about=about,
                  mldiag_version=text(doc.get("mldiag_version")))
