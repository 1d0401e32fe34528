"""The background prober: the last known liveness of every plain profiler server.

A plain profiler server (a push target without heartbeats: `jax.profiler.start_server`
registered by `profiler-target create`) tells nobody whether it is up, so something must
connect to it. That happens here, and nowhere on a read path: runs lists, console pages and
`targets list` show the stored answer with its age (`capture.targets.status`).

A pass (`probe_targets`) checks the targets whose last check is older than
`probe_interval_s`, in its own threads, never the bus's workers: at most `probe_workers`
checks at once in all and `probe_per_run` per run, runs interleaved, so that one run's silent
targets cannot delay another's. Each check takes at most `probe_timeout_s` and starts no
profiling session (`remote.probe`), so it cannot collide with the workload's own tracing.
Locally the runtime runs a pass every few seconds (`LocalRuntime`); on Google Cloud the
`sweep` function runs one per tick.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

from mldiag.capture.targets import probe_now, watched_by_probe
from mldiag.model import TargetRecord
from mldiag.stages.services import Services

log = logging.getLogger(__name__)
# A pass starts no check after this long (the sweep function ticks every minute): the targets
# it did not reach are the first due in the next pass.
PASS_BUDGET_S = 45.0


def due_targets(services: Services, now: float) -> dict[str, list[TargetRecord]]:
    """Per run, its plain profiler servers whose last check is `probe_interval_s` old."""
    interval = services.settings.probe_interval_s
    due: dict[str, list[TargetRecord]] = {}
    for run in services.state.list_runs():
        targets = [t for t in services.state.list_targets(run.name)
                   if watched_by_probe(t) and now - t.probed_at >= interval]
        if targets:
            due[run.name] = targets
    return due


def probe_targets(services: Services) -> dict[str, int]:
    """One pass of the prober: check each due target (see the module); how many were up
    and down. Bounded: at most `probe_workers` checks at once, `probe_per_run` of one run,
    and no check started after `PASS_BUDGET_S`."""
    settings = services.settings
    due = due_targets(services, services.clock())
    if not due:
        return {"up": 0, "down": 0}
    per_run = max(1, settings.probe_per_run)
    # Each lane checks its share of one run's targets, one after another; lanes are queued
    # run by run (every run's first lane, then every run's second), so the pool's workers
    # are shared fairly and one run never has more than `per_run` checks running.
    lanes: list[list[TargetRecord]] = []
    for lane in range(per_run):
        for targets in due.values():
            share = targets[lane::per_run]
            if share:
                lanes.append(share)
    counts = {"up": 0, "down": 0}
    deadline = time.monotonic() + PASS_BUDGET_S

    def check(share: list[TargetRecord]) -> list[str]:
        out = []
        for t in share:
            if time.monotonic() >= deadline:
                break
            try:
                out.append(probe_now(t, settings, services.state, services.clock())[0])
            except Exception as e:  # noqa: BLE001 - one target's record must not stop the pass
                log.warning("liveness check of %s/%s failed: %s", t.run, t.host, e)
        return out

    with ThreadPoolExecutor(max(1, min(settings.probe_workers, len(lanes))),
                            thread_name_prefix="mldiag-probe") as pool:
        for states in pool.map(check, lanes):
            for state in states:
                counts[state] = counts.get(state, 0) + 1
    return counts
