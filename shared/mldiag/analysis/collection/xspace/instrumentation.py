"""Instrumentation among a host's Python frames: the profiler's, mldiag's SDK's and JAX's
traceback filter's, told apart from the workload's, so that none of them is ever named as the
host work to remove.

The Python tracer names each frame `$<file basename>:<first line> <function>` on the line of
its thread, and records only frames entered while it runs. So:

- a frame of the SDK (any function of `mldiag/sdk`, or of the storage and state adapters its
  uploads and metrics write through) or of the profiler (JAX's and xprof's profiler modules)
  is instrumentation, and so is everything it calls (its nested frames on the same line): the
  `shutil.rmtree` of an upload's clean-up, the `__float__` of a JAX array that an older SDK's
  `metrics.record` converted on the training thread;
- a thread of the SDK is instrumentation throughout: its line is named `mldiag-...` (the SDK
  names its threads so), or has at its root a frame of the SDK that a workload never calls on
  its own thread (not the SDK's API). A trace that starts while an upload of the previous
  session runs records that upload's frames from the middle of its work, as roots of the line
  (`storage.py write_bytes`), without the SDK frame that called them;
- a wrapper (JAX's `traceback_util.py reraise_with_filtered_traceback` around every jitted
  call, the profiler's `annotate_function` wrapper, the SDK's `@xprof()` decorator) is
  instrumentation, but what it calls is the workload's: its time is its callee's.

A frame is the SDK's by its file's basename and its function's name; for names that any
module may define (`start`, `run`, `__init__`, ...) the first line must match too, so a
workload's own `run.py run` is not taken for the SDK's.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mldiag.analysis.collection.xspace.scan import Line

# The SDK names its threads `mldiag-<what>` (and its thread pools' threads
# `mldiag-<what>_<n>`).
SDK_THREAD_PREFIX = "mldiag-"
PROFILER, SDK, JAX_TRACEBACK = "profiler", "sdk", "jax_traceback"

_FRAME = re.compile(r"^\$(?P<file>[^:\s]+):(?P<line>\d+) (?P<func>\S+)$")
# The profiler's frames by file: JAX's `jax/_src/profiler.py` (and the SDK's own
# `profiler.py`), xprof's and TSL's profiler modules.
_PROFILER_FILE = re.compile(r"^(profiler\.py|.*_profiler.*\.py|.*xprof.*\.py|"
                            r"trace_annotation\.py)$")
_PROFILER_NAME = re.compile(r"TraceAnnotation|trace_annotation|xprof")
# The Python tracer's own hook, installed in each thread it records (a thread started while it
# runs calls it first).
_HOOKS = re.compile(r"^\$(sys|threading(\.py:\d+)?) (setprofile|settrace)(_all_threads)?$")
# Frames that wrap a call of the workload: their time is the callee's.
_WRAPPERS = {("traceback_util.py", "reraise_with_filtered_traceback"),
             ("profiler.py", "wrapper")}
# The SDK's API: what a workload calls on its own threads (a root frame of the SDK with
# another name marks a thread of the SDK).
SDK_API = frozenset({
    # metrics
    "record", "record_metrics", "history", "clear", "flush_to", "start_system_metrics",
    # profiling
    "xprof", "start", "stop", "__enter__", "__exit__", "__call__", "wrapper", "__init__",
    "start_on_demand_xprof", "stop_on_demand_xprof",
    # the run
    "machinelearning_run", "close", "current_run", "wait_uploads", "start_continuous",
    "stop_continuous", "observe_step_time",
    # the Tunix trainer's callbacks
    "on_train_start", "on_train_end", "on_train_step_start", "on_train_step_end",
    "on_eval_step_start", "on_eval_step_end",
})
# Names that any module may define: an SDK frame of these names needs its first line too.
_COMMON_NAMES = frozenset({
    "start", "stop", "close", "run", "main", "update", "clear", "pop", "list", "get", "read",
    "write", "load", "save", "wait", "status", "collect", "release", "claim", "forward",
    "poll", "add", "fetch", "scan", "emit", "stat", "snapshot", "summary", "change",
    "complete", "extend", "renew", "detect", "hostname", "version", "platform", "select",
    "client", "connection", "uri", "active", "live", "ratio", "observe", "windows",
    "recording", "recorder", "levels", "candidates", "setdefault", "popitem", "one", "work",
    "loop", "wrapper", "merge",
})
# The SDK's modules besides mldiag/sdk: the adapters its uploads and metrics write through.
_ADAPTERS = ("adapters/local/storage.py", "adapters/gcp/storage.py",
             "adapters/local/state.py", "adapters/gcp/state.py")


@functools.cache
def sdk_frames() -> dict[tuple[str, str], frozenset[int]]:
    """(file basename, function name) → the first lines of the SDK's functions of that name
    in that file, read from the SDK's source (its `__init__.py` files left out: every
    package has one)."""
    root = Path(__file__).resolve().parents[3]
    files = [p for p in (root / "sdk").rglob("*.py") if p.name != "__init__.py"]
    files += [root / a for a in _ADAPTERS if (root / a).is_file()]
    found: dict[tuple[str, str], set[int]] = defaultdict(set)
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                # A code object's first line is its first decorator's.
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                found[(path.name, node.name)].add(first)
    return {k: frozenset(v) for k, v in found.items()}


@functools.lru_cache(maxsize=65536)
def classify(event: str) -> tuple[str, bool, bool] | None:
    """(kind, wraps the workload, marks a thread of the SDK) of a Python-tracer frame, or
    None for the workload's."""
    if _HOOKS.match(event):
        return PROFILER, False, False
    m = _FRAME.match(event)
    if m is None:
        return None
    file, line, func = m["file"], int(m["line"]), m["func"]
    if file == "traceback_util.py":
        return JAX_TRACEBACK, True, False
    firsts = sdk_frames().get((file, func))
    wraps = (file, func) in _WRAPPERS
    if firsts is not None and (func not in _COMMON_NAMES and not (
            func.startswith("__") and func.endswith("__")) or line in firsts):
        return SDK, wraps, func not in SDK_API
    if _PROFILER_FILE.match(file) or _PROFILER_NAME.search(func):
        return PROFILER, wraps, False
    return None


