"""Worker processes for collection: jobs that can be killed, under a memory budget.

The collection tools are mostly xprof's native converters plus Python post-processing; in one
process they share one GIL, and a converter that runs away cannot be stopped. So each *group*
of jobs runs in its own worker process (a separate interpreter, kept warm between analyses):

- jobs of one group run one at a time in their worker, in order, when their inputs are done
  (a job waiting for memory lets a later one that is ready and fits go first);
- a job past its deadline is killed together with its worker, recorded as ERROR with the
  reason, and a fresh worker takes the group's remaining jobs;
- the workers' resident memory is watched: past the budget, the largest worker is killed and
  its job recorded as ERROR ("exceeded the memory budget"), instead of the kernel's OOM killer
  taking the whole analysis;
- a job whose own estimate exceeds the budget is not started (skipped, with the reason), and
  jobs run side by side only while their estimates fit the budget together;
- workers run with a faster malloc where one is installed (`worker_allocator`): xprof's
  converters make millions of small allocations, and glibc's malloc is a quarter of their time;
- the caller may say when the work has become moot (`stop_when`: a stage whose session
  version was superseded): the jobs stop at the next poll, their workers killed, and
  `JobsStopped` says why.

The parent only schedules; it never runs tool code. Results are plain JSON-like values.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Protocol

from mldiag.errors import MldiagError

DATA, NO_DATA, ERROR = "DATA", "NO_DATA", "ERROR"
# Each job's deadline unless told otherwise (MLDIAG_TOOL_TIMEOUT_S).
DEFAULT_TOOL_TIMEOUT_S = 300.0
_POLL_S = 0.05
# Set by a caller whose work may become moot: returns why to stop, or None (`stop_when`).
_STOP_CHECK: ContextVar[Callable[[], str | None] | None] = ContextVar("mldiag_jobs_stop",
                                                                      default=None)


class JobsStopped(MldiagError):
    """`run_jobs` stopped because its caller's stop check said so (its work became moot).

    Permanent for that work: it is not to be retried.
    """


@contextmanager
def stop_when(check: Callable[[], str | None]) -> Iterator[None]:
    """Within this block (this thread's context), `run_jobs` calls `check()` between polls
    and, when it returns a reason, kills its workers and raises JobsStopped with it. The
    check should be cheap: it runs every poll."""
    token = _STOP_CHECK.set(check)
    try:
        yield
    finally:
        _STOP_CHECK.reset(token)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class Job:
    """One unit of collection work, run by `runner(context, inputs)` in its group's worker."""

    name: str
    group: str
    runner: str  # "module:function", resolved in the worker
    after: tuple[str, ...] = ()
    # Of `after`, the jobs that must have succeeded (DATA or NO_DATA); else this one is
    # skipped with their reason instead of redoing their work or failing slowly.
    requires: tuple[str, ...] = ()
    memory_bytes: int = 0
    timeout_s: float | None = None


@dataclass
class Outcome:
    name: str
    status: str
    value: Any
    elapsed_ms: float
    # Why the job did not run to completion when the worker was killed or it was skipped.
    killed: str | None = None
    skipped: str | None = None
    peak_rss_bytes: int | None = None


class RemoteJobs(Protocol):
    """Jobs of a `run_jobs` list that other processes may run instead (the other tasks of the
    collect job, each converting some time windows of one large host)."""

    names: frozenset[str]

    def take(self, name: str) -> bool:
        """Whether this process is to run `name` now: True only once nobody else is on it
        (the caller then runs it). May answer False again and again while another runs it."""
        ...

    def poll(self) -> Sequence[Outcome]:
        """The outcomes of these jobs that others finished since the last call."""
        ...


@dataclass
class _Worker:
    group: str
    process: _Process
    conn: Connection
    job: Job | None = None
    started: float = 0.0
    peak_rss: int = 0
    queue: list[Job] = field(default_factory=list)


# Allocators preloaded into the workers, best first (Debian/Ubuntu package names:
# libtcmalloc-minimal4, libjemalloc2). On the 103 MB profile, xprof's op_stats build takes
# 10-11 s under tcmalloc against 15 s under glibc, and peaks at 1.4 GB against 2.3 GB
# (BENCHMARKS.md, "Large profiles").
_ALLOCATORS = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libjemalloc.so.2")
_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
             "/usr/lib", "/usr/local/lib", "/lib/x86_64-linux-gnu")


