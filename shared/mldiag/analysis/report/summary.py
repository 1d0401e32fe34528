"""The view of summary.html: header, the analysis summary, the prioritized findings and the
provenance; the tool sections come from `report.tools`, "What changed" from `report.diff`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mldiag.analysis.judgement.reading import SessionReading, read_session
from mldiag.analysis.judgement.summary import step_named
from mldiag.analysis.judgement.verdict import none_found
from mldiag.analysis.report import charts
from mldiag.analysis.report.diff import what_changed
from mldiag.analysis.report.hosts import hosts_section
from mldiag.analysis.report.model import (
    KV,
    Block,
    Callout,
    Cell,
    Chip,
    Heading,
    Prose,
    Section,
    Span,
    Strong,
    Wbr,
    after_headline,
    as_list,
    as_map,
    as_str,
    evidence_value,
    fmt_gib,
    fmt_mem_gib,
    fmt_ms,
    fmt_pct,
    measured,
    mono,
    ms_text,
    na,
    parts,
    readable,
    table,
    text,
    tool_reason,
    why,
)
from mldiag.analysis.report.page import Page, TocEntry, render
from mldiag.analysis.report.tools import tool_sections

_PRIORITY_RANK = {"P0": 0, "P1": 1, "P2": 2}
_TOC = (TocEntry("summary", "Summary"), TocEntry("bottlenecks", "Bottlenecks"),
        TocEntry("tools", "Tool analysis"), TocEntry("roofline", "Roofline", True),
        TocEntry("memory", "Memory", True), TocEntry("hlo-ops", "HLO ops", True),
        TocEntry("kernels", "Kernels", True), TocEntry("detectors", "Detectors", True),
        TocEntry("llo", "LLO", True), TocEntry("provenance", "Provenance"))


@dataclass(frozen=True)
class Card:
    label: str
    value: Cell
    note: Cell
    bar: dict[str, str] | None = None


@dataclass(frozen=True)
class Check:
    check: str
    value: Cell
    target: str
    result: str
    source: str
    # One line where a finding about the same quantity seems to disagree (judgement.verdict).
    note: str = ""

    @property
    def result_css(self) -> str:
        return {"passed": "DATA", "failed": "ERROR"}.get(self.result, "NO_DATA")


@dataclass(frozen=True)
class Summary:
    text: str
    cards: Sequence[Card]
    checks: Sequence[Check]
    judged_over: str
    not_judged: Block
    collection: Block
    # One line relating the page's efficiency and utilisation figures, when two appear.
    figures: str = ""


@dataclass(frozen=True)
class Finding:
    priority: str
    css: str
    title: str
    category: str
    id: str
    what: Cell
    evidence: Block
    headline: str | None
    impact: str
    fix: Cell


# ---------------------------------------------------------------- 1. summary


def _card_notes(analysis: Mapping[str, Any], cpu: bool) -> list[Card]:
    metrics = as_map(analysis.get("metrics"))
    not_measured = "not measured"
    step = measured(metrics.get("step_time_ms"))
    idle = measured(metrics.get("device_idle_percent"))
    roof = measured(metrics.get("roofline_efficiency_percent"))
    peak = measured(metrics.get("peak_memory_gib"))
    cap = measured(metrics.get("memory_capacity_gib"))
    risk = as_str(metrics.get("oom_risk")).upper()
    # get_peak_allocations measures the largest compiled program's buffer assignment, not a
    # runtime peak; say so rather than calling it "peak memory".
    from_allocations = as_str(metrics.get("peak_memory_source")) == "get_peak_allocations"

    mem_label = "Largest allocation" if from_allocations else "Peak memory"
    mem_note = not_measured
    mem_bar = None
    if peak is not None and cap is not None and cap > 0:
        share = peak / cap * 100
        mem_note = f"of {cap:,.2f} GiB capacity ({share:.1f}%)"
        mem_bar = charts.share_bar(share, f"{share:.1f}% of capacity")
    elif peak is not None:
        mem_note = "capacity not measured"
    if from_allocations and peak is not None:
        program = as_str(metrics.get("peak_memory_program"))
        ran = ("in the measured steps" if metrics.get("step_time_ms") is not None else
               "in the capture")
        mem_note = (f"live buffers of {program}, the largest program run {ran} "
                    f"(get_peak_allocations); {mem_note}" if program else
                    f"largest compiled-program allocation (get_peak_allocations); {mem_note}")

    if cpu and as_str(metrics.get("device_idle_window")) == "capture window":
        # No step markers: the XLA:CPU threads' idle share of the capture window.
        idle_card = Card("Device idle", fmt_pct(idle),
                         "of the capture window, XLA:CPU idle (timeline; no step markers)"
                         if idle is not None else not_measured)
    elif cpu:
        idle_card = Card("Host wait (device idle)", fmt_pct(idle),
                         "of each step, XLA:CPU idle" if idle is not None else not_measured)
    else:
        window = as_str(metrics.get("device_idle_window"))
        source = as_str(metrics.get("device_idle_source"))
        note = ("of each step" if window == "steps" else "of the capture window")
        if source:
            note += f" ({source})"
        idle_card = Card("Device idle", fmt_pct(idle), note if idle is not None else not_measured)

    pod_note = _pod_idle_note(analysis)
    if pod_note and idle is not None:
        idle_card = Card(idle_card.label, idle_card.value, f"{idle_card.note}; {pod_note}",
                         idle_card.bar)

    if not risk:
        risk_note = not_measured
    elif cap is None:
        risk_note = "memory capacity not measured"
    else:
        risk_note = "peak memory vs capacity"
    return [
        Card("Step time", fmt_ms(step), _step_note(metrics) if step is not None else not_measured),
        idle_card,
        Card("Roofline efficiency", fmt_pct(roof), _roofline_note(metrics, analysis)
             if roof is not None else not_measured),
        Card(mem_label, fmt_mem_gib(peak), mem_note, mem_bar),
        Card("OOM risk", Span(risk, f"risk-{risk}") if risk else na(not_measured), risk_note),
    ]


def _pod_idle_note(analysis: Mapping[str, Any]) -> str:
    """In a pod with a straggler, the idle card's figure is every host's together: say whose
    wait it mostly is (analysis.json `hosts`)."""
    hosts = as_map(analysis.get("hosts"))
    stragglers = [as_map(s) for s in as_list(hosts.get("stragglers"))]
    if not stragglers:
        return ""
    s = stragglers[0]
    own = measured(as_map(s.get("own")).get("host_wait_ms"))
    median = measured(as_map(s.get("median_host")).get("host_wait_ms"))
    if own is None or median is None:
        return ""
    return (f"over {text(hosts.get('hosts'))} hosts: the straggler {text(s.get('host'))} "
            f"waits {ms_text(own)} a step, the median host {ms_text(median)} (Hosts)")


def _roofline_note(metrics: Mapping[str, Any], analysis: Mapping[str, Any]) -> str:
    """What the roofline card's figure covers, so it agrees with the notes beside it."""
    note = "achieved vs attainable FLOP rate"
    basis = as_str(metrics.get("roofline_efficiency_basis"))
    if basis.startswith("mldiag"):
        note += "; shape-derived custom-call FLOPs counted once per call (xprof counts one)"
    if any("opaque_custom_call" in as_str(n) or "has_opaque_custom_calls" in as_str(n)
           for n in as_list(analysis.get("not_judged"))):
        note += "; custom calls xprof marks opaque count as 0 FLOPs in it"
    return note


