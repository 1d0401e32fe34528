"""straggler: one host (or a few) arrives late at the collectives and the others wait for it.

Raised from the cross-host pass (`mldiag.timeline pod`, `collection/hosts/pod.py`), which
aligns the hosts' steps and clocks, splits collective time into waiting and transfer, and
names a straggler only when a stated test across the steps says so (jitter does not). The
finding says which host, by how much per step, what the others lose, what that host spends
its extra time on (its own figures and, with Python-tracer frames, its own slow function and
per-call time, not the session's average), and the step time without the wait.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.context import Context, Plan, finding_of
from mldiag.analysis.judgement.model import Hypothesis, impact_of, priority_of
from mldiag.analysis.judgement.reading import SessionReading, Straggler, reading_of

CATEGORY = "straggler"
RAISE_ORDER = 5
# What the other hosts lose waiting, as a share of their step.
LOST_P0_PERCENT = 25.0
LOST_P1_PERCENT = 10.0
HOST_WAIT = "host wait"
_CAUSES = {HOST_WAIT: "host wait (the device idle while the host prepares the step: input "
                      "pipeline, dispatch)",
           "device compute": "device compute"}


def hypotheses(reading: SessionReading) -> list[Hypothesis]:
    pod = reading.pod
    if pod is None or not pod.stragglers:
        return []
    snapshot = reading.snapshot
    out = []
    for s in pod.stragglers:
        base = f"pod.stragglers[{s.index}]"
        proof = [ev.cite(snapshot, ev.TIMELINE, f"{base}.{k}") for k in (
            "host", "lateness_ms_per_step", "others_wait_ms_per_step",
            "others_wait_percent_of_step", "cause", "cause_excess_ms_per_step",
            "session_step_ms", "session_step_ms_if_median")]
        proof.append(ev.cite(snapshot, ev.TIMELINE, "pod.common_steps"))
        if s.function is not None:
            proof += [ev.cite(snapshot, ev.TIMELINE, f"{base}.function.{k}")
                      for k in ("event", "ms_per_call", "others_ms_per_call")]
        lost = s.others_wait_percent or 0.0
        others = pod.hosts - len(pod.stragglers)
        unit = pod.unit
        out.append(Hypothesis(
            category=CATEGORY, priority=priority_of(lost, LOST_P0_PERCENT, LOST_P1_PERCENT),
            title=(f"Straggler: {s.host} arrives {s.lateness_ms:.1f} ms late at each "
                   f"{unit}'s collectives; the other {others} host{'s' if others != 1 else ''} "
                   f"wait {s.others_wait_ms:.1f} ms ({lost:.0f}% of "
                   f"their {unit})"),
            evidence=proof,
            impact=impact_of(lost, "% of step",
                             f"each step would take about {s.session_step_ms_if_median:.1f} ms "
                             f"instead of {s.session_step_ms:.1f} ms if {s.host} were as fast "
                             "as the median host"),
            details={"host": s.host, "cause": s.cause, "hosts": pod.hosts,
                     "steps": pod.common_steps, "unit": unit},
        ))
    return out


def follow_ups(snapshot: Mapping[str, Any], h: Hypothesis) -> list[Plan]:
    return []


def _straggler(ctx: Context, host: str) -> Straggler | None:
    reading = ctx.triage.reading or reading_of(ctx.snapshot)
    pod = reading.pod
    return next((s for s in pod.stragglers if s.host == host), None) if pod else None


def finding(h: Hypothesis, ctx: Context) -> dict[str, Any]:
    host = str(h.details.get("host"))
    s = _straggler(ctx, host)
    steps = h.details.get("steps")
    if s is None:
        return finding_of(h, f"Host {host} arrives late at the collectives.", _fix("", None))
    unit = str(h.details.get("unit") or "step")
    rounds = (" (the job marks no steps: a round ends with each execution of the collective "
              "every host runs most)" if unit == "round" else "")
    what = (f"Across {steps} {unit}s{rounds}, {host} reaches each {unit}'s collectives "
            f"{s.lateness_ms:.1f} ms after the other hosts (a sign test across the {unit}s, "
            f"not one slow {unit}), and they wait for it: {s.others_wait_ms:.1f} ms of their "
            f"{unit} is waiting, not transfer. On {host}, its "
            f"{_CAUSES.get(s.cause, s.cause)} exceeds the median host's by "
            f"{s.cause_excess_ms:.1f} ms per {unit}.")
    fn = s.function
    if fn:
        others = fn.get("others_ms_per_call")
        what += (f" Its Python frame `{fn['event'][1:]}` takes {fn['ms_per_call']:.1f} ms per "
                 f"call there" + (f" against {others:.1f} ms on the other hosts"
                                  if others is not None else "") + ".")
    reading = ctx.triage.reading or reading_of(ctx.snapshot)
    if reading.pod is not None and reading.pod.failed_hosts:
        left = sorted(reading.pod.failed_hosts)
        what += (f" Left out: {', '.join(left)} (" + "; ".join(
            reading.pod.failed_hosts[h] for h in left) + "); the hosts are compared without "
            + ("it." if len(left) == 1 else "them."))
    if reading.pod is not None and reading.pod.data.get("note"):
        what += f" Steps: {reading.pod.data['note']}."
    return finding_of(h, what, _fix(s.cause, fn, host))


def _fix(cause: str, fn: Mapping[str, Any] | None, host: str = "that host") -> str:
    where = f"At `{fn['where']}` on {host}: " if fn else f"On {host}: "
    if cause.startswith(HOST_WAIT):
        return where + (
            "its device sits idle before each step while the host prepares it; that host's "
            "input is slower than the others'. Prefetch batches off the training thread "
            "(`tf.data` `.prefetch`, a grain/`DataLoader` worker pool, or "
            "`jax.device_put` of the next batch while this one runs), and check what is "
            "different there: its data shard or storage, CPU contention from other "
            "processes, or per-host work (logging, checkpoints) only it does. Bandwidth "
            "fixes to the collective will not help: the others are waiting, not transferring.")
    return where + (
        "its device compute per step is longer than the other hosts'. Check that every host "
        "gets an equal share of the work (uneven batch or sequence lengths per host, padding), "
        "and that its accelerator runs at the others' speed (a degraded or throttled chip, a "
        "different type). Bandwidth fixes to the collective will not help: the others are "
        "waiting, not transferring.")
