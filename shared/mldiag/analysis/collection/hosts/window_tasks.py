"""A large host's time windows shared by the tasks of the collect job.

On Google Cloud the collect job runs several tasks (Cloud Run's task index and count). Task 0
runs the whole collection (`collect(exchange=...)`); the others each convert a share of the
host's time windows (`convert_windows`) and publish every window's op_stats (and its share of
our timeline pass) as soon as it is built. Task 0 combines them with its own once all are
there. Locally, the same windows are jobs of the one process pool.

Who converts a window is decided by claims (`WindowExchange.take`): a task claims its share
before it has even downloaded the file, and holds the claims while it works. A task that
dies stops renewing them; once a claim lapses, task 0 takes the window over and builds it
itself, so a dead task delays the session but never loses it. Every published window is kept
under the session's version, so a retried task 0 (or a later execution of the job) reuses
them.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from mldiag.analysis.collection import plan
from mldiag.analysis.collection.profile_input import ProfileSession, validate_xplane
from mldiag.analysis.collection.workers import (
    DATA,
    ERROR,
    NO_DATA,
    Outcome,
    default_budget_bytes,
    reason_of,
)
from mldiag.analysis.collection.xprof_tools import XprofWorkspace

WINDOW_JOB = "op_stats_window"
SPLIT_JOB = "split_windows"


class WindowExchange(Protocol):
    """Where the tasks of one collection meet: claims on windows, and the published ones."""

    task: int

    def take(self, window: int) -> bool:
        """Claim `window` for this task; False while another task holds it or has published
        it. A claim is held (renewed) until `publish` or `give_up`."""
        ...

    def give_up(self, window: int) -> None:
        """Let the window go unpublished (its build failed here): another task may take it."""
        ...

    def publish(self, window: int, meta: Mapping[str, Any], op_stats: Path | None) -> None:
        """Keep the window's op_stats (None: the window had no data) with `meta`, and end the
        claim."""
        ...

    def published(self) -> dict[int, dict[str, Any]]:
        """Every published window's `meta`, by window."""
        ...

    def fetch(self, window: int, dest: Path) -> None:
        """Copy a published window's op_stats to `dest`."""
        ...


def job_name(window: int) -> str:
    return f"{WINDOW_JOB}{window}"


def window_of(name: str) -> int:
    return int(name.removeprefix(WINDOW_JOB))


def window_meta(outcome: Outcome, split: Mapping[str, Any], task: int) -> dict[str, Any]:
    """What a task publishes with a window it built: enough for task 0 to check that it cut
    the same windows (their count and the cut times), and the window's own result."""
    value = outcome.value if isinstance(outcome.value, Mapping) else {}
    return {"window": window_of(outcome.name), "windows": int(split["windows"]),
            "cuts": [int(c) for c in split["cuts"]],
            "steps": split.get("steps", []), "excluded_steps": split.get("excluded_steps", []),
            # The window's share of our timeline pass (`jobs.timeline_from_windows`).
            "timeline": value.get("timeline"),
            "seams": dict(split["seams"]), "status": outcome.status,
            "reason": value.get("reason") if outcome.status == NO_DATA else None,
            "bytes": value.get("bytes") if outcome.status == DATA else None,
            "elapsed_ms": outcome.elapsed_ms, "peak_rss_bytes": outcome.peak_rss_bytes,
            "task": task}