def _step_note(metrics: Mapping[str, Any]) -> str:
    """Average per step, with the same steps' spread and outliers when they were measured."""
    spread = as_map(metrics.get("step_time_spread"))
    if metrics.get("steps_measured") == 1:
        return "one step: a single sample, not an average (profile more steps for a spread)"
    if not spread:
        return "average per step"
    hosts = spread.get("hosts")
    steps = (f"{spread.get('steps')} steps across {hosts} hosts" if hosts
             else f"{spread.get('steps')} steps")
    note = (f"average of {steps}; ± {spread.get('stddev_ms')} ms, "
            f"{spread.get('min_ms')}–{spread.get('max_ms')} ms")
    outliers = as_list(spread.get("outliers"))
    if outliers:
        worst = as_map(outliers[0])
        on = f"{worst['host']} " if worst.get("host") else ""
        note += (f"; {spread.get('outlier_count')} outlier step(s) over "
                 f"{spread.get('outlier_threshold_ms')} ms, slowest {on}#"
                 f"{worst.get('step_index')} at {worst.get('step_time_ms')} ms")
    gone = [as_map(x) for x in as_list(metrics.get("steps_excluded"))]
    if gone:
        note += "; left out: " + ", ".join(
            f"{step_named(x, gone)} ({x.get('reason')}, {x.get('step_time_ms')} ms)"
            for x in gone[:3])
    return note


