"""idle: no device op runs for a share of the step (or of the capture window).

Raised from the first of the device-idle sources (`readings.idle_sources`). On CPU its
follow-up names the host frames busy while the device idles; on GPU the kernel statistics
name what the device does run (a TensorFlow trace gets TensorFlow advice).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.context import (
    Context,
    Plan,
    finding_of,
    host_events,
    host_events_plan,
)
from mldiag.analysis.judgement.model import Hypothesis, impact_of, priority_of
from mldiag.analysis.judgement.reading import SessionReading
from mldiag.analysis.judgement.readings import device_idle_evidence

CATEGORY = "idle"
RAISE_ORDER = 20
IDLE_P0_PERCENT = 30.0
IDLE_P1_PERCENT = 10.0
KERNEL_TABLE_FROM = ("xprof's kernel_stats converter table (the kernel stats page's data, not "
                     "`xprof get_kernel_stats`), one row per kernel, sorted by "
                     "total_duration_us; kernel_count and total_kernel_time_us over all rows, "
                     "percent_of_kernel_time each row's total_duration_us over that total",)


def hypotheses(reading: SessionReading) -> list[Hypothesis]:
    snapshot, metrics = reading.snapshot, reading.values
    if reading.cpu and metrics.get("device_idle_window") == "steps":
        return []  # On CPU with steps, the host-bound analysis covers idle time.
    idle = metrics.get("device_idle_percent")
    if idle is None or idle < IDLE_P1_PERCENT:
        return []
    if reading.steps.micro_benchmark:
        return []  # launch gaps of a micro-benchmark: a note (triage), not a finding
    proof = device_idle_evidence(snapshot, reading.cpu)
    window = metrics.get("device_idle_window") or "capture window"
    per_step = window == "steps" and proof[0]["tool"] == "get_step_trace"
    steps = int(ev.number(ev.get(snapshot, "get_step_trace", "summary.total_steps")) or 0)
    duty = ev.get(snapshot, "get_xprof_overview", "performance_summary.device_duty_cycle_percent")
    if duty is not None and not reading.cpu:  # xprof's device metrics are not CPU's
        proof.append(ev.cite(snapshot, "get_xprof_overview",
                             "performance_summary.device_duty_cycle_percent"))
    hb = ev.tool_data(snapshot, ev.TIMELINE) or {}
    hosts = hb.get("per_host") or []
    busy = "per_host[0].busy_in_active_span_percent"
    if hosts and hosts[0].get("busy_in_active_span_percent") is not None and not any(
            p["tool"] == ev.TIMELINE and p["field"] == busy for p in proof):
        proof.append(ev.cite(snapshot, ev.TIMELINE, busy))
    idle_devices: list[str] = []
    devices = (hosts[0].get("devices") or []) if hosts else []
    if len(devices) > 1 and hosts[0].get("idle_devices"):
        idle_devices = list(hosts[0]["idle_devices"])
        proof.append(ev.cite(snapshot, ev.TIMELINE, "per_host[0].idle_devices"))
    priority = priority_of(idle, IDLE_P0_PERCENT, IDLE_P1_PERCENT)
    scope = "the profiled time" if window == "steps" else "the capture window"
    if per_step:
        scope = "each step"
        if steps < 3:
            # One or two steps are too few to call critical: warm-up or a one-off stall.
            scope = f"the {steps} captured step{'s' if steps != 1 else ''}"
            priority = "P1" if priority == "P0" else priority
    title = f"Device idle {idle:.1f}% of {scope}"
    if idle_devices:
        names = ", ".join(d.rsplit("/", 1)[-1].replace("device:", "") for d in idle_devices)
        title += f"; {len(idle_devices)} of {len(devices)} devices ran no work ({names})"
    return [Hypothesis(
        category="idle",
        priority=priority,
        title=title,
        evidence=proof,
        impact=impact_of(idle, "% of step" if per_step else "% of device time",
                       f"{idle:.1f}% of {'step' if per_step else 'device'} time has no op "
                       f"running (source: {metrics.get('device_idle_source')})"),
        details={"source": metrics.get("device_idle_source"), "window": window,
                 "sources": metrics.get("device_idle_sources"),
                 "idle_devices": idle_devices, "devices": len(devices), "cpu": reading.cpu},
    )]


def follow_ups(snapshot: Mapping[str, Any], h: Hypothesis) -> list[Plan]:
    # With steps on CPU the host-bound finding covers idle time; without, idle asks.
    return [host_events_plan()] if h.details.get("cpu") else []


def _share_of(kernel: Mapping[str, Any], total_us: float) -> float:
    """A kernel's share of kernel time, as the kernel table states it (tables recorded before
    it did: computed the same way)."""
    stated = ev.number(kernel.get("percent_of_kernel_time"))
    if stated is not None:
        return stated
    return 100.0 * (ev.number(kernel.get("total_duration_us")) or 0.0) / total_us


def finding(h: Hypothesis, ctx: Context) -> dict[str, Any]:
    kernels = ctx.data("kernels")
    extra = []
    if isinstance(kernels, Mapping) and kernels.get("kernels"):
        for f in ("kernel_count", "total_kernel_time_us", "kernels[0].kernel_name",
                  "kernels[0].total_duration_us", "kernels[0].occurrences"):
            extra.append(ev.cite_value(ev.KERNEL_TABLE, f, kernels, KERNEL_TABLE_FROM))
    scope = ("each step" if h.impact.get("unit") == "% of step" else
             "the capture window" if h.details.get("window") == "capture window" else
             "the profiled device time")
    what = (f"No device op runs for {h.impact.get('value')}% of {scope}: the device waits on "
            "the host (input pipeline, Python dispatch, synchronisation) or on other workers.")
    span = ev.number(ev.get(ctx.snapshot, ev.TIMELINE, "per_host[0].active_span_ms"))
    culprits = host_events(ctx, span, 1) if span and h.details.get("cpu") else []
    busy_in = []
    for i, row in culprits:
        for f in ("event", "count", "avg_duration_ps"):
            extra.append(ev.cite_value("aggregate_xplane_events", f"aggregates[{i}].{f}",
                                       ctx.data("host_events")))
        busy_in.append(f"`{row['event'].lstrip('$')}` ({row.get('count')} calls, "
                     f"{row['avg_duration_ps'] / 1e9:.1f} ms each)")
    if busy_in:
        what += (f" Over the {span:.0f} ms window the host is busy in " + ", ".join(busy_in)
                 + " while no device op runs.")
    rows = [k for k in (kernels.get("kernels", []) if isinstance(kernels, Mapping) else [])
            if isinstance(k, Mapping)]
    names = " ".join(str(k.get("kernel_name", "")) for k in rows)
    total_us = ev.number(kernels.get("total_kernel_time_us")) if isinstance(
        kernels, Mapping) else None
    if rows and total_us:
        # Name what the device does run: the top kernels, by their short names.
        named = [f"`{_kernel_short_name(str(k.get('kernel_name', '')))}` "
                 f"({_share_of(k, total_us):.1f}% "
                 f"of kernel time, {int(ev.number(k.get('occurrences')) or 0)} launches)"
                 for k in rows[:2]]
        for i, k in enumerate(rows[:2]):
            if k.get("percent_of_kernel_time") is not None:
                extra.append(ev.cite_value(ev.KERNEL_TABLE,
                                           f"kernels[{i}].percent_of_kernel_time", kernels,
                                           KERNEL_TABLE_FROM))
        what += " When it runs, its top kernels are " + " and ".join(named) + "."
    tensorflow = "tensorflow::" in names
    if tensorflow:
        # Kernel names give the framework away; JAX advice would not apply to this trace.
        what += " The kernels are TensorFlow's (tensorflow:: kernels), so this is a TF program."
    idle_devices = [str(d) for d in h.details.get("idle_devices") or ()]
    if idle_devices:
        # Devices that ran nothing at all are placement, not input: no prefetching puts work
        # on a device the program never uses.
        total = int(h.details.get("devices") or 0) or len(idle_devices)
        what += (f" {len(idle_devices)} of {total} devices ran no op at all: the program runs "
                 f"on {total - len(idle_devices)} of them, so most of this idle time is work "
                 "that was never placed on the others, not an input stall.")
        fix = (("Distribute the step over every GPU: build the model and optimizer inside "
                "`tf.distribute.MirroredStrategy().scope()` (or `MultiWorkerMirroredStrategy` "
                "across hosts), feed it through `strategy.experimental_distribute_dataset(...)` "
                "and scale the global batch by `strategy.num_replicas_in_sync`; check that "
                "`tf.config.list_logical_devices('GPU')` lists them all.") if tensorflow else
               ("Put work on every device: shard the batch over all of them (a "
                "`jax.sharding.Mesh(jax.devices(), ('data',))` with "
                "`NamedSharding(mesh, P('data'))` on the inputs, or `jax.pmap`), make sure the "
                "inputs are not committed to one device (`jax.device_put` with the sharding), "
                "and check that `jax.devices()` lists every device the job was given."))
    elif tensorflow:
        fix = ("Overlap input with compute with `tf.data` (`.prefetch(tf.data.AUTOTUNE)`, "
               "`.cache()`, parallel `map`), run the step as one `tf.function(jit_compile=True)` "
               "so ops are not dispatched one by one, and remove per-step host syncs "
               "(`.numpy()`, printing losses).")
    elif busy_in:
        fix = (f"Take {busy_in[0]} off the path between device calls: run it in a background "
               "thread or process (or drop it), prefetch the next batch to the device while "
               "the current one computes, and issue several jitted calls before blocking on a "
               "result, so JAX's async dispatch keeps the device busy.")
    else:
        stepped = h.details.get("window") == "steps"
        gaps = ("gaps between steps" if stepped else
                "gaps between device ops (the trace has no step markers)")
        unit = "step" if stepped else "call"
        fix = (f"Look at the trace viewer's {gaps}: overlap input with compute "
               f"(prefetch to device), remove per-{unit} host syncs (`.block_until_ready()`, "
               f"`.item()`, printing losses), and make sure each {unit} is one compiled "
               f"program (`jax.jit` the whole {unit}, not its pieces) so dispatch gaps "
               "disappear.")
    return finding_of(h, what, fix, extra)


def _kernel_short_name(name: str) -> str:
    """`void ns::Kernel<T...>(args)` → `ns::Kernel`: a GPU kernel's name without its
    return type, template arguments and parameters."""
    name = name.removeprefix("void ").strip()
    for stop in ("<", "("):
        name = name.split(stop, 1)[0]
    return name or "unnamed kernel"
