"""`xprof()`: programmatic capture, as start/stop, a context manager or a decorator.

The trace goes to the run's logdir in the standard layout
(`<run>/plugins/profile/<session_id>/<host>.xplane.pb`). Its upload starts in the background
as soon as the trace is written. All hosts that use the same `session_id` form one
multi-host session; `process_index_list` limits capture to some processes, and the session
then expects only those hosts.

While continuous profiling runs, the profiler is busy with the ring, so a programmatic
capture is cut from the ring's windows instead of being refused.

As in `google_cloud_mldiagnostics`, profiling never stops the training loop: `start()` while
capturing and `stop()` while not only warn, and a profiler that cannot start or stop (another
trace is active, say) is logged and recorded on the session, which is FAILED with the reason
once no host of it can arrive. Only a missing run raises (`ProfilingError`).
"""

from __future__ import annotations

import functools
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from mldiag.errors import MldiagError
from mldiag.model import CAPTURING, SessionRecord, TargetRecord
from mldiag.sdk.current import current_run
from mldiag.sdk.custom_types.exceptions import ProfilingError
from mldiag.sdk.engines import trace_file
from mldiag.sdk.run import MLRun
from mldiag.sdk.workload import session_name

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])
# How long the first process of a multi-process job waits, when it starts a programmatic
# session, for the job's other processes to register (once, at start-up; later sessions
# find them registered).
REGISTRATION_WAIT_S = 30.0
REGISTRATION_POLL_S = 0.1


def default_session_id() -> str:
    """A session id like jax.profiler's (the UTC start time), to the millisecond, so that two
    captures in one second (a decorated function called twice) stay two sessions."""
    now = time.time()
    return time.strftime("%Y_%m_%d_%H_%M_%S", time.gmtime(now)) + f"_{int(now * 1000) % 1000:03d}"


def _discard(tmp: Path) -> None:
    """Remove a trace's scratch directory on the upload thread. A frame of its own: a
    profile that starts while the upload of the one before runs records it (the frames that
    called it began before), and the analysis knows it as the SDK's, not the workload's
    (`collection.xspace.instrumentation`)."""
    shutil.rmtree(tmp, ignore_errors=True)


