"""The SDK's side of pull delivery: this process takes its own capture requests.

A daemon thread looks for this target's requests every `MLDIAG_PULL_POLL_S` (locally in the
state store; on Google Cloud through the registration function, the same path as the
heartbeat) and runs each in this process, off the training thread:

- `on_demand`: a trace of `duration_s` from the request's start time, cut from the ring while
  continuous profiling runs (refused when the ring records fewer tracer levels than asked);
  a profiler held by someone else is waited for until the request's `start_at + wait_s`,
  except xprof's native continuous profiling, whose buffer is read after the interval;
- `snapshot`: the newest `duration_s` of the ring, or xprof's native buffer when the workload
  runs its own continuous profiling;
- `continuous_start|stop`: the ring, with the requested options.

A capture is uploaded like a programmatic one (`<run>/plugins/profile/<session>/<host>.xplane.pb`)
and a failure is recorded on its host with the reason; continuous requests answer on the
target record (`continuous`, `last_request`, `last_error`). Nothing here raises into the
training loop, and nothing listens on a socket.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mldiag.capture.pull import take_requests
from mldiag.capture.remote import NativeOff, ProfilerUnreachable, native_snapshot
from mldiag.errors import MldiagError
from mldiag.model import ControlRequest
from mldiag.sdk.continuous import LEVELS, ContinuousError, missing_levels, recorder

if TYPE_CHECKING:
    # For the annotations only: `run` imports this module to start a run's Puller, so
    # importing it back at run time would be a circle.
    from mldiag.sdk.run import MLRun

log = logging.getLogger(__name__)

# How often a busy profiler is tried again while a pulled capture waits for it.
BUSY_RETRY_S = 0.2
# A poll that keeps failing (the state store or the register function is down) is logged at
# most this often.
WARN_EVERY_S = 60.0
# How long stop() waits for a poll in flight to end.
STOP_WAIT_S = 10.0


class Puller:
    """Takes and runs the requests of one run's target in this process."""

    def __init__(self, run: MLRun, poll_s: float) -> None:
        self.run = run
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Captures may wait (for their start time, a busy profiler, the ring): two at once.
        self._captures = ThreadPoolExecutor(2, thread_name_prefix="mldiag-pull-capture")
        # Continuous start/stop in the order they were asked for.
        self._continuous = ThreadPoolExecutor(1, thread_name_prefix="mldiag-pull-continuous")
        # This process's own traces take turns: the profiler holds one session at a time.
        self._trace_lock = threading.Lock()
        self.served = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="mldiag-pull", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop taking requests and finish those taken (their uploads are the run's)."""
        self._stop.set()
        if self._thread is not None:
            # Bounded: a poll stuck in the control plane must not keep the workload alive.
            self._thread.join(timeout=STOP_WAIT_S)
            if self._thread.is_alive():
                log.warning("mldiag: the request poll did not stop in %.0f s; exiting without "
                            "it", STOP_WAIT_S)
        self._captures.shutdown(wait=True)
        self._continuous.shutdown(wait=True)

    def _loop(self) -> None:
        warned = 0.0
        while not self._stop.wait(self.poll_s):
            try:
                requests = take_requests(self.run.plane.state, self.run.name, self.run.host,
                                         time.time())
            except Exception as e:  # noqa: BLE001 - polled again next time; training goes on
                if time.monotonic() - warned >= WARN_EVERY_S:  # not once per poll
                    warned = time.monotonic()
                    log.warning("mldiag: could not look for capture requests: %s", e)
                continue
            for request in requests:
                self.served += 1
                log.info("mldiag: %s request %s (session %s)", request.action, request.id,
                         request.session or "-")
                pool = self._continuous if request.action.startswith("continuous_") \
                    else self._captures
                pool.submit(self._serve, request)

    def _serve(self, request: ControlRequest) -> None:
        try:
            if request.action == "on_demand":
                self._on_demand(request)
            elif request.action == "snapshot":
                self._snapshot(request)
            else:
                self._set_continuous(request)
        except Exception as e:  # noqa: BLE001 - reported on the session or target
            reason = str(e) if isinstance(e, ContinuousError | ValueError | MldiagError) \
                else f"{type(e).__name__}: {e}"
            log.error("mldiag: %s request %s failed: %s", request.action, request.id, reason)
            self._report_failure(request, reason)

    def _report_failure(self, request: ControlRequest, reason: str) -> None:
        try:
            if request.session:
                self.run.fail_host(request.session, reason)
            else:
                self.run.plane.state.update_target(
                    self.run.name, self.run.host, self.run.target.port,
                    last_error=f"{request.action.replace('_', ' ')}: {reason}",
                    last_request=request.id)
        except Exception as e:  # noqa: BLE001 - the log above holds the reason
            log.error("mldiag: could not record the failure of request %s: %s", request.id, e)

    # Captures

    def _native(self) -> bool:
        """Whether xprof's native continuous profiling holds this process's profiler: adopted
        by `continuous start`, or named by the ring that waits for it. (Not probed here: on
        a free profiler the probe would start a session.)"""
        ring = self.run.ring
        return self.run.target.continuous == "NATIVE" or (
            ring is not None and ring.active and ring.held_by is not None
            and "native" in ring.held_by)

    def _native_snapshot(self) -> bytes:
        address = self.run.profiler_address
        if address is None:
            raise NativeOff(f"{self.run.host} runs no profiler server, so no native "
                            "continuous profiling either")
        # xprof's own buffer, whole: its length is the workload's choice.
        return native_snapshot(address, self.run.plane.settings.max_host_bytes)

    def _snapshot(self, request: ControlRequest) -> None:
        ring = self.run.ring
        if self._native():
            self.run.upload(request.session, self._native_snapshot())
            return
        if ring is None or not ring.active:
            try:
                # The workload may run xprof's native continuous profiling itself.
                data = self._native_snapshot()
            except (NativeOff, ProfilerUnreachable):
                raise ContinuousError(
                    f"continuous profiling is off on {self.run.host}, so there is no snapshot "
                    f"to take (start it with `mldiag continuous start --run {self.run.name}`)"
                ) from None
            self.run.upload(request.session, data)
            return
        capture = ring.snapshot_capture(request.duration_s)
        self.run.upload(request.session, capture.data)

    def _on_demand(self, request: ControlRequest) -> None:
        duration = float(request.duration_s or 0.0)
        ring = self.run.ring
        if self._native():
            self.run.upload(request.session, self._from_native(request, duration))
            return
        if ring is not None and ring.active:
            # The profiler is the ring's: serve the interval from its windows, if they hold
            # what was asked for.
            lacking = missing_levels(_levels(request.options), ring.levels())
            if lacking:
                raise ContinuousError(
                    f"on-demand sessions can't be captured while continuous profiling is "
                    f"active on {self.run.host} with fewer tracer levels than asked: "
                    f"{lacking}; stop continuous profiling, or ask for a snapshot")
            start = max(request.start_at, time.time())
            window_s = float(ring.status().get("window_s") or 2.0)
            timeout = (start + duration - time.time()) + 2 * window_s + 10.0
            self.run.upload(request.session,
                            lambda: ring.collect(start, start + duration, timeout))
            return
        self.run.upload(request.session, self._trace(request, duration))

    def _from_native(self, request: ControlRequest, duration: float) -> bytes:
        """The on-demand interval from xprof's native buffer: read once the interval ends."""
        lacking = missing_levels(_levels(request.options), None)
        if lacking:
            raise ContinuousError(
                f"on-demand sessions can't be captured while continuous profiling is active "
                f"on {self.run.host} (xprof's native session, started by the workload, holds "
                f"the profiler with its own tracer levels): {lacking}; ask for the default "
                "levels or a snapshot")
        if self._stop.wait(max(0.0, request.start_at + duration - time.time())):
            raise ContinuousError(f"{self.run.host} is shutting down (its run was closed)")
        return self._native_snapshot()

    def _trace(self, request: ControlRequest, duration: float) -> bytes:
        give_up = request.start_at + request.wait_s
        with self._trace_lock:
            if self._stop.wait(max(0.0, request.start_at - time.time())):
                raise ContinuousError(f"{self.run.host} is shutting down (its run was closed)")
            scratch = Path(tempfile.mkdtemp(prefix="mldiag-pull-"))
            checked_native = False
            try:
                trace = recorder(scratch, **_levels(request.options))
                while True:
                    try:
                        trace.start()
                        break
                    except RuntimeError as e:
                        if not checked_native:
                            # Found once: a native session does not end on its own.
                            checked_native = True
                            if self.run.native_running():
                                return self._from_native(request, duration)
                        if time.time() >= give_up or self._stop.is_set():
                            waited = max(0.0, time.time() - request.start_at)
                            raise ContinuousError(
                                f"another profiling session is active on {self.run.host} "
                                f"(still after {waited:.0f} s): {e}") from e
                        self._stop.wait(BUSY_RETRY_S)
                # A trace that started runs its duration, even while the run closes: its
                # upload is what the session waits for.
                time.sleep(duration)
                try:
                    return trace.stop()
                except RuntimeError:
                    # jax starts a session over xprof's native one without a word, and
                    # only the stop fails: read the native buffer instead.
                    if checked_native or not self.run.native_running():
                        raise
                    return self._from_native(request, duration)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)

    # Continuous profiling

    def _set_continuous(self, request: ControlRequest) -> None:
        if request.action == "continuous_start":
            self.run.start_continuous(**request.options)
        else:
            self.run.stop_continuous()
        # The answer the capture stage (and `mldiag continuous`) waits for.
        self.run.plane.state.update_target(self.run.name, self.run.host, self.run.target.port,
                                           last_request=request.id, last_error="")


def _levels(options: dict[str, Any]) -> dict[str, int]:
    return {k: int(options[k]) for k in LEVELS if k in options}