def _checks(analysis: Mapping[str, Any]) -> list[Check]:
    """Every OPTIMAL check with its measured value, threshold, source and result."""
    rows = []
    for c in as_list(analysis.get("checks")):
        if not isinstance(c, Mapping):
            continue
        passed = c.get("passed")
        value = c.get("value")
        shown: Cell = na("no data") if value is None or passed is None and value == "UNKNOWN" \
            else (f"{value:g}" if isinstance(value, int | float) else str(value))
        result = "passed" if passed is True else "failed" if passed is False else "not judged"
        rows.append(Check(as_str(c.get("check")), shown, as_str(c.get("target")), result,
                          as_str(c.get("source")), as_str(c.get("note"))))
    return rows


def _collection_note(analysis: Mapping[str, Any], snapshot: Mapping[str, Any]) -> Block:
    """How long collection took and what it had to cut, with the reasons."""
    info = as_map(analysis.get("collection") or snapshot.get("collection"))
    elapsed = info.get("elapsed_ms", snapshot.get("elapsed_ms"))
    size = measured(info.get("session_bytes"))
    budget = measured(info.get("memory_budget_bytes"))
    peak = measured(info.get("worker_peak_rss_bytes"))
    ms = measured(elapsed)
    took: Cell = (f"{ms / 1000:,.1f} s" if ms is not None and ms >= 1000 else fmt_ms(elapsed))
    line: list[Cell] = ["Collection took ", took]
    if size is not None:
        line.append(f" for {size / 1024**2:,.1f} MB of xplanes")
    job = as_map(info.get("collect_job"))
    if job:
        line += [" in the collect job (a Cloud Run job), because ", Prose(text(job.get("why")))]
    by_task = as_map(info.get("windows_by_task"))
    if by_task:
        # A large host's windows shared by the collect job's tasks: who converted how many.
        line.append(f"; its {len(by_task)} time windows were converted by the collect job's "
                    f"tasks ({_task_shares(by_task)}) and combined as one host")
    elif isinstance(info.get("op_stats_windows"), int) and info["op_stats_windows"] > 1:
        line.append(f"; the host was converted in {info['op_stats_windows']} time windows, "
                    "combined as one host")
    line += _fan_out_note(as_map(info.get("fanned_out")))
    if peak is not None and budget is not None:
        line.append(f"; the largest worker process peaked at {peak / 1024**3:,.2f} GiB "
                    f"(memory budget {budget / 1024**3:,.2f} GiB)")
    items: list[Cell] = []
    for kind, label in (("killed", "Stopped"), ("skipped", "Skipped"), ("degraded", "Degraded")):
        for entry in as_list(info.get(kind)):
            e = as_map(entry)
            what = e.get("job") or e.get("tools")
            items.append(parts(f"{label}: ", mono(what), ": ", Prose(text(e.get("reason")))))
    if not items:
        return why(parts(*line, "; no tool was skipped, stopped or degraded."))
    return Callout(parts(*line, ". What collection had to cut"), items)


def _fan_out_note(fanned: Mapping[str, Any]) -> list[Cell]:
    """A fanned-out session: each host collected on its own (its op_stats whole or in time
    windows), combined as xprof combines hosts; who collected them in the collect job."""
    if not fanned:
        return []
    windows = [w for w in as_map(fanned.get("op_stats_windows")).values()
               if isinstance(w, int)]
    line = f"; its {fanned.get('hosts')} hosts were collected one by one"
    cut = sum(1 for w in windows if w > 1)
    if cut:
        line += (f" ({cut} of them converted in time windows, "
                 f"{sum(w for w in windows if w > 1)} in all)")
    line += " and their op_stats combined as xprof combines hosts"
    by_task = as_map(fanned.get("hosts_by_task"))
    if by_task:
        line += f", by the collect job's tasks ({_task_shares(by_task)})"
    return [line]


def _task_shares(by_task: Mapping[str, Any]) -> str:
    """"task 0: 3, task 1: 2" from what → the collect job's task that did it."""
    counts: dict[str, int] = {}
    for task in by_task.values():
        counts[str(task)] = counts.get(str(task), 0) + 1
    return ", ".join(f"task {t}: {n}" for t, n in sorted(counts.items(),
                                                          key=lambda kv: int(kv[0])))


