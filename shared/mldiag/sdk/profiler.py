"""`xprof()`: programmatic capture, as start/stop, a context manager or a decorator.

The trace goes to the run's logdir in the standard layout
(`<run>/plugins/profile/<session_id>/<host>.xplane.pb`). Its upload starts in the background
as soon as the trace is written. All hosts that use the same `session_id` form one
multi-host session; `process_index_list` limits capture to some processes, and the session
then expects only those hosts.

`start()` and `stop()` never wait on the job's other processes, nor on the state store:
each process joins the session in the background (`MLRun.join`), recording the job's
process count, its own index and `process_index_list`, and the pipeline decides from those
when the session is whole (`SessionRecord.complete`). A process that starts after the others
have finished joins the same session.

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
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from mldiag.errors import MldiagError
from mldiag.sdk.current import current_run
from mldiag.sdk.custom_types.exceptions import ProfilingError
from mldiag.sdk.engines import trace_file
from mldiag.sdk.run import MLRun
from mldiag.sdk.workload import session_name

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


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
        self._joined: Future[Any] | None = None
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
        # In the background: the training thread waits on no other process, and on no
        # state store; the trace's upload waits for it instead.
        self._joined = run.join(session, self.process_index_list)
        if run.ring is not None and run.ring.active:
            self._ring_start = time.time()
        else:
            tmp = Path(tempfile.mkdtemp(prefix="mldiag-xprof-"))
            try:
                run.engine.start_trace(tmp)
            except Exception as e:  # noqa: BLE001 - logged and recorded, training goes on
                shutil.rmtree(tmp, ignore_errors=True)
                self._failed(run, session, f"the profiler did not start: {e}")
                self._joined = None
                return
            self._tmp = tmp
        self._active = session

    def _failed(self, run: MLRun, session: str, reason: str) -> None:
        log.error("mldiag: xprof session %s: %s", session, reason)
        # Recorded in the background, after this process joined the session.
        run.fail_host_later(session, reason)

    def stop(self) -> None:
        """Stop capturing; the upload of the trace starts in the background."""
        if self._active is None:
            log.warning("No active profiling session to stop.")
            return
        run, session = self._resolve(), self._active
        joined, self._active, self._joined = self._joined, None, None
        if self._ring_start is not None:
            start, end = self._ring_start, time.time()
            self._ring_start = None
            ring = run.ring
            assert ring is not None
            # The window holding `end` must close first: wait for up to two windows past it.
            window_s = float(ring.status().get("window_s") or 2.0)
            timeout = (end - start) + 2 * window_s + 10.0
            self.upload = run.upload(session, lambda: ring.collect(start, end, timeout),
                                     after=joined)
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

        self.upload = run.upload(session, _read_trace, after=joined)

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


# The public name, as in google_cloud_mldiagnostics.
xprof = Xprof