def _outermost(s: NDArray[np.int64], e: NDArray[np.int64]) -> NDArray[np.bool_]:
    """Of intervals sorted by start (a longer one first on a tie), those inside no earlier
    one."""
    if not len(s):
        return np.zeros(0, dtype=bool)
    reach = np.maximum.accumulate(e)
    out = np.ones(len(s), dtype=bool)
    out[1:] = s[1:] >= reach[:-1]
    return out


class HostInstrumentation:
    """The instrumentation among the Python frames of a host's lines, line by line (`add`, as
    `event_aggregates.aggregate_scans` hands them over), and its summary (`result`)."""

    def __init__(self) -> None:
        self.by_event: dict[str, int] = defaultdict(int)
        self.frames: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self.wrappers: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self.threads: list[dict[str, Any]] = []
        self.total_ps = 0
        self.python_ps = 0

    def add(self, line: Line, start: NDArray[np.int64], dur: NDArray[np.int64],
            idx: NDArray[np.int64], names: list[str]) -> None:
        if not len(start):
            return
        order = np.lexsort((-dur, start))
        s, d, ix = start[order], dur[order], idx[order]
        e = s + d
        kinds = [classify(n) for n in names]
        owner = np.array([k is not None and not k[1] for k in kinds], dtype=bool)[ix]
        wrapper = np.array([k is not None and k[1] for k in kinds], dtype=bool)[ix]
        marker = np.array([k is not None and k[2] for k in kinds], dtype=bool)[ix]
        root = _outermost(s, e)
        self.python_ps += int(d[root].sum())
        why = None
        if line.name.startswith(SDK_THREAD_PREFIX):
            why = f"the SDK's thread {line.name}"
        elif (root & marker).any():
            first = int(ix[np.flatnonzero(root & marker)[0]])
            why = f"the SDK's frame {names[first].lstrip('$')} at the root of the thread"
        if why is not None:
            inside = np.ones(len(s), dtype=bool)
            outer = root
            measured = d
            self.threads.append({"line": line.name or f"thread {line.id}", "why": why,
                                 "busy_ms": round(float(d[root].sum()) / 1e9, 3)})
        else:
            o = np.flatnonzero(owner)
            outer_o = _outermost(s[o], e[o])
            seg_s, seg_e = s[o][outer_o], e[o][outer_o]
            k = np.searchsorted(seg_s, s, side="right") - 1
            inside = (k >= 0) & (e <= seg_e[np.maximum(k, 0)]) if len(seg_s) else np.zeros(
                len(s), dtype=bool)
            outer = np.zeros(len(s), dtype=bool)
            outer[o[outer_o]] = True
            # A frame's instrumentation: all of it inside an instrumentation frame, else the
            # instrumentation frames it calls (frames nest, so those starting inside it).
            cum = np.concatenate([[0], np.cumsum(seg_e - seg_s)])
            within = cum[np.searchsorted(seg_s, e, side="left")] - cum[
                np.searchsorted(seg_s, s, side="left")]
            measured = np.where(inside, d, np.minimum(within, d))
        self.total_ps += int(d[outer].sum())
        # Summed per event name, column-wise (a line holds millions of frames).
        n = len(names)
        timed = np.bincount(ix, weights=measured, minlength=n)
        for i in np.flatnonzero(timed > 0).tolist():
            self.by_event[names[i]] += int(timed[i])
        for table, sel in ((self.frames, outer), (self.wrappers, wrapper & ~inside)):
            count = np.bincount(ix[sel], minlength=n)
            total = np.bincount(ix[sel], weights=d[sel], minlength=n)
            for i in np.flatnonzero(count).tolist():
                row = table[names[i]]
                row[0] += int(count[i])
                row[1] += int(total[i])

    def result(self, events: Iterable[str], top: int = 20) -> dict[str, Any]:
        """The summary: instrumentation's time, its threads, its outermost frames and the
        wrappers (at most `top` of each, longest first), and the instrumentation time inside
        each event of `events` (the rows of the host-work follow-up)."""
        def rows(table: dict[str, list[int]]) -> list[dict[str, Any]]:
            out = []
            for name, (count, total) in sorted(table.items(), key=lambda kv: -kv[1][1])[:top]:
                kind = classify(name)
                out.append({"event": name, "kind": kind[0] if kind else "sdk thread",
                            "count": count, "total_duration_ps": total})
            return out

        wanted = set(events)
        return {
            "method": ("mldiag: Python-tracer frames of the profiler, of mldiag's SDK (and "
                       "everything they call), of the SDK's threads, and JAX's traceback "
                       "wrappers, told apart from the workload's "
                       "(collection.xspace.instrumentation)"),
            "instrumentation_ms": round(self.total_ps / 1e9, 3),
            "python_ms": round(self.python_ps / 1e9, 3),
            "threads": self.threads[:top],
            "frames": rows(self.frames),
            # Instrumentation, but what they wrap is the workload's: their time is its.
            "wrappers": rows(self.wrappers),
            # Of each host-work row (aggregate_xplane_events' event), the time that is
            # instrumentation (ps): its calls inside an instrumentation frame or thread, and
            # the instrumentation frames its other calls made. Most first (a list: a digest
            # that cuts lists keeps the largest).
            "by_event": [{"event": n, "instrumentation_ps": t} for n, t in sorted(
                self.by_event.items(), key=lambda kv: (-kv[1], kv[0])) if n in wanted],
        }
