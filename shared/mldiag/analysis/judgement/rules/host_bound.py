"""host_bound: the device waits for the host between steps (our timeline's host wait).

Raised from our timeline pass (mldiag.timeline) (the worst host when there are several, a
straggler's host wait left to the straggler finding);
its follow-up names the host-side Python frames that fill the waits, and the fix says how to
take them off the step's critical path (or, when they are JAX's own dispatch, to jit the step).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.context import (
    Context,
    Plan,
    finding_of,
    host_events,
    host_events_plan,
    instrumentation_events,
    is_instrumentation,
)
from mldiag.analysis.judgement.model import Hypothesis, impact_of, priority_of
from mldiag.analysis.judgement.reading import SessionReading

CATEGORY = "host_bound"
RAISE_ORDER = 10
HOST_WAIT_P0_PERCENT = 50.0
HOST_WAIT_P1_PERCENT = 20.0


def hypotheses(reading: SessionReading) -> list[Hypothesis]:
    snapshot = reading.snapshot
    hb = ev.tool_data(snapshot, ev.TIMELINE)
    if not hb or not hb.get("steps_analyzed"):
        return []
    tool = ev.TIMELINE
    wait = ev.number(hb.get("host_wait_percent"))
    hosts = [h for h in hb.get("per_host") or [] if h.get("host_wait_percent") is not None]
    proof: list[dict[str, Any]] = []
    if reading.pod is not None and reading.pod.stragglers:
        # A straggler's own host wait is the straggler finding; judge the others.
        late = {s.host for s in reading.pod.stragglers}
        hosts = [h for h in hosts if h.get("host") not in late]
        if not hosts:
            return []
    if len(hosts) > 1 or len(hb.get("per_host") or []) > 1:
        # An average over hosts hides a straggler: judge and cite the worst host.
        i, worst = max(enumerate(hosts), key=lambda kv: kv[1]["host_wait_percent"])
        index = (hb.get("per_host") or []).index(worst)
        wait = float(worst["host_wait_percent"])
        proof += [ev.cite(snapshot, tool, f"per_host[{index}].{k}") for k in (
            "host", "host_wait_percent", "step_time_ms_average", "compute_busy_ms_average")]
        step_ms = float(worst["step_time_ms_average"])
        wait_ms = step_ms - float(worst["compute_busy_ms_average"] or 0.0)
        who = f"host {worst['host']} waits"
    else:
        step_ms = float(hb["step_time_ms_average"])
        wait_ms = ev.number(hb.get("host_wait_ms_average")) or 0.0
        who = "the device waits"
    if wait is None or wait < HOST_WAIT_P1_PERCENT:
        return []
    proof += [ev.cite(snapshot, tool, k) for k in (
        "host_wait_percent", "step_time_ms_average", "compute_busy_ms_average",
        "steps_mostly_waiting", "steps_analyzed")]
    return [Hypothesis(
        category="host_bound",
        priority=priority_of(wait, HOST_WAIT_P0_PERCENT, HOST_WAIT_P1_PERCENT),
        title=f"Host-bound: {who} {wait:.1f}% of each step for the host",
        evidence=proof,
        impact=impact_of(wait, "% of step",
                       f"up to {wait_ms:.1f} ms of each {step_ms:.1f} ms step ({wait:.1f}%) is "
                       "spent outside compiled XLA work"),
        details={"host_wait_ms": wait_ms},
    )]


def follow_ups(snapshot: Mapping[str, Any], h: Hypothesis) -> list[Plan]:
    return [host_events_plan()]

_JAX_INTERNAL = re.compile(r"jax/_src|pjit\.py|dispatch\.py|api\.py|_infer_params|"
                           r"lax\.py|numpy/reductions|array_methods")


def _user_frames(ctx: Context, step_ms: float) -> list[str]:
    """The user's own Python frames among the host events, longest first: not JAX's, not the
    runtime's, not instrumentation, and not enclosing the loop: shorter than a step, or called
    at least once a step (the step function itself, whose calls in the left-out warm-up steps
    can make its average longer than a judged step's)."""
    data = ctx.data("host_events")
    rows = data.get("aggregates", []) if isinstance(data, Mapping) else []
    steps = int(ev.number(ev.get(ctx.snapshot, ev.TIMELINE, "steps_analyzed")) or 0)
    out = []
    for row in sorted(rows, key=lambda r: -float(r.get("total_duration_ps", 0))):
        name = str(row.get("event", ""))
        avg_ms = float(row.get("avg_duration_ps", 0)) / 1e9
        per_step = steps > 0 and int(row.get("count") or 0) >= steps
        if (".py:" in name and not _JAX_INTERNAL.search(name) and (avg_ms <= step_ms or per_step)
                and not is_instrumentation(ctx.snapshot, row)
                and not _NOT_USER.search(name)):
            out.append(name.lstrip("$"))
    return out


_NOT_USER = re.compile(r"site-packages|threading\.py|<module>|numpy/|contextlib\.py|"
                       r"ufunc_api|array_methods|__call__|__enter__|__exit__")


def finding(h: Hypothesis, ctx: Context) -> dict[str, Any]:
    hb = ev.tool_data(ctx.snapshot, ev.TIMELINE) or {}
    step_ms = float(hb.get("step_time_ms_average") or 0.0)
    busy_ms = float(hb.get("compute_busy_ms_average") or 0.0)
    culprits = host_events(ctx, step_ms) if step_ms else []
    extra = []
    names = []
    for i, row in culprits:
        extra.append(ev.cite_value("aggregate_xplane_events", f"aggregates[{i}].event",
                                   ctx.data("host_events")))
        extra.append(ev.cite_value("aggregate_xplane_events", f"aggregates[{i}].avg_duration_ps",
                                   ctx.data("host_events")))
        names.append(f"`{row['event'].lstrip('$')}` ({row['avg_duration_ps'] / 1e9:.1f} ms per "
                     "call)")
    what = (f"Each step takes {step_ms:.1f} ms of wall time but compiled XLA work runs only "
            f"{busy_ms:.2f} ms of it; {hb.get('steps_mostly_waiting')} of "
            f"{hb.get('steps_analyzed')} steps spend over half their time waiting for the host.")
    if names:
        what += " The host is busy in " + ", ".join(names) + " between device executions."
    measuring = instrumentation_events(ctx, step_ms) if step_ms else []
    if measuring:
        what += (" Not counted as the cause: " + ", ".join(f"`{m}`" for m in measuring)
                 + " (instrumentation: the profiler, mldiag's SDK or JAX's traceback filter, "
                 "which wraps each call it measures).")
        took = ev.number(ev.get(ctx.snapshot, tool := ev.TIMELINE,
                                "host_instrumentation.instrumentation_ms"))
        if took:
            what += f" Instrumentation ran {took:.1f} ms of host Python time in the capture."
            extra.append(ev.cite(ctx.snapshot, tool, "host_instrumentation.instrumentation_ms"))
    fix = ("Take host work off the step's critical path: produce batches in a background thread "
           "or process and prefetch them to the device (e.g. a `queue.Queue` filled by a "
           "producer thread plus `jax.device_put` of the next batch while the current step runs, "
           "or `grain`/`tf.data` with `.prefetch`), and avoid a host sync per step "
           "(`.block_until_ready()`, `float(loss)`, `print(loss)`) so JAX's async dispatch can "
           "overlap the host with the device.")
    jax_internal = [row for _, row in culprits if _JAX_INTERNAL.search(str(row["event"]))]
    user = _user_frames(ctx, step_ms)
    if culprits and len(jax_internal) * 2 >= len(culprits):
        # A host loop: the fix is at the user's frame that issues the little operations.
        loop = ""
        if user:
            where, _, func = user[0].partition(" ")
            loop = f"At `{where}` (`{func}`): " if func else f"At `{where}`: "
        fix = (loop + "The host time is JAX's own dispatch and tracing (" + ", ".join(
            f"`{r['event'].lstrip('$')}`" for r in jax_internal[:2]) + "): the step runs as "
            "many small un-jitted operations. Wrap the whole training step in one `jax.jit` "
            "(arguments that change shape or are Python values go in `static_argnums` or "
            "become arrays), so each step is one dispatch of one compiled program.")
    elif names:
        fix = f"Remove or overlap {names[0]} first: " + fix[0].lower() + fix[1:]
    return finding_of(h, what, fix, extra)