def figures_line(analysis: Mapping[str, Any], reading: SessionReading) -> str:
    """One line naming each efficiency or utilisation figure the page shows and how they
    relate, when it shows two or more; "" otherwise."""
    said = []
    util = next((as_map(c) for c in as_list(analysis.get("checks"))
                 if as_map(c).get("check") == "compute utilization is high"), {})
    if isinstance(util.get("value"), int | float):
        said.append(f"compute utilization {util['value']:g}% is the share of device time "
                    f"spent computing ({util.get('source')}): whether the device works")
    roof = measured(as_map(analysis.get("metrics")).get("roofline_efficiency_percent"))
    if roof is not None:
        said.append(f"roofline efficiency {roof:g}% is how fast the whole program computes "
                    "against its attainable FLOP rate over all its ops (get_roofline_model "
                    "program): how well it works while it does")
    summary = as_map(reading.get("get_xprof_overview", "performance_summary"))
    duty = summary.get("device_duty_cycle_percent")
    if duty not in (None, "", "N/A") and not reading.cpu:  # xprof's device metrics, not CPU's
        said.append(f"device duty cycle {duty} (get_xprof_overview) counts any op, copies and "
                    "collectives included")
    mxu = summary.get("mxu_utilization_percent")
    if mxu not in (None, "", "N/A") and reading.tpu:
        said.append(f"MXU utilization {mxu} (get_xprof_overview) is the matrix units' share")
    if len(said) < 2:
        return ""
    return ("How these figures relate: " + "; ".join(said) + ". A finding's per-op "
            "efficiency is that op's own, over all its calls.")


def summary_view(analysis: Mapping[str, Any], snapshot: Mapping[str, Any],
                 reading: SessionReading | None = None) -> Summary:
    reading = reading or read_session(snapshot)
    not_judged = [item for item in as_list(analysis.get("not_judged")) if item]
    judged: Block = (
        Callout("Not judged (missing data is not evidence of health)",
                [Prose(text(item)) for item in not_judged]) if not_judged
        else why("Every triage criterion had data; nothing was left unjudged."))
    # An alert-triggered session's summary leads with the "what changed" sentence, which
    # the section above this one shows: said once.
    headline = as_str(as_map(analysis.get("regression")).get("headline"))
    return Summary(after_headline(as_str(analysis.get("summary")), headline),
                   _card_notes(analysis, reading.cpu), _checks(analysis),
                   as_str(as_map(analysis.get("metrics")).get("judged_over")), judged,
                   _collection_note(analysis, snapshot), figures_line(analysis, reading))


# ---------------------------------------------------------------- 2. findings


def _finding_key(finding: Mapping[str, Any]) -> tuple[int, float]:
    rank = _PRIORITY_RANK.get(as_str(finding.get("priority")).upper(), len(_PRIORITY_RANK))
    impact = measured(as_map(finding.get("impact")).get("value"))
    return rank, -(impact if impact is not None else -1.0)


def evidence_rows(evidence: Sequence[Any]) -> list[tuple[Cell, ...]]:
    """Who made each number (an xprof tool, or mldiag's own pass, with what the pass computed
    it from), the field and its value."""
    return [(_source(as_map(e)), Wbr(text(as_map(e).get("field"))),
             evidence_value(as_map(e).get("value"))) for e in evidence]


def _source(row: Mapping[str, Any]) -> Cell:
    computed_from = "; ".join(as_str(f) for f in as_list(row.get("from")))
    name = Span(Wbr(text(row.get("tool"))), "mono")
    return Span(name, "mono", f"computed from: {computed_from}") if computed_from else name


def finding_view(finding: Mapping[str, Any]) -> Finding:
    priority = as_str(finding.get("priority")).upper()
    rows = evidence_rows(as_list(finding.get("evidence")))
    evidence: Block = (
        table([("Source", "mono ev"), ("Field", "mono ev"), ("Value", "mono")], rows,
              collapse_after=8)
        if rows else why("No evidence was attached to this finding."))
    impact = as_map(finding.get("impact"))
    value = measured(impact.get("value"))
    headline = None
    if value is not None:
        unit = as_str(impact.get("unit"))
        # An upper bound (roofline headroom, a fused transpose's whole fusion) says so.
        headline = ("up to " if impact.get("upper_bound") else "") + (
            f"{value:,.2f}".rstrip("0").rstrip("."))
        if unit:
            headline += ("" if unit.startswith("%") else " ") + unit
    what, fix = as_str(finding.get("what")), as_str(finding.get("fix"))
    return Finding(priority or "P?", priority if priority in _PRIORITY_RANK else "",
                   text(finding.get("title") or "Untitled finding"),
                   text(finding.get("category") or "other"), text(finding.get("id")),
                   Prose(what) if what else na("not stated"), evidence, headline,
                   as_str(impact.get("text")), Prose(fix) if fix else na("no fix proposed"))