class Xprof:
    """Capture a profile of this process into the run's logdir.

    Mirrors `google_cloud_mldiagnostics.xprof`: `xprof(run=None, process_index_list=None)`;
    mldiag also takes `session_id` here. A session id is stored with the characters a profile
    path cannot hold replaced by "-".

    Example::

        prof = xprof()
        prof.start(session_id="profiling_session")
        ...
        prof.stop()

        with xprof(process_index_list=[0]):
            train_step()
    """

    def __init__(self, run: MLRun | None = None, process_index_list: list[int] | None = None,
                 session_id: str | None = None) -> None:
        self._run = run
        self.process_index_list = process_index_list
        self.session_id = session_id
        self._tmp: Path | None = None
        self._ring_start: float | None = None
        self._active: str | None = None
        self.upload: Any = None

    def _resolve(self) -> MLRun:
        run = self._run or current_run()
        if run is None:
            raise ProfilingError(
                "No active ML run found for profiling. Please initialize an ML run with "
                "machinelearning_run(...) before xprof().")
        return run

    def _selected(self, run: MLRun) -> bool:
        return not run.metric_only_run and (self.process_index_list is None or (
            run.target.process_index in self.process_index_list))

    def start(self, session_id: str | None = None) -> None:
        """Start capturing; `session_id` names the session (default: the start time)."""
        run = self._resolve()
        if self._active is not None:
            log.warning("Profiling is already active (session %s). Call stop() first.",
                        self._active)
            return
        if not self._selected(run):
            log.info("xprof: process %d not in %s, not profiling", run.target.process_index,
                     self.process_index_list)
            return
        try:
            session = session_name(session_id or self.session_id or default_session_id())
        except ValueError as e:
            log.warning("mldiag: %s; using the start time instead", e)
            session = default_session_id()
        try:
            self._expect_hosts(run, session)
        except Exception as e:  # noqa: BLE001 - the capture goes on; its upload registers it
            log.warning("mldiag: could not register session %s: %s", session, e)
        if run.ring is not None and run.ring.active:
            self._ring_start = time.time()
        else:
            tmp = Path(tempfile.mkdtemp(prefix="mldiag-xprof-"))
            try:
                run.engine.start_trace(tmp)
            except Exception as e:  # noqa: BLE001 - logged and recorded, training goes on
                shutil.rmtree(tmp, ignore_errors=True)
                self._failed(run, session, f"the profiler did not start: {e}")
                return
            self._tmp = tmp
        self._active = session

    def _failed(self, run: MLRun, session: str, reason: str) -> None:
        log.error("mldiag: xprof session %s: %s", session, reason)
        try:
            run.fail_host(session, reason)
        except Exception as e:  # noqa: BLE001 - the state store is down: the log says it all
            log.error("mldiag: could not record the failure of session %s: %s", session, e)

    def _expect_hosts(self, run: MLRun, session: str) -> None:
        """Create the session (first host wins) expecting every process that captures."""
        import jax

        now = time.time()
        hosts, missing = expected_hosts(run, jax.process_count(), self.process_index_list)
        note = ""
        if missing:
            note = (f"process{'es' if len(missing) > 1 else ''} "
                    f"{', '.join(map(str, missing))} of the job had not registered when the "
                    "capture started: the session does not wait for "
                    f"{'them' if len(missing) > 1 else 'it'}")
            log.warning("mldiag: session %s: %s", session, note)
        run.plane.state.create_session(SessionRecord(
            run=run.name, session=session, state=CAPTURING, kind="programmatic",
            trigger="manual", expected_hosts=hosts, created_at=now, updated_at=now,
            note=note))

    def stop(self) -> None:
        """Stop capturing; the upload of the trace starts in the background."""
        if self._active is None:
            log.warning("No active profiling session to stop.")
            return
        run, session = self._resolve(), self._active
        self._active = None
        if self._ring_start is not None:
            start, end = self._ring_start, time.time()
            self._ring_start = None
            ring = run.ring
            assert ring is not None
            # The window holding `end` must close first: wait for up to two windows past it.
            window_s = float(ring.status().get("window_s") or 2.0)
            timeout = (end - start) + 2 * window_s + 10.0
            self.upload = run.upload(session, lambda: ring.collect(start, end, timeout))
            return
        tmp = self._tmp
        assert tmp is not None
        self._tmp = None
        try:
            run.engine.stop_trace()
        except Exception as e:  # noqa: BLE001 - logged and recorded, training goes on
            shutil.rmtree(tmp, ignore_errors=True)
            self._failed(run, session, f"the profiler did not stop: {e}")
            return

        def _read_trace() -> bytes:
            try:
                found = trace_file(tmp)
                if found is None:
                    raise MldiagError(
                        f"session {session}: the {run.engine.name} profiler wrote no .xplane.pb")
                return found.read_bytes()
            finally:
                _discard(tmp)

        self.upload = run.upload(session, _read_trace)

    def __enter__(self) -> Xprof:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __call__(self, func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with Xprof(self._run, self.process_index_list, self.session_id):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


def expected_hosts(run: MLRun, process_count: int, process_index_list: list[int] | None,
                   wait_s: float | None = None) -> tuple[list[str], list[int]]:
    """The host names a programmatic session of `run` waits for, and the process indices of
    the job that could not be named.

    In a multi-process job (`process_count > 1`) the job says who captures: the processes of
    `process_index_list`, or all of them. Each is named by the run's live target of that
    process index, waiting up to `wait_s` (REGISTRATION_WAIT_S) for processes that have not
    registered yet (the job's processes start together, but one may still be importing).
    Otherwise (one process, or independent processes of one run) the run's live targets
    are the job.
    """
    stale = run.plane.settings.target_stale_s
    wait_s = REGISTRATION_WAIT_S if wait_s is None else wait_s

    def live() -> list[TargetRecord]:
        now = time.time()
        return [t for t in run.plane.state.list_targets(run.name)
                if now - t.last_heartbeat <= stale or t.host == run.host]

    if process_count <= 1:
        return sorted({t.host for t in live() if process_index_list is None
                       or t.process_index in process_index_list}), []
    wanted = sorted({i for i in (range(process_count) if process_index_list is None
                                 else process_index_list) if 0 <= i < process_count})
    deadline = time.monotonic() + wait_s
    while True:
        newest: dict[int, TargetRecord] = {}
        for t in live():
            if t.process_index in wanted and (
                    t.process_index not in newest
                    or t.registered_at > newest[t.process_index].registered_at):
                newest[t.process_index] = t
        missing = [i for i in wanted if i not in newest]
        if not missing or time.monotonic() >= deadline:
            return sorted({t.host for t in newest.values()}), missing
        time.sleep(REGISTRATION_POLL_S)


# The public name, as in google_cloud_mldiagnostics.
xprof = Xprof
