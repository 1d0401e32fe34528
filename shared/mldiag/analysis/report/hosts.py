"""The "Hosts" section of a pod (a session of two or more hosts with steps): how the hosts'
steps and clocks were matched, each host's figures worst first, the host × step lateness map
and where the collectives' time goes (waiting or transfer).

Every figure is analysis.json's `hosts` section as the cross-host pass wrote it
(`collection/hosts/pod.py`); the page only picks and orders them, including the line that
stands for the hosts beyond the first `SHOWN_HOSTS` rows (the pass's `per_host_rest`, the
median of each of their columns).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mldiag.analysis.report import charts
from mldiag.analysis.report.model import (
    Block,
    Callout,
    Cell,
    Chart,
    Folded,
    Heading,
    Para,
    Section,
    Span,
    Strong,
    as_list,
    as_map,
    as_str,
    fmt_ms,
    fmt_pct,
    measured,
    mono,
    parts,
    table,
    text,
    why,
)

# Hosts shown one by one in the table (the pass's heat map shows as many).
SHOWN_HOSTS = 16
# Hosts named one by one in a line (clock offsets, other step ranges).
NAMED_HOSTS = 6
_COLUMNS = (("step_ms", "Step"), ("compute_ms", "Compute"), ("host_wait_ms", "Host wait"),
            ("collective_wait_ms", "Collective wait"),
            ("collective_transfer_ms", "Collective transfer"), ("lateness_ms", "Lateness"))


def _signed_ms(value: object) -> Cell:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return fmt_ms(None)
    return f"{value:+,.2f} ms"


def _host_cell(row: Mapping[str, Any]) -> Cell:
    name = mono(row.get("host"))
    if row.get("straggler"):
        return parts(Strong(name), " ", Span("straggler", "chip"))
    return name


def _row(row: Mapping[str, Any]) -> tuple[Cell, ...]:
    figures: list[Cell] = [fmt_ms(row.get(key)) for key, _ in _COLUMNS[:-1]]
    return (_host_cell(row), *figures, _signed_ms(row.get("lateness_ms")))


def _medians(rest: Mapping[str, Any]) -> tuple[Cell, ...]:
    """The line for the hosts not shown one by one: the pass's `per_host_rest`, the median
    of each column over them."""
    stragglers = rest.get("stragglers")
    label: Cell = parts(Strong(f"{text(rest.get('hosts'))} other hosts"), " ", Span(
        "median of each column" + (f"; {stragglers} straggler(s) among them" if stragglers
                                   else ""), "subnote"))
    figures: list[Cell] = [fmt_ms(rest.get(key)) for key, _ in _COLUMNS[:-1]]
    return (label, *figures, _signed_ms(rest.get("lateness_ms")))


def _per_host(hosts: Mapping[str, Any]) -> list[Block]:
    rows = [as_map(r) for r in as_list(hosts.get("per_host"))]
    if not rows:
        return [why("The pass recorded no per-host figures.")]
    head = [("Host", ""), *((label, "num") for _, label in _COLUMNS)]
    shown, rest = rows[:SHOWN_HOSTS], rows[SHOWN_HOSTS:]
    summary = as_map(hosts.get("per_host_rest"))
    body = [_row(r) for r in shown] + ([_medians(summary)] if rest and summary else [])
    blocks: list[Block] = [table(head, body)]
    if rest:
        blocks.append(Folded(f"The {len(rest)} hosts not shown above, one by one",
                             [table(head, [_row(r) for r in rest])]))
    blocks.append(why(
        "Each figure is the host's median over the common steps. Lateness: how long after "
        "the other hosts' median arrival this host reaches the step's collectives (summed "
        "over them); collective wait: the time a host waits there for the last one to "
        "arrive; transfer: the rest of the collective. Worst (latest) hosts first."))
    return blocks


def _names(items: Sequence[str]) -> str:
    shown = ", ".join(items[:NAMED_HOSTS])
    more = len(items) - NAMED_HOSTS
    return shown + (f" and {more} more" if more > 0 else "")


def _matching(hosts: Mapping[str, Any]) -> list[Block]:
    """How the hosts were put side by side: common steps, clock offsets, partial hosts."""
    n = hosts.get("hosts")
    steps = hosts.get("common_steps")
    lead: list[Cell] = [Strong(f"{text(n)} hosts"), f", compared over {text(steps)} common "
                        f"steps matched by {as_str(hosts.get('steps_matched_by')) or 'step'}"]
    median = measured(hosts.get("median_step_ms"))
    if median is not None:
        lead += ["; median step ", Strong(fmt_ms(median))]
    lead.append(".")
    offsets = {str(k): v for k, v in as_map(hosts.get("clock_offsets_ms")).items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
    clocks: list[Cell] = []
    if offsets:
        first = next(iter(offsets))
        largest = sorted((h for h in offsets if h != first), key=lambda h: -abs(offsets[h]))
        clocks = [" Clocks aligned on the collectives' common end; offsets against ",
                  mono(first), ": " + _names([f"{h} {offsets[h]:+.3f} ms" for h in largest])
                  + "."]
    blocks: list[Block] = [Para(parts(*lead, *clocks))]
    if hosts.get("method"):
        blocks.append(why(f"How: {as_str(hosts.get('method'))}."))
    other = [str(h) for h in as_list(hosts.get("hosts_with_other_steps"))]
    ranges = {str(as_map(r).get("host")): as_map(r) for r in as_list(hosts.get("step_ranges"))}
    if other:
        named = [f"{h} ({text(ranges.get(h, {}).get('steps'))} steps, "
                 f"{text(ranges.get(h, {}).get('first'))}–{text(ranges.get(h, {}).get('last'))})"
                 if h in ranges else h for h in other]
        blocks.append(Callout(
            f"{len(other)} host(s) have steps the others lack (a partial pod): only the "
            f"{text(steps)} steps every host has are compared", [_names(named)]))
    else:
        blocks.append(why("Every host has the same steps."))
    failed = as_map(hosts.get("failed_hosts"))
    if failed:
        blocks.append(Callout("Hosts left out of the comparison",
                              [parts(mono(h), ": ", text(r)) for h, r in failed.items()]))
    return blocks


def _stragglers(hosts: Mapping[str, Any]) -> list[Block]:
    test = as_map(hosts.get("straggler_test"))
    rule = as_str(test.get("rule"))
    found = [as_map(s) for s in as_list(hosts.get("stragglers"))]
    if not found:
        return [why(f"No straggler: no host passes the test ({rule})." if rule
                    else "No straggler was named.")]
    lines: list[Cell] = []
    for s in found:
        line: list[Cell] = [
            mono(s.get("host")), f" arrives {text(s.get('lateness_ms_per_step'))} ms late "
            f"per step; the others wait {text(s.get('others_wait_ms_per_step'))} ms "
            f"({text(s.get('others_wait_percent_of_step'))}% of their step). Its cause: "
            f"{text(s.get('cause'))}, {text(s.get('cause_excess_ms_per_step'))} ms per step "
            "over the median host"]
        fn = as_map(s.get("function"))
        if fn:
            line += ["; its frame ", mono(fn.get("where") or fn.get("event")),
                     f" takes {text(fn.get('ms_per_call'))} ms per call there against "
                     f"{text(fn.get('others_ms_per_call'))} ms on the others"]
        line.append(f". The step would take {text(s.get('session_step_ms_if_median'))} ms "
                    f"instead of {text(s.get('session_step_ms'))} ms if it ran like the "
                    "median host.")
        lines.append(parts(*line))
    blocks: list[Block] = [Callout("Straggler (see its finding above)" if len(found) == 1
                                   else f"{len(found)} stragglers (see their findings above)",
                                   lines)]
    if rule:
        blocks.append(why(f"The test: {rule}."))
    return blocks


def _heat_map(hosts: Mapping[str, Any]) -> list[Block]:
    heat = as_map(hosts.get("heat_map"))
    steps = [text(s) for s in as_list(heat.get("steps"))]
    rows: list[tuple[str, list[float], list[float], bool]] = []
    for raw in as_list(heat.get("rows")):
        row = as_map(raw)
        late = [float(v) for v in as_list(row.get("lateness_ms")) if _number(v)]
        wait = [float(v) for v in as_list(row.get("wait_ms")) if _number(v)]
        summary = row.get("summary_of")
        # The summary row's own label is long ("240 other hosts (median)"): a short one.
        label = f"{text(summary)} others (median)" if summary else text(row.get("host"))
        rows.append((label, late, wait, bool(summary)))
    if not steps or not rows:
        return [why("No heat map was recorded.")]
    threshold = measured(as_map(hosts.get("straggler_test")).get("threshold_ms"))
    note = (f"The {text(heat.get('hosts_shown'))} latest hosts one by one, the other "
            f"{text(heat.get('hosts_summarised'))} as one row (their median at each step). "
            if heat.get("hosts_summarised") else "")
    return [Heading("Lateness per host and step", 3),
            Chart("heat_map", charts.heat_map(steps, rows, threshold)),
            Para(note + "Red: the host reached the step's collectives after the others' "
                 "median arrival; blue: before it (it then waits). Hover a cell for its "
                 "lateness and collective wait.", "legend")]


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _collectives(hosts: Mapping[str, Any]) -> list[Block]:
    split = as_map(hosts.get("collective_split"))
    if not split:
        return []
    lead = Para(parts(
        "Collective time per host and step: ", Strong(fmt_ms(split.get("wait_ms_per_step"))),
        " waiting for the last host to arrive, ",
        Strong(fmt_ms(split.get("transfer_ms_per_step"))), " transferring (",
        fmt_pct(split.get("wait_percent")), " waiting). Bandwidth fixes (fewer bytes, "
        "reduce-scatter, lower precision, overlap) shorten the transfer only."))
    rows = [(mono(as_map(o).get("op")), text(as_map(o).get("instances")),
             fmt_ms(as_map(o).get("wait_ms")), fmt_ms(as_map(o).get("transfer_ms")),
             fmt_pct(as_map(o).get("wait_percent")))
            for o in as_list(split.get("ops"))]
    blocks: list[Block] = [Heading("Collectives: waiting and transfer", 3), lead]
    if rows:
        blocks.append(table([("Collective", "mono"), ("Executions", "num"),
                             ("Wait per step", "num"), ("Transfer per step", "num"),
                             ("Waiting", "num")], rows, collapse_after=5))
    return blocks


def hosts_section(hosts: Mapping[str, Any]) -> Section | None:
    """The "Hosts" section of analysis.json's `hosts` block, or None without one."""
    if not hosts or not hosts.get("common_steps"):
        return None
    return Section("hosts", "Hosts", [
        *_matching(hosts), *_stragglers(hosts), Heading("Per host", 3), *_per_host(hosts),
        *_heat_map(hosts), *_collectives(hosts)])