def worker_allocator() -> str | None:
    """The malloc library the worker processes are started with (LD_PRELOAD), or None for
    the C library's own.

    `MLDIAG_WORKER_MALLOC`: `auto` (the default) takes the first of tcmalloc and jemalloc
    that is installed, `off` keeps glibc's, and a path names a library. The library is never
    loaded into this process (switching malloc in a running process frees memory with the
    wrong allocator); a worker that cannot preload it runs with glibc's, as ld.so ignores a
    preload that fails.
    """
    choice = os.environ.get("MLDIAG_WORKER_MALLOC", "auto").strip()
    if choice.lower() in ("off", "glibc", "none", "0", "false"):
        return None
    if choice and choice.lower() != "auto":
        return choice if os.path.isfile(choice) else None
    for d in _LIB_DIRS:
        for name in _ALLOCATORS:
            path = os.path.join(d, name)
            if os.path.isfile(path):
                return path
    return None


class _Process:
    """A worker interpreter, started with `python -c`, talking over a socket pair.

    A fresh interpreter rather than multiprocessing's fork or forkserver: forking a process
    that runs threads (the local runtime's bus workers) can deadlock the child, and the
    forkserver and spawn methods re-run the caller's `__main__` module in every worker.
    """

    def __init__(self, group: str) -> None:
        parent, child = socket.socketpair()
        package_root = str(Path(__file__).resolve().parents[3])  # shared/
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [package_root, *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.allocator = worker_allocator()
        if self.allocator is not None:
            env["LD_PRELOAD"] = " ".join(filter(None, [self.allocator,
                                                       os.environ.get("LD_PRELOAD")]))
            # tcmalloc reports every allocation over 1 GiB on stderr; the outcome says enough.
            env.setdefault("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", str(1 << 62))
        self.popen = subprocess.Popen(
            [sys.executable, "-c", f"from mldiag.analysis.collection.workers import serve; "
                                   f"serve({child.fileno()})"],
            pass_fds=[child.fileno()], env=env, stdin=subprocess.DEVNULL,
            start_new_session=True)
        child.close()
        self.sock = parent
        self.conn = Connection(os.dup(parent.fileno()))
        self.group = group

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def exitcode(self) -> int | None:
        return self.popen.poll()

    def kill(self) -> None:
        if self.alive():
            try:
                os.killpg(self.popen.pid, 9)
            except ProcessLookupError:
                pass
        self.popen.wait(timeout=10)
        self.close()

    def close(self) -> None:
        self.conn.close()
        self.sock.close()


# Idle workers kept for the next collection (imports and xprof's native start-up are paid
# once per worker, not once per analysis). A worker that held much memory is not kept.
_IDLE: list[_Process] = []
_IDLE_LOCK = threading.Lock()
_KEEP_BELOW_RSS = 1024**3
_MAX_IDLE = 4


def _take_worker(group: str) -> _Process:
    allocator = worker_allocator()
    with _IDLE_LOCK:
        while _IDLE:
            w = _IDLE.pop()
            if w.alive() and w.allocator == allocator:
                w.group = group
                return w
            w.kill()
    return _Process(group)


def _give_back(w: _Process) -> None:
    if not w.alive() or rss_bytes(w.pid) > _KEEP_BELOW_RSS:
        w.kill()
        return
    with _IDLE_LOCK:
        if len(_IDLE) < _MAX_IDLE:
            _IDLE.append(w)
            return
    w.kill()


@atexit.register
def _stop_idle() -> None:
    with _IDLE_LOCK:
        idle, _IDLE[:] = list(_IDLE), []
    for w in idle:
        w.kill()


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _resolve(runner: str) -> Callable[[Any, Mapping[str, Any]], Any]:
    import importlib

    module, _, name = runner.partition(":")
    fn: Callable[[Any, Mapping[str, Any]], Any] = getattr(importlib.import_module(module), name)
    return fn


def serve(fd: int) -> None:
    """A worker's loop. Messages: ("setup", runner, args, group) builds the context of one
    collection; ("job", job, inputs) runs a job and answers (name, status, value, elapsed_ms);
    None or a closed socket ends the worker."""
    import logging

    from mldiag.analysis.collection.xprof_tools import NoData

    # xprof logs every fallback it takes as a warning; the outcome carries what matters.
    logging.getLogger().setLevel(logging.DEBUG if os.environ.get("MLDIAG_DEBUG")
                                 else logging.ERROR)
    conn = Connection(fd)
    context: Any = None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        if msg[0] == "setup":
            _, setup, setup_args, group = msg
            context = _resolve(setup)(setup_args, {"group": group})
            continue
        _, job, inputs = msg
        start = time.perf_counter()
        try:
            value, status = _resolve(job.runner)(context, inputs), DATA
        except NoData as e:
            value, status = {"reason": str(e)}, NO_DATA
        except Exception as e:  # noqa: BLE001 - one job's failure must not sink the others
            value, status = f"{type(e).__name__}: {e}".splitlines()[0][:500], ERROR
            if os.environ.get("MLDIAG_DEBUG"):
                traceback.print_exc()
        elapsed = round((time.perf_counter() - start) * 1000, 1)
        _release_free_memory()
        conn.send((job.name, status, value, elapsed))


def _release_free_memory() -> None:
    """Hand the memory a finished job freed back to the system.

    tcmalloc keeps freed pages for reuse, and glibc keeps its heap's, so a worker's resident
    size would stay at its last job's peak: beside the op_stats build in the other worker,
    that is memory counted twice (the budget is planned on resident sizes) and, on the 103 MB
    profile, 0.5 GB over the tree's peak."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return
    release = getattr(libc, "MallocExtension_ReleaseFreeMemory", None)  # tcmalloc
    if release is not None:
        release()
        return
    trim = getattr(libc, "malloc_trim", None)  # glibc (jemalloc returns memory by itself)
    if trim is not None:
        trim(0)


def run_jobs(
    jobs: Sequence[Job],
    *,
    setup: str,
    setup_args: Any,
    budget_bytes: int,
    default_timeout_s: float,
    inputs_for: Callable[[Job, Mapping[str, Outcome]], Mapping[str, Any]] | None = None,
    on_outcome: Callable[[Outcome], None] | None = None,
    done: Mapping[str, Outcome] | None = None,
    remote: RemoteJobs | None = None,
) -> dict[str, Outcome]:
    """Run `jobs` in one worker process per group and return every job's outcome.

    `done` holds outcomes obtained elsewhere (a fanned-out session's per-host jobs): jobs may
    wait on them and receive them as inputs; they are returned with the rest.
    `remote` names jobs that other processes may run: such a job starts here only when
    `remote.take` says so, and its outcome may arrive from `remote.poll` instead; the jobs
    after it wait for it either way.

    `setup(setup_args, {"group": group})` builds each worker's context once, in the worker.
    A job starts when the jobs it is `after` are done (whatever their status) and its memory
    estimate fits the budget beside the running ones; `inputs_for(job, outcomes)` gives its
    inputs.
    Always returns, with every job accounted for: done, failed, timed out, killed or skipped;
    unless the caller's stop check (`stop_when`) stops it, which raises JobsStopped.
    """
    outcomes: dict[str, Outcome] = dict(done or {})
    shared = remote.names if remote is not None else frozenset()
    stop_check = _STOP_CHECK.get()

    def mine(job: Job) -> bool:
        return job.name not in shared or (remote is not None and remote.take(job.name))

    by_group: dict[str, list[Job]] = {}
    for job in jobs:
        by_group.setdefault(job.group, []).append(job)
    workers: dict[str, _Worker] = {}

    def record(o: Outcome) -> None:
        outcomes[o.name] = o
        if on_outcome is not None:
            on_outcome(o)

    for job in jobs:
        if job.memory_bytes > budget_bytes:
            record(Outcome(job.name, ERROR, None, 0.0, skipped=(
                f"skipped: needs about {_gib(job.memory_bytes)} of memory, over the budget "
                f"of {_gib(budget_bytes)} (MLDIAG_MEMORY_BUDGET)")))

    def spawn(group: str, queue: list[Job]) -> _Worker:
        proc = _take_worker(group)
        proc.conn.send(("setup", setup, setup_args, group))
        return _Worker(group=group, process=proc, conn=proc.conn, queue=queue)

    def stop(w: _Worker) -> None:
        w.process.kill()

    def finish_killed(w: _Worker, reason: str) -> None:
        assert w.job is not None
        elapsed = round((time.monotonic() - w.started) * 1000, 1)
        record(Outcome(w.job.name, ERROR, None, elapsed, killed=reason,
                       peak_rss_bytes=w.peak_rss or None))
        stop(w)
        rest = w.queue
        del workers[w.group]
        if rest:
            workers[w.group] = spawn(w.group, rest)

    for group, queue in by_group.items():
        pending = [j for j in queue if j.name not in outcomes]
        if pending:
            workers[group] = spawn(group, pending)
    try:
        while workers:
            why = stop_check() if stop_check is not None else None
            if why:
                raise JobsStopped(why)
            if remote is not None:
                for o in remote.poll():
                    if o.name not in outcomes:
                        record(o)
            # Memory in use or promised: every worker's resident memory (a worker keeps what
            # its converters allocated), plus what running jobs are expected to add to it.
            rss = {g: rss_bytes(w.process.pid) for g, w in workers.items()}
            committed = sum(rss.values()) + sum(
                max(0, w.job.memory_bytes - rss[g]) for g, w in workers.items()
                if w.job is not None)
            busy_any = any(w.job is not None for w in workers.values())
            for w in list(workers.values()):
                if w.job is not None:
                    continue
                w.queue = [j for j in w.queue if j.name not in outcomes]
                if not w.queue:
                    _give_back(w.process)
                    del workers[w.group]
                    continue
                job = w.queue[0]
                if any(dep not in outcomes for dep in (*job.after, *job.requires)):
                    continue
                failed = [d for d in job.requires if outcomes[d].status == ERROR]
                if failed:
                    w.queue.pop(0)
                    record(Outcome(job.name, ERROR, None, 0.0, skipped=(
                        f"skipped: needs {failed[0]}, which failed "
                        f"({reason_of(outcomes[failed[0]])})")))
                    continue
                need = max(0, job.memory_bytes - rss.get(w.group, 0))
                if busy_any and committed + need > budget_bytes or not mine(job):
                    # It waits until the running jobs have released their memory (or another
                    # process has run it); a later job of this worker that is ready and fits
                    # goes first meanwhile.
                    later = next((j for j in w.queue[1:] if _ready(j, outcomes)
                                  and committed + max(0, j.memory_bytes - rss.get(w.group, 0))
                                  <= budget_bytes and mine(j)), None)
                    if later is None:
                        continue
                    job, need = later, max(0, later.memory_bytes - rss.get(w.group, 0))
                w.queue.remove(job)
                inputs = inputs_for(job, outcomes) if inputs_for is not None else {}
                w.conn.send(("job", job, inputs))
                w.job, w.started, w.peak_rss = job, time.monotonic(), 0
                committed += need
                busy_any = True
            busy = [w for w in workers.values() if w.job is not None]
            if not busy:
                if any(n not in outcomes for n in shared):
                    time.sleep(_POLL_S)  # waiting on what another process runs
                elif workers and all(w.job is None for w in workers.values()):
                    _unblock(workers, outcomes, record)
                continue
            ready = wait([w.conn for w in busy], timeout=_POLL_S)
            for w in busy:
                if w.conn in ready:
                    try:
                        name, status, value, elapsed = w.conn.recv()
                    except (EOFError, OSError):
                        continue  # the worker died: handled below, by its exit code
                    if name not in outcomes:  # else another process's came first
                        record(Outcome(name, status, value, elapsed,
                                       peak_rss_bytes=w.peak_rss or None))
                    w.job = None
            for w in busy:
                if w.job is None:
                    continue
                if not w.process.alive():
                    code = w.process.exitcode()
                    finish_killed(w, f"the worker process died ({_exit_reason(code)})")
                    continue
                limit = w.job.timeout_s if w.job.timeout_s is not None else default_timeout_s
                if time.monotonic() - w.started > limit:
                    finish_killed(w, f"timed out after {limit:g} s (worker killed)")
            _watch_memory(workers, budget_bytes, finish_killed)
    finally:
        for w in list(workers.values()):
            stop(w)
    return outcomes


def reason_of(o: Outcome) -> str:
    """Why an outcome is not DATA: its skip or kill reason, else the job's own message."""
    return o.skipped or o.killed or str(o.value)


def _unblock(workers: Mapping[str, _Worker], outcomes: Mapping[str, Outcome],
             record: Callable[[Outcome], None]) -> None:
    # Every worker idle and none can start: the next jobs wait on inputs that no worker
    # will produce (a dependency outside the job list). Fail them rather than wait forever.
    for w in workers.values():
        if w.queue:
            job = w.queue[0]
            missing = [d for d in job.after if d not in outcomes]
            if missing:
                record(Outcome(job.name, ERROR, None, 0.0,
                               skipped=f"skipped: its input {missing[0]} never ran"))


def _ready(job: Job, outcomes: Mapping[str, Outcome]) -> bool:
    """Every job it waits for is done, and those it requires succeeded."""
    return all(d in outcomes for d in (*job.after, *job.requires)) and not any(
        outcomes[d].status == ERROR for d in job.requires)


def _watch_memory(workers: Mapping[str, _Worker], budget: int,
                  kill: Callable[[_Worker, str], None]) -> None:
    busy = [w for w in workers.values() if w.job is not None]
    total = 0
    for w in busy:
        rss = rss_bytes(w.process.pid)
        w.peak_rss = max(w.peak_rss, rss)
        total += rss
    if total > budget and busy:
        worst = max(busy, key=lambda w: w.peak_rss)
        kill(worst, f"exceeded the memory budget: the workers held {_gib(total)}, budget "
                    f"{_gib(budget)} (MLDIAG_MEMORY_BUDGET); worker killed")


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        import signal

        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else ""
        hint = ": out of memory?" if -code == signal.SIGKILL else ""
        return f"signal {-code} {name}{hint}".strip()
    return f"exit code {code}"


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"


def default_budget_bytes() -> int:
    """What this process may use: the cgroup's memory limit, else the host's memory.

    `MLDIAG_MEMORY_BUDGET` (bytes, or with a K/M/G/T suffix, e.g. "6G") overrides it.
    """
    raw = os.environ.get("MLDIAG_MEMORY_BUDGET", "").strip()
    if raw:
        from mldiag.errors import MldiagError

        try:
            return parse_bytes(raw)
        except ValueError as e:
            raise MldiagError(f"MLDIAG_MEMORY_BUDGET: {e}") from e
    limits = []
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
            if text.isdigit() and int(text) < 1 << 60:
                limits.append(int(text))
        except OSError:
            continue
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        pass
    allowed = min(limits) if limits else 8 * 1024**3
    # Leave room for the parent process and the kernel's page cache of the profile itself.
    return int(allowed * 0.85)


def parse_bytes(text: str) -> int:
    """'6G', '512MiB', '2.5GB' or '1000000' as bytes. Raises ValueError."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = 1
    for suffix, mult in (("K", 1024), ("M", 1024**2), ("G", 1024**3), ("T", 1024**4)):
        if t.endswith(suffix):
            t, scale = t[:-1], mult
            break
    try:
        value = float(t)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (use bytes or a K/M/G/T suffix)") from None
    if value <= 0:
        raise ValueError(f"not a size: {text!r} (must be positive)")
    return int(value * scale)