class RemoteWindows:
    """Task 0's view of the windows other tasks convert (`workers.RemoteJobs`).

    The cut (`split_windows`) and every window job are shared: a window job runs here only
    once this task can claim the window (its task died, or never came), and the others'
    windows arrive as outcomes as they are published. The cut runs here only when this task
    must build a window before any was published (after `grace_s`, so that the other tasks,
    which claim their share when they start, are not raced); otherwise its outcome is the
    published windows' (their count, cut times and the idle time between them), and a window
    taken over later is cut alone by its job. Claims and listings are rate-limited: the
    scheduler asks often."""

    def __init__(self, exchange: WindowExchange, windows: int, into: Path, *,
                 every_s: float = 2.0, grace_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.exchange = exchange
        self.windows = windows
        self.names = frozenset({SPLIT_JOB, *(job_name(k) for k in range(windows))})
        self._into = into
        self._every = every_s
        self._clock = clock
        self._start = clock()
        self._grace = grace_s
        self._cuts: list[int] | None = None
        self._split: dict[str, Any] = {}
        self._asked: dict[str, float] = {}
        self._polled = float("-inf")
        self._delivered: set[int] = set()
        self._built: set[int] = set()
        self._held: set[int] = set()
        self.by_task: dict[int, int] = {}

    def expect(self, split: Mapping[str, Any]) -> None:
        """The cut's result (run here, or from the published windows): published windows are
        taken only when they were cut the same way."""
        self._cuts = [int(c) for c in split["cuts"]]
        self._split = dict(split)

    def _claim(self, k: int) -> bool:
        if k in self._held:
            return True
        if self.exchange.take(k):
            self._held.add(k)
            self.by_task[k] = self.exchange.task
            return True
        return False

    def take(self, name: str) -> bool:
        now = self._clock()
        if now - self._asked.get(name, float("-inf")) < self._every:
            return False
        self._asked[name] = now
        if name == SPLIT_JOB:
            # Cut here only to build a window nobody holds, before any was published.
            if now - self._start < self._grace or self._cuts is not None:
                return False
            return any(self._claim(k) for k in range(self.windows)
                       if k not in self._delivered)
        return self._claim(window_of(name))

    def poll(self) -> list[Outcome]:
        now = self._clock()
        if now - self._polled < self._every:
            return []
        self._polled = now
        out = []
        published = sorted(self.exchange.published().items())
        if self._cuts is None:
            first = next((m for _, m in published if m.get("windows") == self.windows), None)
            if first is None:
                return []
            split: dict[str, Any] = {
                "windows": int(first["windows"]), "cuts": list(first["cuts"]),
                "seams": dict(first["seams"]), "window_bytes": {},
                "steps": first.get("steps", []),
                "excluded_steps": first.get("excluded_steps", []), "task": first.get("task")}
            self.expect(split)
            out.append(Outcome(SPLIT_JOB, DATA, split, 0.0))
        assert self._cuts is not None
        for k, meta in published:
            if k in self._delivered or k in self._built or job_name(k) not in self.names:
                continue
            if meta.get("windows") != len(self._cuts) + 1 or meta.get("cuts") != self._cuts:
                continue  # cut another way (other settings): this task builds it itself
            self._delivered.add(k)
            self.by_task[k] = int(meta.get("task", -1))
            elapsed = float(meta.get("elapsed_ms") or 0.0)
            if meta.get("status") == NO_DATA:
                out.append(Outcome(job_name(k), NO_DATA, {"reason": meta.get("reason")},
                                   elapsed))
                continue
            self._into.mkdir(parents=True, exist_ok=True)
            dest = self._into / f"window{k}.op_stats.pb"
            self.exchange.fetch(k, dest)
            out.append(Outcome(job_name(k), DATA, {
                "window": k, "op_stats": str(dest), "bytes": dest.stat().st_size,
                "timeline": meta.get("timeline"),
                "task": meta.get("task")}, elapsed,
                peak_rss_bytes=meta.get("peak_rss_bytes")))
        return out

    def arrived(self, name: str) -> bool:
        """Whether the job's outcome came from another task (or an earlier attempt)."""
        if name == SPLIT_JOB:
            return "task" in self._split
        return window_of(name) in self._delivered

    def built_here(self, outcome: Outcome) -> None:
        """A window this task built: published too, so that a retry of this task reuses it."""
        k = window_of(outcome.name)
        if k in self._delivered or not self._split:
            return
        self._built.add(k)
        self._held.discard(k)
        if outcome.status == ERROR:
            self.exchange.give_up(k)
            return
        path = Path(outcome.value["op_stats"]) if outcome.status == DATA else None
        self.exchange.publish(k, window_meta(outcome, self._split, self.exchange.task), path)


def task_windows(windows: int, task: int, tasks: int) -> list[int]:
    """The windows task `task` of `tasks` converts first. Task 0 runs the rest of the
    collection, so with more than one task the others share the windows between them."""
    if tasks <= 1:
        return list(range(windows))
    if task == 0:
        return []
    return [k for k in range(windows) if k % (tasks - 1) == task - 1]


def convert_windows(
    xplane: Path,
    exchange: WindowExchange,
    windows: int,
    held: Sequence[int],
    *,
    tool_timeout_s: float = 300.0,
    prepare_timeout_s: float = 300.0,
    max_host_bytes: int | None = None,
    memory_budget_bytes: int | None = None,
) -> dict[str, Any]:
    """A task's share of a large host: cut the windows `held` (claimed by this task) out of
    `xplane` in one pass, build each one's op_stats in the two workers, and publish each as
    soon as it is built. A window whose build fails is given up, for task 0 to take over.
    Returns what was done, JSON-able."""
    if max_host_bytes is not None:
        validate_xplane(xplane, max_bytes=max_host_bytes)
    session = ProfileSession(run="", name="windows", path=xplane.parent, xplanes=(xplane,))
    budget = memory_budget_bytes or default_budget_bytes()
    size = xplane.stat().st_size
    jobs = plan.window_jobs(size, windows, held, prepare_timeout_s=prepare_timeout_s)
    split: dict[str, Any] = {}
    done: dict[int, str] = {}

    def on_outcome(o: Outcome) -> None:
        if o.name == "split_windows":
            if o.status == DATA:
                split.update(o.value)
            return
        k = window_of(o.name)
        if o.status == ERROR or not split:
            exchange.give_up(k)
            done[k] = f"given up: {reason_of(o)}"
            return
        exchange.publish(k, window_meta(o, split, exchange.task),
                         Path(o.value["op_stats"]) if o.status == DATA else None)
        done[k] = o.status

    def inputs_for(job: Any, outcomes: Mapping[str, Outcome]) -> dict[str, Any]:
        if job.name == "split_windows":
            return {"windows": windows, "keep": list(held)}
        return {"window": window_of(job.name), "windows": int(split.get("windows", windows)),
                "cuts": list(split.get("cuts", [])), "timeline": True,
                "steps": split.get("steps", []),
                "excluded_steps": split.get("excluded_steps", [])}

    root = XprofWorkspace.create_root(session)
    started = time.perf_counter()
    try:
        outcomes = plan.run_planned(jobs, root, session, budget_bytes=budget,
                                    default_timeout_s=tool_timeout_s, inputs_for=inputs_for,
                                    on_outcome=on_outcome)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for k in held:
        if k not in done:  # never built (the cut failed, or it was skipped)
            exchange.give_up(k)
            o = outcomes.get(job_name(k))
            done[k] = f"given up: {reason_of(o) if o else 'not run'}"
    return {"task": exchange.task, "windows": windows, "held": list(held),
            "done": {str(k): v for k, v in sorted(done.items())},
            "elapsed_ms": round((time.perf_counter() - started) * 1000.0, 1),
            "worker_peak_rss_bytes": max((o.peak_rss_bytes or 0 for o in outcomes.values()),
                                         default=0) or None}