def findings_view(analysis: Mapping[str, Any]) -> tuple[list[Finding], str]:
    """The findings, most urgent first, and what to say when there are none."""
    findings = [as_map(f) for f in as_list(analysis.get("findings")) if isinstance(f, Mapping)]
    findings.sort(key=_finding_key)
    none = none_found(as_str(analysis.get("status")),
                      [as_map(c) for c in as_list(analysis.get("checks"))])
    return [finding_view(f) for f in findings], none


# ---------------------------------------------------------------- 4. provenance


def provenance_view(analysis: Mapping[str, Any], snapshot: Mapping[str, Any]
                    ) -> list[Block]:
    snap_tools = as_map(snapshot.get("tools"))
    listed: dict[str, Mapping[str, Any]] = {}
    for item in as_list(analysis.get("tools")):
        entry = as_map(item)
        if entry.get("name"):
            listed[str(entry["name"])] = entry
    for name, item in snap_tools.items():
        listed.setdefault(str(name), as_map(item))
    rows = []
    for name, entry in listed.items():
        snap = as_map(snap_tools.get(name))
        error = entry.get("error") or snap.get("error")
        note: Cell = ""
        if error:
            note = Span(text(error), "err")
        elif entry.get("status") == "NO_DATA":
            note = tool_reason(snap) or tool_reason(entry)
        elif entry.get("cli") or snap.get("cli"):
            # What a reader runs to see the same output (the fields evidence cites).
            note = mono(entry.get("cli") or snap.get("cli"))
        rows.append((mono(name), Chip(as_str(entry.get("status")) or "?"),
                     fmt_ms(entry.get("elapsed_ms")), note))
    # mldiag's own passes (evidence cites them by name), with what each is computed from.
    for item in as_list(analysis.get("passes")):
        entry = as_map(item)
        error = entry.get("error")
        computed_from = "; ".join(as_str(f) for f in as_list(entry.get("from")))
        rows.append((mono(entry.get("name")), Chip(as_str(entry.get("status")) or "?"),
                     fmt_ms(entry.get("elapsed_ms")),
                     Span(text(error), "err") if error else
                     text(f"computed from: {computed_from}") if computed_from else ""))
    follow_rows = []
    for item in as_list(analysis.get("follow_ups")):
        f = as_map(item)
        args = f.get("args")
        follow_rows.append((mono(f.get("tool")), readable(args) if args else "",
                            text(f.get("purpose")), Chip(as_str(f.get("status")) or "?"),
                            fmt_ms(f.get("elapsed_ms")), text(f.get("result_summary"))))
    session = as_map(analysis.get("session"))
    hosts = as_list(session.get("hosts"))
    fallback = as_map(analysis.get("fallback"))
    check = as_map(analysis.get("evidence_check"))
    facts: list[tuple[str, object]] = [
        ("Investigator", analysis.get("investigator")),
        ("Investigator fallback", (f"{as_str(fallback.get('from'))} failed, so the rule-based "
                                   f"investigator ran: {as_str(fallback.get('reason'))}")
         if fallback else "none"),
        *([("Investigator's own summary", analysis["investigator_summary"])]
          if analysis.get("investigator_summary") else []),
        ("Evidence check", (f"{len(as_list(check.get('dropped')))} finding(s) dropped, "
                            f"{len(as_list(check.get('corrected')))} value(s) corrected against "
                            "the tool outputs") if check else "not needed (rule-based)"),
        ("xprof version", analysis.get("xprof_version") or snapshot.get("xprof_version")),
        ("mldiag version", analysis.get("mldiag_version")),
        ("Schema version", analysis.get("schema_version")),
        ("Analysed at", session.get("analyzed_at")),
        ("Session path", session.get("path")),
        ("Hosts", ", ".join(str(h) for h in hosts) if hosts else None),
    ]
    pairs: list[tuple[str, Cell]] = [
        (k, text(v) if v not in (None, "") else na("not recorded")) for k, v in facts]
    pairs.append(("Collection wall time", fmt_ms(snapshot.get("elapsed_ms"))))
    blocks: list[Block] = [KV(pairs)]
    # analysis.json keeps the collection summary; the per-job table is in the snapshot.
    jobs = as_map(as_map(snapshot.get("collection")).get("jobs"))
    if jobs:
        job_rows = [
            (mono(name), Chip(as_str(as_map(j).get("status")) or "?"),
             fmt_ms(as_map(j).get("elapsed_ms")),
             fmt_gib((measured(as_map(j).get("peak_rss_bytes")) or 0) / 1024**3)
             if as_map(j).get("peak_rss_bytes") else na("not sampled"))
            for name, j in jobs.items()]
        blocks += [_h3("Collection jobs (worker processes)"), table(
            [("Job", ""), ("Status", ""), ("Elapsed", "num"), ("Worker peak RSS", "num")],
            job_rows), KV([])]
    blocks += [_h3("Collection tools and mldiag's passes"), table(
        [("Tool or pass", ""), ("Status", ""), ("Elapsed", "num"), ("Error / note", "")], rows),
        _h3("Follow-ups"),
        table([("Tool", ""), ("Args", "mono"), ("Purpose", ""), ("Status", ""),
               ("Elapsed", "num"), ("Result", "mono")], follow_rows)
        if follow_rows else why("No follow-up tool calls were made.")]
    return blocks


