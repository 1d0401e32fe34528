"""The view of summary.html's "Detailed tool analysis": XProf's overview, the roofline,
memory, the HLO op profile, kernel statistics, our detectors, and custom kernels and LLO."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mldiag.analysis.collection import registry
from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.reading import SessionReading
from mldiag.analysis.report import charts
from mldiag.analysis.report.model import (
    KV,
    Block,
    Br,
    Cell,
    Chart,
    ChartRow,
    Code,
    Facts,
    Fold,
    Folded,
    Heading,
    Para,
    Prose,
    Section,
    Span,
    Strong,
    ToolBlock,
    Wbr,
    as_list,
    as_map,
    as_str,
    chip,
    data,
    fmt_gib,
    fmt_mib,
    fmt_ms,
    fmt_pct,
    fmt_plain,
    fmt_si,
    measured,
    ms_text,
    na,
    parts,
    table,
    text,
    tool_reason,
    why,
    with_unit,
)

_GB_PER_GIB = 1.073741824
_DETECTORS = tuple(registry.DETECTOR_LABELS.items())
_OVERVIEW_FIELDS = (
    ("device_duty_cycle_percent", "Device duty cycle"),
    ("device_idle_time_percent", "Device idle time"),
    ("mxu_utilization_percent", "MXU utilization"),
    ("flop_rate_utilization_relative_to_roofline", "FLOP rate vs roofline"),
    ("hbm_bw_utilization_percent", "HBM BW utilization"),
    ("bound_by", "Bound by"),
    ("host_idle_time_percent", "Host idle time"),
)


def why_absent(name: str, entry: Mapping[str, Any], device: SessionReading,
               cpu_reason: str) -> list[Block]:
    status = entry.get("status")
    if not entry:
        said = f"{name} was not collected for this session."
        if device.cpu and cpu_reason:
            said = f"{cpu_reason} ({name} was not collected)."
        return [why(said)]
    if status == "ERROR":
        return [why(f"{name} failed, so this could not be analysed:"),
                Para(text(entry.get("error") or "no error text recorded"), "err")]
    message = tool_reason(entry)
    if device.cpu and cpu_reason:
        if message:
            return [why(parts(cpu_reason, " ", Span(f"({name}: {message})", "mono")))]
        return [why(cpu_reason)]
    reason = message or "the tool returned no data for this trace."
    return [why(f"{name} returned {text(status or 'no status')}: {reason}")]


# ---------------------------------------------------------------- overview


def _overview(device: SessionReading) -> list[Block]:
    cpu = device.cpu
    found = data(device.entry("get_xprof_overview"))
    if found is None:
        return []
    perf = as_map(found.get("performance_summary"))
    env = as_map(found.get("run_environment"))
    step = measured(perf.get("steptime_ms_average"))
    # XProf reports 0.00 ms when the trace has no steps: that is "unknown", not zero.
    step_text = f"{perf.get('steptime_ms_average')} ms" if step else None
    notes: list[Block] = []
    # One step set per page: every other step figure comes from the annotated steps
    # (get_step_trace and our timeline); say so when the overview's own set disagrees.
    trace = as_map(as_map(data(device.entry("get_step_trace"))).get("summary"))
    ours, count = measured(trace.get("step_time_ms_average")), trace.get("total_steps")
    if cpu:
        # Duty cycle, idle, MXU, cores... are device counters XProf does not fill for CPU
        # profiles; they read 0 and would only mislead.
        facts: list[tuple[str, object]] = [
            ("XProf step time (its steps)", step_text),
            ("Device type", env.get("device_type") or device.device_type),
            ("Hosts", env.get("host_count")),
            ("Training", env.get("is_training")),
        ]
        notes.append(why("XProf's device metrics do not apply to CPU profiles."))
    else:
        gpu = device.gpu
        # Without a roofline ("Bound by: Unknown": no peak FLOP rate for the device) the
        # roofline-relative fields read 0.00% and mean nothing.
        no_roofline = as_str(perf.get("bound_by")).strip().lower() in ("", "unknown")
        hidden = {"mxu_utilization_percent"} if gpu else set()
        if no_roofline:
            hidden |= {"flop_rate_utilization_relative_to_roofline",
                       "hbm_bw_utilization_percent", "bound_by"}
            peak = measured(as_map(as_map(data(device.entry("get_roofline_model"))).get(
                "device_info")).get("peak_flop_rate"))
            if peak:
                # The roofline tool knows the device's peak where the overview does not: say
                # why the two sections differ instead of contradicting the chart below.
                notes.append(why(
                    "XProf's overview did not place this program on a roofline (its bound_by "
                    "is Unknown), so its roofline-relative metrics are hidden here; "
                    "get_roofline_model does, with the device peak of "
                    f"{peak / 1000:,.1f} TFLOP/s it reads from the device information: the "
                    "Roofline section below is that tool's."))
            else:
                notes.append(why("XProf could not place this program on a roofline (no peak "
                                 "FLOP rate for this device), so its roofline-relative "
                                 "metrics are hidden."))
        facts = [("XProf step time (its steps)", step_text)]
        # MXU is a TPU unit: on GPU the field is always 0.
        facts += [(label, perf.get(key)) for key, label in _OVERVIEW_FIELDS
                  if key in perf and key not in hidden]
        facts += [("Device type", env.get("device_type")),
                  ("Device cores", env.get("device_core_count")),
                  ("Hosts", env.get("host_count")), ("Training", env.get("is_training"))]
    if step and ours and abs(step - ours) > 0.02 * ours:
        notes.append(why(
            f"XProf's overview step time ({step_text}) averages the steps of its op_stats step "
            "database, a different set from the annotated steps; every other step figure on "
            f"this page, get_step_trace's included, is over the {text(count)} annotated steps "
            f"({ms_text(ours)} on average)."))
    shown = [(k, text(v)) for k, v in facts if v not in (None, "")]
    return [ToolBlock("overview", "XProf overview", ([Facts(shown)] if shown else []) + notes
                      + _device_idle(device))]


def _device_idle(device: SessionReading) -> list[Block]:
    """Each device's idle share, where a host has several: mldiag's own figure, which says
    so and why (xprof states idle only for all devices together)."""
    rows = sorted(((h.name, d.name, d.idle_percent) for h in device.host_figures
                   if len(h.devices) > 1 for d in h.devices if d.idle_percent is not None),
                  key=lambda r: -(r[2] or 0.0))
    if not rows:
        return []
    basis = as_map(device.get(ev.TIMELINE, "device_idle_basis"))
    why_ours = as_str(basis.get("why")) or "xprof states device idle for all devices together"
    return [Heading("Device idle per device (mldiag.timeline, not xprof's)", css="gap"),
            why(Prose(f"Each device's idle share of its host's active span, computed by mldiag "
                      f"from the device's op events: {why_ours}.")),
            table([("Host", "mono"), ("Device", "mono"), ("Idle", "num")],
                  ((text(h), text(d), fmt_pct(v)) for h, d, v in rows), collapse_after=8)]


# ---------------------------------------------------------------- roofline


def _op_point(op: Mapping[str, Any]) -> tuple[float, float] | None:
    # The per-op rows carry no measured FLOP rate; achieved = attainable x efficiency.
    # Efficiencies above 100% come from ops with near-zero time and are not plottable.
    x = measured(op.get("bottleneck_operational_intensity_flop_per_byte")) or measured(
        op.get("operational_intensity_flop_per_byte"))
    optimal = measured(op.get("optimal_flop_rate_gflops"))
    eff = measured(op.get("roofline_efficiency_percent"))
    if not x or not optimal or not eff or eff > 100:
        return None
    point = (x, optimal * eff / 100)
    return point if charts.on_chart(point) else None


def _roofline(device: SessionReading) -> list[Block]:
    entry = device.entry("get_roofline_model")
    found = data(entry)
    if found is None:
        return why_absent("get_roofline_model", entry, device,
                          "CPU profile: XProf has no roofline for CPU.")
    info = as_map(found.get("device_info")) or as_map(
        data(device.entry("get_device_information")))
    program = as_map(found.get("program"))
    peak = measured(info.get("peak_flop_rate"))
    bw_gibs = measured(info.get("peak_hbm_bw_gibs"))
    program_point: tuple[float, float] | None = None
    prog_x = measured(program.get("bottleneck_operational_intensity_flop_per_byte")) or (
        measured(program.get("operational_intensity_flop_per_byte")))
    prog_y = measured(program.get("measured_flop_rate_gflops"))
    if prog_x and prog_y and charts.on_chart((prog_x, prog_y)):
        program_point = (prog_x, prog_y)

    ops = [as_map(op) for op in as_list(found.get("top_operations")) if isinstance(op, Mapping)]
    plotted: list[tuple[str, str, float, float]] = []
    rows = []
    for index, op in enumerate(ops[:12]):
        rank = str(op.get("rank") or index + 1)
        point = _op_point(op)
        if point is not None:
            plotted.append((rank, as_str(op.get("name")), point[0], point[1]))
        # Headroom: the self time it would save at its roofline (time x (1 - efficiency)).
        eff = measured(op.get("roofline_efficiency_percent"))
        self_ms = measured(op.get("total_self_time_ms"))
        headroom = (fmt_ms(self_ms * max(0.0, 1.0 - eff / 100.0))
                    if point and eff is not None and self_ms is not None
                    else na("zero FLOPs: its cost is the bytes it moves"))
        rows.append((
            rank, text(op.get("name")), text(op.get("category")),
            fmt_ms(op.get("total_self_time_ms")), fmt_pct(op.get("total_self_time_percent")),
            fmt_plain(op.get("bottleneck_operational_intensity_flop_per_byte"), 3),
            fmt_plain(point[1], 2) if point else na("not plottable"),
            fmt_pct(op.get("roofline_efficiency_percent")) if point
            else na("not plottable: zero FLOPs or implausible efficiency"),
            headroom, text(op.get("bound_by"))))

    chart: Block
    legend: list[Block] = []
    if peak and bw_gibs and charts.on_chart((peak / (bw_gibs * _GB_PER_GIB), peak)):
        chart = Chart("roofline", charts.roofline(peak, bw_gibs * _GB_PER_GIB, program_point,
                                                  plotted))
        legend = [Para(parts(Span("", "dot prog"), "program", Span("", "dot ops"),
                             "top ops (label = rank; ops with zero FLOPs cannot sit on a log "
                             "axis and are listed only in the table)"), "legend")]
    else:
        chart = why("The device peak FLOP rate or HBM bandwidth is unknown, so no roofline can "
                    "be drawn.")
    facts: list[tuple[str, Cell]] = [
        ("Bound by", text(program.get("bound_by") or "unknown")),
        ("Roofline efficiency", fmt_pct(program.get("roofline_efficiency_percent"))),
        ("Measured FLOP rate", with_unit(program.get("measured_flop_rate_gflops"), "GFLOP/s")),
        ("Attainable FLOP rate", with_unit(program.get("optimal_flop_rate_gflops"), "GFLOP/s")),
        ("Op. intensity (bottleneck / all spaces)",
         parts(fmt_plain(program.get("bottleneck_operational_intensity_flop_per_byte"), 4),
               " / ", fmt_plain(program.get("operational_intensity_flop_per_byte"), 4),
               " FLOP/B")),
        ("Ridge point", with_unit(program.get("bound_by_ridge_point_flop_per_byte"), "FLOP/B")),
        ("HBM bandwidth used", with_unit(program.get("hbm_bw_gibs"), "GiB/s")),
        ("HBM bandwidth peak", with_unit(bw_gibs, "GiB/s")),
        ("Peak compute", fmt_si((peak or 0) * 1e9, "FLOP/s") if peak else na()),
        ("Compute efficiency", fmt_pct(program.get("compute_efficiency_percent"))),
        ("FLOPs provenance", text(program.get("flops_provenance") or "unknown")),
        ("Device", text(info.get("device_type") or device.device_type or "unknown")),
    ]
    top_ops = table([("#", "num"), ("Op", "mono op"), ("Category", ""), ("Self time", "num"),
                     ("% time", "num"), ("Bottleneck OI (FLOP/B)", "num"),
                     ("Achieved GFLOP/s", "num"), ("Roofline eff.", "num"),
                     ("Headroom at roofline", "num"), ("Bound by", "")],
                    rows, collapse_after=6)
    return [ChartRow(chart, KV(facts)), *legend, Heading("Top ops"), top_ops]


# ---------------------------------------------------------------- memory


def _memory(device: SessionReading) -> list[Block]:
    entry = device.entry("get_memory_profile")
    found = data(entry)
    blocks: list[Block] = []
    if found is None:
        blocks += why_absent("get_memory_profile", entry, device,
                             "CPU profile: XProf records no device memory profile for CPU.")
    else:
        details = as_map(found.get("peak_usage_details"))
        peak = measured(found.get("peak_memory_usage_gib"))
        cap = measured(found.get("memory_capacity_gib"))
        # XProf's Memory Profile page, per allocator: the capacity and fragmentation of the
        # allocator that peaked (the CLI prints the largest capacity of any allocator).
        allocators = as_map(device.data(ev.MEMORY_ALLOCATORS))
        own = as_map(allocators.get("peak"))
        memory_id = as_str(own.get("memory_id"))
        cap_cell: Cell = fmt_gib(cap)
        utilization = details.get("utilization_percent")
        frag_cell: Cell = fmt_pct(details.get("fragmentation_percent"))
        if own and measured(own.get("memory_capacity_gib")):
            cli = cap
            cap = measured(own.get("memory_capacity_gib"))
            said: list[Cell] = [
                f"allocator {memory_id} at its peak, as XProf's Memory Profile page shows it "
                f"(mldiag.memory_allocators); stack + heap + free "
                f"{'equals' if own.get('capacity_is_stack_heap_free') else 'does not equal'} it"]
            if cli is not None and cap is not None and abs(cli - cap) > 0.005:
                said += ["; ", Code("xprof get_memory_profile"),
                         f" prints {cli:,.2f} GiB, the largest capacity of any allocator"]
            cap_cell = parts(fmt_gib(cap), Span(parts(*said), "subnote"))
            utilization = own.get("utilization_percent")
            first = as_str((as_list(allocators.get("memory_ids")) or [""])[0])
            opens = ""
            if first and first != memory_id:
                first_row = next((as_map(a) for a in as_list(allocators.get("allocators"))
                                  if as_map(a).get("memory_id") == first), {})
                if first_row.get("fragmentation_percent") is not None:
                    opens = (f"; XProf's page opens on allocator {first}, at "
                             f"{first_row['fragmentation_percent']}%")
            frag_cell = parts(fmt_pct(own.get("fragmentation_percent")),
                              Span(f"at the peak of allocator {memory_id}{opens}", "subnote"))
        if peak is not None and cap:
            blocks.append(Chart("memory_bar", charts.memory_bar(
                peak, cap, measured(details.get("stack_reservation_gib")),
                measured(details.get("heap_allocation_gib")))))
        else:
            blocks.append(why("Peak usage or capacity is unknown, so no bar is drawn."))
        facts: list[tuple[str, Cell]] = [
            ("Peak usage", fmt_gib(peak)),
            ("Capacity", cap_cell),
            ("Utilization at peak", fmt_pct(utilization)),
            ("Stack reservation", fmt_gib(details.get("stack_reservation_gib"))),
            ("Heap allocation", fmt_gib(details.get("heap_allocation_gib"))),
            ("Allocator free at peak", parts(fmt_gib(details.get("free_memory_gib")), Span(
                parts("memory free inside the allocator's reserved pool at the peak (XProf ",
                      Code("peak_usage_details.free_memory_gib"),
                      "), not capacity minus peak"), "subnote"))),
            ("Fragmentation", frag_cell),
        ]
        if peak is not None and cap and cap >= peak:
            facts.insert(2, ("Headroom (capacity − peak)", parts(
                fmt_gib(cap - peak), Span("device memory not in use at the peak", "subnote"))))
        blocks.append(KV(facts))

    alloc_entry = device.entry("get_peak_allocations")
    alloc = data(alloc_entry)
    cpu = device.cpu
    blocks.append(Heading("Largest buffers of the compiled programs (get_peak_allocations)"
                          if cpu else "Top buffers at peak (get_peak_allocations)", css="gap"))
    if alloc is None:
        return blocks + why_absent(
            "get_peak_allocations", alloc_entry, device,
            "CPU profile: XProf has no HLO buffer assignment for CPU devices.")
    modules = [as_map(m) for m in as_list(alloc.get("modules")) if isinstance(m, Mapping)]
    buffers = []
    for module in modules:
        for buf in as_list(module.get("top_buffers")):
            b = as_map(buf)
            buffers.append((measured(b.get("size_mib")) or 0.0, module, b))
    buffers.sort(key=lambda item: item[0], reverse=True)
    blocks.append(table(
        [("Buffer (instruction)", "mono"), ("HLO module", "mono"), ("Size", "num")],
        ((text(b.get("instruction")), text(m.get("module_name")), fmt_mib(b.get("size_mib")))
         for _, m, b in buffers), collapse_after=10))
    if modules:
        blocks.append(Folded(
            f"{'Memory' if cpu else 'HBM'} by module ({len(modules)} modules)",
            [table([("HLO module", "mono"), ("Total" if cpu else "Total HBM", "num")],
                   ((text(m.get("module_name")), fmt_mib(m.get("total_hbm_mib")))
                    for m in modules))]))
    return blocks


# ---------------------------------------------------------------- HLO op profile


def _split_op_path(name: str) -> tuple[str, str]:
    # Grouped names look like by_program/<module>/<category>/.../<op>.
    segments = name.split("/")
    module = segments[1] if len(segments) >= 3 and segments[0] == "by_program" else ""
    return segments[-1], module


def _hlo_ops(device: SessionReading) -> list[Block]:
    entry = device.entry("get_hlo_op_profile")
    found = data(entry)
    if found is None:
        return why_absent("get_hlo_op_profile", entry, device,
                          "CPU profile: XProf builds no HLO op profile for CPU devices.")
    total_ms = measured(found.get("total_profile_time_ms"))
    cats: list[tuple[str, float, float | None]] = []
    for item in as_list(found.get("category_summary")):
        cat = as_map(item)
        ms = measured(cat.get("total_self_time_ms"))
        frac = measured(cat.get("fraction_of_total_time"))
        if frac is None and ms is not None and total_ms:
            frac = ms / total_ms
        if frac is None:
            continue
        cats.append((as_str(cat.get("category")) or "?", frac, ms))
    cats.sort(key=lambda c: c[1], reverse=True)
    blocks: list[Block] = [Para(parts("Total profiled device time: ",
                                      Span(fmt_ms(total_ms), "mono")))]
    if len(cats) > 14:
        rest = cats[13:]
        rest_ms = [c[2] for c in rest if c[2] is not None]
        cats = cats[:13] + [(f"{len(rest)} other categories", sum(c[1] for c in rest),
                             sum(rest_ms))]
    blocks.append(Chart("category_bars", charts.category_bars(cats)) if cats else why(
        "category_summary is empty: no per-category times to chart."))
    ops: list[Mapping[str, Any]] = []
    for group in as_map(found.get("grouped_operations")).values():
        ops.extend(as_map(op) for op in as_list(group) if isinstance(op, Mapping))
    ops.sort(key=lambda op: measured(op.get("total_self_time_ms")) or 0.0, reverse=True)
    if not ops:
        return blocks
    rows = []
    for op in ops[:25]:
        full = as_str(op.get("name"))
        short, module = _split_op_path(full)
        ms = measured(op.get("total_self_time_ms"))
        source = as_str(op.get("source_file"))
        line = op.get("source_line")
        src = f"{source.rsplit('/', 1)[-1]}:{line}" if source else ""
        rows.append((Span(short, title=full), module, text(op.get("category")), fmt_ms(ms),
                     fmt_pct(ms / total_ms * 100) if ms is not None and total_ms else na(),
                     text(op.get("occurrences")), fmt_si(op.get("flops")),
                     fmt_si(op.get("bytes_accessed"), "B"), Span(src, title=source)))
    return blocks + [Heading("Top ops by self time"), table(
        [("Op", "mono op"), ("Module", "mono"), ("Category", ""), ("Self time", "num"),
         ("% time", "num"), ("Count", "num"), ("FLOPs", "num"), ("Bytes", "num"),
         ("Source", "mono")], rows, collapse_after=10)]


# ---------------------------------------------------------------- kernel statistics


def _kernel_records(found: object) -> list[Mapping[str, Any]]:
    # xprof returns a bare list, or an object with kernel_records when include_summary is set;
    # our get_kernel_stats follow-up returns {"kernel_count", "total_kernel_time_us", "kernels"}.
    if isinstance(found, list):
        source: object = found
    else:
        mapping = as_map(found)
        source = mapping.get("kernels")
        if source is None:
            source = mapping.get("kernel_records")
    return [as_map(r) for r in as_list(source) if isinstance(r, Mapping)]


def _short_kernel_name(name: str) -> str:
    """``void ns::Kernel<huge template>(args)`` -> ``ns::Kernel<…>(…)``."""
    stripped = name.strip()
    if stripped.startswith("void "):
        stripped = stripped[5:]
    out: list[str] = []
    depth = 0
    for char in stripped:
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


def _kernel_name(record: Mapping[str, Any]) -> Cell:
    full = as_str(record.get("kernel_name")) or as_str(record.get("raw_name"))
    shown = as_str(record.get("canonical_name")) or _short_kernel_name(full) or "?"
    op_name = as_str(record.get("op_name"))
    op: Cell = Span(parts("op: ", Code(op_name)), "subnote") if op_name else ""
    if not full or full == shown:
        return parts(shown, op)
    return parts(Fold(shown, full, "kname"), op)


def _yes_no(value: object) -> Cell:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return na("not recorded")


def kernel_table(records: list[Mapping[str, Any]]) -> Block:
    """The kernels of get_kernel_stats, largest first (occupancy only where it was
    recorded)."""
    rows = []
    # A trace without occupancy data reports 0% for every kernel: that is "not recorded",
    # not a measurement.
    occupancy_valid = any((measured(r.get("occupancy_pct")) or 0) > 0 for r in records)
    for index, r in enumerate(records):
        rank = measured(r.get("rank"))
        occurrences = r.get("occurrences", r.get("execution_count"))
        rows.append((
            f"{rank:g}" if rank is not None else str(index + 1), _kernel_name(r),
            fmt_plain(r.get("total_duration_us"), 1), fmt_plain(r.get("avg_duration_us"), 2),
            fmt_plain(occurrences, 0),
            fmt_pct(r.get("occupancy_pct")) if "occupancy_pct" in r and occupancy_valid
            else na("not recorded"),
            parts(_yes_no(r.get("is_op_tensor_core_eligible")), " / ",
                  _yes_no(r.get("is_kernel_using_tensor_core"))),
            " / ".join(as_str(r.get(k)) for k in ("grid_dim", "block_dim") if r.get(k))))
    return table([("#", "num"), ("Kernel", "mono op"), ("Total µs", "num"), ("Avg µs", "num"),
                  ("Occurrences", "num"), ("Occupancy", "num"),
                  ("TensorCore eligible / used", ""), ("Grid / block", "mono nw")],
                 rows, collapse_after=10)


def _follow_ups(analysis: Mapping[str, Any], prefix: str) -> list[Mapping[str, Any]]:
    return [as_map(f) for f in as_list(analysis.get("follow_ups"))
            if isinstance(f, Mapping) and as_str(f.get("tool")).startswith(prefix)]


def _follow_up_lines(follow_ups: list[Mapping[str, Any]],
                     shown_above: Callable[[Mapping[str, Any]], bool] | None = None) -> Block:
    def result(f: Mapping[str, Any]) -> Cell:
        # A follow-up whose data is already rendered as a table would only repeat it here
        # as a truncated one-line dict.
        if shown_above is not None and shown_above(f):
            return Span("shown in the table above", "why")
        return text(f.get("result_summary"))

    return table([("Follow-up", ""), ("Status", ""), ("Purpose", ""), ("Result", "mono")],
                 ((Span(text(f.get("tool")), "mono"), chip(f.get("status")),
                   text(f.get("purpose")), result(f)) for f in follow_ups))


def _has_kernels(follow_up: Mapping[str, Any]) -> bool:
    return follow_up.get("status") == "DATA" and bool(_kernel_records(follow_up.get("data")))


def _kernels(analysis: Mapping[str, Any],
             device: SessionReading) -> list[Block]:
    entry = device.entry("get_kernel_stats")
    follow = _follow_ups(analysis, "get_kernel_stats")
    blocks: list[Block] = []
    records = _kernel_records(entry.get("data")) if entry.get("status") == "DATA" else []
    follow_data = next((as_map(f.get("data")) for f in follow if _has_kernels(f)), None)
    if records:
        blocks.append(kernel_table(records))
    elif follow_data is not None:
        count = measured(follow_data.get("kernel_count"))
        total = measured(follow_data.get("total_kernel_time_us"))
        shown = _kernel_records(follow_data)
        facts: list[Cell] = []
        if count is not None:
            facts.append(parts(Strong(f"{count:,.0f}"), " distinct kernels"))
        if total is not None:
            facts.append(parts(Strong(f"{total:,.1f} µs"), " total kernel time"))
        if count is not None and count > len(shown):
            facts.append(f"top {len(shown)} by total time shown")
        if facts:
            joined: list[Cell] = []
            for fact in facts:
                joined += [", ", fact] if joined else [fact]
            blocks.append(Para(parts(*joined, ".")))
        blocks.append(kernel_table(shown))
    elif entry:
        info = as_str(as_map(entry.get("data")).get("info"))
        if entry.get("status") == "DATA" and info:
            blocks.append(why(info))
        else:
            blocks += why_absent("get_kernel_stats", entry, device,
                                 "CPU profile: no GPU kernels.")
    if follow:
        rendered = follow_data is not None and not records
        blocks.append(_follow_up_lines(follow, _has_kernels if rendered else None))
    if not blocks:
        reason = ("Not collected: get_kernel_stats is a follow-up tool and the investigator "
                  "did not call it")
        reason += "; a CPU profile has no GPU kernels." if device.cpu else "."
        blocks.append(why(reason))
    return blocks


# ---------------------------------------------------------------- our detectors


def _join(value: object) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return "" if value is None else str(value)


def _detection_row(d: Mapping[str, Any]) -> tuple[tuple[Cell, ...], str]:
    ran = d.get("executed_in_profile") is not False
    instruction: list[Cell] = [text(d.get("instruction"))]
    inner = as_str(d.get("inner_instruction"))
    if inner and inner != d.get("instruction"):
        instruction.append(Span(parts("via ", Code(inner)), "subnote"))
    source = as_str(d.get("source"))
    if source:
        instruction.append(Span(source, "subnote"))
    time_cell: Cell
    pct_cell: Cell
    if ran:
        time_cell, pct_cell = fmt_ms(d.get("time_ms")), fmt_pct(d.get("percent_of_step"))
    else:
        time_cell = Span("did not run while profiling", "subnote")
        pct_cell = na("did not run while profiling")
    # in -> out; older detections carry a `shapes` / `layouts` list.
    shapes: Cell
    layouts: Cell
    if d.get("input_shape") is None and d.get("output_shape") is None:
        shapes = Wbr(_join(d.get("shapes")), ",")
    else:
        shapes = parts(Wbr(text(d.get("input_shape")) or "?", ","), Br(), "→ ",
                       Wbr(text(d.get("output_shape")) or "?", ","))
    if d.get("input_layout") is None and d.get("output_layout") is None:
        layouts = _join(d.get("layouts"))
    else:
        layouts = f"{text(d.get('input_layout')) or '?'} → {text(d.get('output_layout')) or '?'}"
    size = measured(d.get("bytes"))
    row = (text(d.get("module")), parts(*instruction), text(d.get("opcode")), shapes, layouts,
           fmt_mib(size / 2**20) if size is not None else "", time_cell, pct_cell,
           Prose(text(d.get("description"))))
    return row, "" if ran else "noexec"


def _detectors(device: SessionReading) -> list[Block]:
    blocks: list[Block] = []
    for name, label in _DETECTORS:
        entry = device.entry(name)
        status = entry.get("status")
        found = as_map(entry.get("data"))
        detections = [as_map(d) for d in as_list(found.get("detections"))
                      if isinstance(d, Mapping)]
        blocks.append(Heading(parts(label, " ", Span(f"({name})", "mono"), " ",
                                    chip(status or "not run")), css="gap"))
        if detections:
            built = [_detection_row(d) for d in detections]
            # Without step markers the shares are of the capture window (device time).
            windowed = all(as_str(d.get("share_of")) == "capture window" for d in detections)
            blocks.append(table(
                [("Module", "mono id"), ("Instruction", "mono id"), ("Opcode", "mono"),
                 ("Shapes (in → out)", "mono shape"), ("Layouts (in → out)", "mono nw"),
                 ("Bytes", "num"), ("Time", "num"),
                 ("% of device time" if windowed else "% of step", "num"),
                 ("Description", "desc")],
                [row for row, _ in built], collapse_after=8,
                row_classes=[css for _, css in built]))
            sources = {as_str(d.get("time_source")) for d in detections} | {
                as_str(found.get("time_source"))}
            sources.discard("")
            if sources:
                blocks.append(Para("Time source: " + "; ".join(sorted(sources)), "legend"))
        elif status in ("ERROR", "NO_DATA") or not entry:
            blocks += why_absent(name, entry, device, "")
        elif message := tool_reason(entry):
            blocks.append(why(message))
        else:
            scanned = measured(found.get("modules_scanned"))
            where = f" ({scanned:,.0f} HLO modules scanned)" if scanned is not None else ""
            blocks.append(why(f"No detections: the HLO has no instance of this pattern{where}."))
    return blocks


# ---------------------------------------------------------------- custom kernels and LLO


def _llo(analysis: Mapping[str, Any],
         device: SessionReading) -> list[Block]:
    blocks: list[Block] = []
    roof = data(device.entry("get_roofline_model"))
    custom = [as_map(op) for op in as_list(as_map(roof).get("top_operations"))
              if isinstance(op, Mapping) and (
                  "custom" in as_str(op.get("category")).lower()
                  or as_str(op.get("flops_provenance")) in ("derived_from_shapes",
                                                             "opaque_custom_call"))]
    if custom:
        blocks.append(table(
            [("Custom call", "mono"), ("Self time", "num"), ("FLOPs provenance", "mono")],
            ((text(op.get("name")), fmt_ms(op.get("total_self_time_ms")),
              text(op.get("flops_provenance"))) for op in custom)))
    elif roof is not None:
        blocks.append(why("No custom calls (Pallas/Mosaic or other kernels) among the roofline "
                          "top ops."))
    # The custom calls found in the HLO (LAPACK/FFI on CPU), timed on the timeline.
    calls = [as_map(c) for c in as_list(as_map(device.data(ev.CUSTOM_CALLS)).get(
        "custom_calls"))
        if isinstance(c, Mapping) and c.get("time_ms") is not None]
    if calls and not custom:
        share = ("Share of device time" if as_str(calls[0].get("share_of")) == "capture window"
                 else "Share of step")
        blocks += [
            Heading("Custom calls in the HLO (mldiag.custom_calls): "
                    "no roofline covers them here, so they have no FLOP count", css="gap"),
            table([("Custom call", "mono"), ("Target", "mono"), ("Source", "mono"),
                   ("Time", "num"), (share, "num")],
                  ((text(c.get("instruction")), text(c.get("target")), text(c.get("source")),
                    fmt_ms(c.get("time_ms")), fmt_pct(c.get("percent_of_step")))
                   for c in calls[:10]))]
    llo_tools = [device.entry(k) for k in device.tools if str(k).startswith("llo_")]
    follow = _follow_ups(analysis, "llo_")
    for entry in llo_tools:
        if entry.get("status") == "ERROR":
            blocks += why_absent(as_str(entry.get("name")) or "llo", entry, device, "")
    if follow:
        blocks.append(_follow_up_lines(follow))
    elif not llo_tools:
        if device.tpu:
            reason = ("No LLO follow-up was run: the investigator did not need "
                      "instruction-level (LLO) data for this session.")
        else:
            label = device.device_type or "unknown device"
            reason = (f"LLO_DATA_ABSENT: not a TPU trace ({label}); LLO exists only on TPU.")
        blocks.append(why(reason))
    return blocks


def tool_sections(analysis: Mapping[str, Any],
                  device: SessionReading) -> Section:
    return Section("tools", "Detailed tool analysis", [
        *_overview(device),
        ToolBlock("roofline", "Roofline", _roofline(device)),
        ToolBlock("memory", "Memory", _memory(device)),
        ToolBlock("hlo-ops", "HLO op profile", _hlo_ops(device)),
        ToolBlock("kernels", "Kernel statistics", _kernels(analysis, device)),
        ToolBlock("detectors", "Our detectors", _detectors(device)),
        ToolBlock("llo", "Custom kernels and LLO", _llo(analysis, device)),
    ])