def _h3(title: str) -> Block:
    return Heading(title, 3)


# ---------------------------------------------------------------- the page


def _capture_lines(capture: Mapping[str, Any]) -> list[Cell]:
    """How the session was captured: kind, trigger, the alert behind it, hosts that failed."""
    if not capture:
        return []
    kind = as_str(capture.get("kind")).replace("_", "-") or "unknown"
    if kind == "dropped":
        kind = "dropped into the bucket (nothing asked for it)"
    trigger = as_str(capture.get("trigger")) or "unknown"
    lines: list[Cell] = [Span(parts("Capture: ", Strong(kind), ", triggered ", Strong(trigger)))]
    note = as_str(capture.get("note"))
    if note:
        lines.append(Span(note))
    for host, reason in as_map(capture.get("failed_hosts")).items():
        lines.append(Span(f"Host {host} not analysed: {text(reason)}", "warn"))
    return lines


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
    session = as_map(analysis.get("session"))
    reading = read_session(snapshot, as_str(session.get("device_type")) or None)
    # The session's own name for its device, as analysis.json recorded it; the kind (what
    # the page decides by) is the reading's.
    device_type = as_str(session.get("device_type")) or reading.device_type
    status = as_str(analysis.get("status")) or "UNKNOWN"
    run = as_str(session.get("run")) or "unknown run"
    name = as_str(session.get("session")) or "unknown session"
    hosts = as_list(session.get("hosts"))
    meta = [("Device", device_type or "unknown"),
            ("Hosts", str(len(hosts)) if hosts else "unknown"),
            ("Analysed", as_str(session.get("analyzed_at")) or "unknown"),
            ("Investigator", as_str(analysis.get("investigator")) or "unknown")]
    regression = as_map(analysis.get("regression"))
    toc = ((TocEntry("what-changed", "What changed"),) if regression else ()) + _TOC
    pod = hosts_section(as_map(analysis.get("hosts")))
    if pod is not None:
        at = toc.index(_TOC[1]) + 1
        toc = toc[:at] + (TocEntry("hosts", "Hosts"),) + toc[at:]
    findings, no_findings = findings_view(analysis)
    return render(
        "report/summary.html",
        page=Page(f"mldiag · {run} / {name} · {status}", toc),
        status=status, heading=f"{run} / {name}", meta=meta,
        capture=_capture_lines(as_map(session.get("capture"))),
        what_changed=what_changed(regression) if regression else None,
        summary=summary_view(analysis, snapshot, reading), findings=findings,
        no_findings=no_findings, hosts=pod, tools=tool_sections(analysis, reading),
        provenance=Section("provenance", "Provenance", provenance_view(analysis, snapshot)),
        mldiag_version=text(analysis.get("mldiag_version") or ""),
        xprof_version=text(analysis.get("xprof_version") or snapshot.get("xprof_version") or ""),
    )

