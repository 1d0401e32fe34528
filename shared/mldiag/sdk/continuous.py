"""Continuous profiling in the workload process: a ring buffer of back-to-back trace windows.

A daemon thread records the process with the JAX profiler in windows of `window_s` seconds,
keeps each window's serialized XSpace in a private temporary directory under a byte cap
(oldest dropped first, the newest always kept), and merges recent windows on request: a
snapshot of the last seconds, or the interval of an on-demand or programmatic capture.

Only one profiler session may run in a process. While the ring runs it holds that session;
when something else holds it (a `jax.profiler.trace` the ring did not start, or a remote
capture through the profiler server), the ring waits and retries, and `status()` says so.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mldiag import limits
from mldiag.capture.remote import DEFAULT_LEVELS
from mldiag.sdk.custom_types.exceptions import MLDiagnosticError
from mldiag.sdk.xspace import merge_xspaces

log = logging.getLogger(__name__)

OFF, RUNNING, WAITING, FAILED = "OFF", "RUNNING", "WAITING", "FAILED"
_RETRY_S = 0.5
LEVELS = ("host_tracer_level", "device_tracer_level", "python_tracer_level")


def missing_levels(requested: dict[str, int], recorded: dict[str, int] | None) -> str:
    """'' when a trace recorded at `recorded` levels holds everything `requested` asks for,
    else what it lacks ("python_tracer_level=1 (recorded: 0)"). `recorded` None: unknown
    levels (a session someone else started), which hold only what the defaults ask for."""
    if recorded is None:
        asked = {k: v for k, v in requested.items() if DEFAULT_LEVELS.get(k) != v}
        return ", ".join(f"{k}={v} (its levels are unknown)" for k, v in sorted(asked.items()))
    return ", ".join(f"{k}={v} (recorded: {recorded.get(k, 0)})"
                     for k, v in sorted(requested.items()) if v > recorded.get(k, 0))


class ContinuousError(MLDiagnosticError, RuntimeError):
    """Continuous profiling cannot serve the request (ring off, timed out, capture failed).

    Permanent for this request: a pulled request answers with the reason.
    """


class NoWindows(ContinuousError):
    """The ring holds no complete window for the requested interval yet.

    Transient: a window completes every `window_s`.
    """


class CollectTimeout(ContinuousError):
    """The windows covering a requested interval did not arrive in time.

    Transient: a later request may find them.
    """


@dataclass(frozen=True)
class Window:
    """One recorded window: wall-clock bounds (epoch seconds) and its file in the ring."""

    index: int
    start: float
    end: float
    path: Path
    size: int


@dataclass(frozen=True)
class Capture:
    """Merged windows: the serialized XSpace and the wall-clock interval it covers."""

    data: bytes
    start: float
    end: float
    windows: int


@dataclass(frozen=True)
class _Options:
    window_s: float
    max_bytes: int
    host_tracer_level: int
    device_tracer_level: int
    python_tracer_level: int


def _level(name: str, value: int, top: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise ValueError(f"{name} must be an integer from 0 to {top}, got {value!r}")
    return value


def _profile_options(opts: _Options) -> Any:
    import jax

    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = opts.host_tracer_level
    options.python_tracer_level = opts.python_tracer_level
    # A failed start must raise, so the ring waits instead of recording empty windows.
    options.raise_error_on_start_failure = True
    if hasattr(options, "device_tracer_level"):
        options.device_tracer_level = opts.device_tracer_level
    elif opts.device_tracer_level != 1:
        raise ValueError(
            f"device_tracer_level={opts.device_tracer_level} is not supported by jax "
            f"{jax.__version__}: its ProfileOptions always trace devices (level 1)")
    return options


def _jax_session_internals() -> Any | None:
    """jax's private profiler module when its session internals are as this code expects."""
    from jax._src import profiler as jax_profiler

    session = jax_profiler.ProfileSession()
    if (hasattr(jax_profiler, "_profile_state") and hasattr(jax_profiler, "clear_metadata")
            and "_raw_session" in vars(session) and "_is_running" in vars(session)):
        return jax_profiler
    return None


class _Recorder:
    """Starts and stops one window's profiler session and returns its serialized XSpace.

    jax's public `ProfileSession.stop()` returns an in-memory ProfileData that cannot be
    serialized, so the public route exports it to disk, which also converts it to a
    trace.json.gz (about 0.3 s of CPU per window here). The raw session's `stop()` returns the
    XSpace bytes directly (about 0.1 s); it is used the way jax's own
    `stop_and_get_fdo_profile` uses it, and the public route is kept for jax versions whose
    internals differ.
    """

    def __init__(self, options: Any, scratch: Path, fast: bool = True) -> None:
        self._options = options
        self._scratch = scratch
        self._jax = _jax_session_internals() if fast else None
        self._session: Any = None

    def start(self) -> None:
        """Start a session; RuntimeError when another profiler session is running."""
        import jax

        session = jax.profiler.ProfileSession(profiler_options=self._options)
        session.start()
        self._session = session

    def stop(self) -> bytes:
        """Stop the session; RuntimeError when another session took the profiler meanwhile."""
        session, self._session = self._session, None
        if self._jax is not None:
            state = self._jax._profile_state
            with state.lock:
                try:
                    return bytes(session._raw_session.stop())
                finally:
                    # Reset jax's bookkeeping even when the C++ stop fails, or jax would
                    # refuse every later trace in this process.
                    session._is_running = False
                    session._raw_session = None
                    state.reset()
                    self._jax.clear_metadata()
        import jax

        session.stop()
        out = self._scratch / "export"
        try:
            jax.profiler.export_profile_data(session, out, session_id="window")
            found = sorted((out / "plugins" / "profile" / "window").glob("*.xplane.pb"))
            if not found:
                raise ContinuousError(f"jax exported no .xplane.pb under {out}")
            return found[0].read_bytes()
        finally:
            shutil.rmtree(out, ignore_errors=True)

    @property
    def recording(self) -> bool:
        return self._session is not None


def recorder(scratch: Path, *, host_tracer_level: int = 2, device_tracer_level: int = 1,
             python_tracer_level: int = 0) -> _Recorder:
    """A one-off trace of this process with these tracer levels (what a pulled on-demand
    capture records when the ring is off): `start()`, then `stop()` gives the XSpace bytes.
    ValueError on bad levels."""
    opts = _Options(2.0, limits.MIN_RING_BYTES,
                    _level("host_tracer_level", host_tracer_level, 3),
                    _level("device_tracer_level", device_tracer_level, 1),
                    _level("python_tracer_level", python_tracer_level, 1))
    return _Recorder(_profile_options(opts), scratch)


class RingBuffer:
    """Continuous profiling of this process into a ring of trace windows on local disk."""

    def __init__(self, tmp_root: str | Path | None = None) -> None:
        self._tmp_root = None if tmp_root is None else str(tmp_root)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._windows: deque[Window] = deque()
        self._bytes = 0
        self._evicted = 0
        self._state = OFF
        self._reason: str | None = None
        self._opts: _Options | None = None
        self._dir: Path | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._next_index = 0
        # Tests force jax's public (slower) route with this.
        self._fast_stop = True
        # Names who holds the profiler when the ring cannot start a window (None: unknown).
        self.holder: Callable[[], str | None] | None = None
        self._held_by: str | None = None

    @property
    def held_by(self) -> str | None:
        """Who holds this process's profiler while the ring waits for it, when known (xprof's
        native continuous profiling, say); None while the ring records or is off."""
        with self._lock:
            return self._held_by if self._thread is not None else None

    def levels(self) -> dict[str, int] | None:
        """The tracer levels the ring records at; None while it is off."""
        with self._lock:
            if self._thread is None or self._opts is None:
                return None
            return {k: getattr(self._opts, k) for k in LEVELS}

    @property
    def active(self) -> bool:
        """True from start() until stop(), including while waiting for a busy profiler."""
        with self._lock:
            return self._thread is not None

    def start(self, window_s: float = 2.0, max_bytes: int = 2 * 1024**3,
              host_tracer_level: int = 2, device_tracer_level: int = 1,
              python_tracer_level: int = 0) -> None:
        """Start recording windows of `window_s` seconds, keeping at most `max_bytes` on disk.

        Idempotent while already active (the running options are kept). Raises ValueError
        on bad options.
        """
        limits.check_window(window_s)
        limits.check_ring_bytes(max_bytes)
        opts = _Options(float(window_s), max_bytes,
                        _level("host_tracer_level", host_tracer_level, 3),
                        _level("device_tracer_level", device_tracer_level, 1),
                        _level("python_tracer_level", python_tracer_level, 1))
        profile_options = _profile_options(opts)
        with self._lock:
            if self._thread is not None:
                return
            self._dir = Path(tempfile.mkdtemp(prefix="mldiag-ring-", dir=self._tmp_root))
            recorder = _Recorder(profile_options, self._dir, fast=self._fast_stop)
            self._opts = opts
            self._windows.clear()
            self._bytes = self._evicted = 0
            self._state, self._reason = WAITING, "starting the first window"
            self._held_by = None
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, args=(recorder, opts),
                                            name="mldiag-ring", daemon=True)
            self._thread.start()
        # A profiler session still open at interpreter exit can crash the process.
        atexit.register(self.stop)

    def stop(self) -> None:
        """End the current window, stop the thread and delete the ring's files. Idempotent."""
        with self._lock:
            thread, directory = self._thread, self._dir
            if thread is None:
                return
            self._stop.set()
        thread.join()
        atexit.unregister(self.stop)
        with self._changed:
            self._thread = None
            self._dir = None
            self._windows.clear()
            self._bytes = 0
            if self._state != FAILED:
                self._state, self._reason = OFF, None
            self._changed.notify_all()
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    def status(self) -> dict[str, Any]:
        """State (OFF, RUNNING, WAITING, FAILED), reason, options, windows held and their span."""
        with self._lock:
            opts = self._opts if self._thread is not None else None
            return {
                "state": self._state,
                "reason": self._reason,
                "window_s": None if opts is None else opts.window_s,
                "max_bytes": None if opts is None else opts.max_bytes,
                "windows": len(self._windows),
                "bytes": self._bytes,
                "evicted_windows": self._evicted,
                "oldest_window_start": self._windows[0].start if self._windows else None,
                "newest_window_end": self._windows[-1].end if self._windows else None,
            }

    def windows(self) -> list[Window]:
        """The windows held now, oldest first."""
        with self._lock:
            return list(self._windows)

    def snapshot(self, duration_s: float | None = None) -> bytes:
        """The fewest newest complete windows that together span at least `duration_s`
        (so less than one window more), merged.

        At least one window; all held windows when `duration_s` is None (or when they span
        less than `duration_s`). Never waits: raises
        NoWindows when no window is complete yet, ContinuousError when the ring is off.
        """
        return self.snapshot_capture(duration_s).data

    def snapshot_capture(self, duration_s: float | None = None) -> Capture:
        """Like snapshot(), with the wall-clock interval the merged windows cover."""
        if duration_s is not None and (isinstance(duration_s, bool) or not isinstance(
                duration_s, int | float) or duration_s <= 0):
            raise ValueError(f"duration_s must be a positive number or None, got {duration_s!r}")
        with self._lock:
            self._require_active()
            if not self._windows:
                raise NoWindows(self._no_window_reason())
            chosen = list(self._windows)
            if duration_s is not None:
                # From the newest window's end back (the current window is not complete):
                # the first window that makes the span reach `duration_s` is included.
                first = len(chosen) - 1
                while first > 0 and chosen[-1].end - chosen[first].start < duration_s:
                    first -= 1
                chosen = chosen[first:]
            blobs = self._read(chosen)
        return Capture(merge_xspaces(blobs), chosen[0].start, chosen[-1].end, len(chosen))

    def collect(self, start_ts: float, end_ts: float, timeout_s: float) -> bytes:
        """Wait until windows cover up to `end_ts`, then merge those overlapping the interval.

        Raises CollectTimeout when `timeout_s` passes first, ContinuousError when the ring
        stops or fails, NoWindows
        when no held window overlaps [start_ts, end_ts] (evicted, or recorded while the
        profiler was busy).
        """
        return self.collect_capture(start_ts, end_ts, timeout_s).data

    def collect_capture(self, start_ts: float, end_ts: float, timeout_s: float) -> Capture:
        """Like collect(), with the wall-clock interval the merged windows cover."""
        if end_ts < start_ts:
            raise ValueError(f"end_ts {end_ts} is before start_ts {start_ts}")
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                self._require_active()
                if self._windows and self._windows[-1].end >= end_ts:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    newest = self._windows[-1].end if self._windows else None
                    raise CollectTimeout(
                        f"timed out after {timeout_s:.1f} s waiting for windows up to {end_ts:.3f}"
                        f" (newest window ends at {newest}; ring {self._state}"
                        f"{': ' + self._reason if self._reason else ''})")
                self._changed.wait(left)
            chosen = [w for w in self._windows if w.end > start_ts and w.start < end_ts]
            if not chosen:
                oldest = self._windows[0].start
                raise NoWindows(
                    f"no window overlaps [{start_ts:.3f}, {end_ts:.3f}]: the oldest window "
                    f"held starts at {oldest:.3f}"
                    + (" (older windows were evicted by the byte cap)" if self._evicted else ""))
            blobs = self._read(chosen)
        return Capture(merge_xspaces(blobs), chosen[0].start, chosen[-1].end, len(chosen))

    # Inside the lock: windows can be evicted as soon as it is released.
    def _read(self, chosen: list[Window]) -> list[bytes]:
        return [w.path.read_bytes() for w in chosen]

    def _require_active(self) -> None:
        if self._thread is None or self._state == FAILED:
            raise ContinuousError(
                "continuous profiling is off" + (f" ({self._reason})" if self._reason else ""))

    def _no_window_reason(self) -> str:
        assert self._opts is not None
        if self._state == WAITING and self._held_by:
            return (f"the ring has no window: this process's profiler is held by "
                    f"{self._held_by}, so the ring records nothing until that session stops")
        why = f"; {self._reason}" if self._state == WAITING and self._reason else ""
        return (f"no complete window yet: the first one ends about {self._opts.window_s:g} s "
                f"after the profiler starts (ring {self._state}{why})")

    def _set_state(self, state: str, reason: str | None) -> None:
        with self._lock:
            if (state, reason) != (self._state, self._reason):
                log.info("continuous profiling %s%s", state, f": {reason}" if reason else "")
            self._state, self._reason = state, reason
            if state == RUNNING:
                self._held_by = None

    def _busy(self, error: RuntimeError, what: str) -> None:
        """The profiler refused a window: wait, naming the holder when it can be found out
        (once per busy spell: finding out may cost a call to the profiler server)."""
        with self._lock:
            held_by = self._held_by
        if held_by is None and self.holder is not None:
            try:
                held_by = self.holder()
            except Exception as e:  # noqa: BLE001 - the generic reason below still holds
                log.debug("could not tell who holds the profiler: %s", e)
        with self._lock:
            self._held_by = held_by
        self._set_state(WAITING, f"profiler held by {held_by}" if held_by
                        else f"{what}: {error}")

    def _run(self, recorder: _Recorder, opts: _Options) -> None:
        try:
            self._loop(recorder, opts)
        except Exception as e:
            log.exception("continuous profiling failed")
            self._set_state(FAILED, f"{type(e).__name__}: {e}")
            raise
        finally:
            if recorder.recording:
                # Release the profiler: a window that cannot be stored is not worth keeping.
                try:
                    recorder.stop()
                except RuntimeError as e:
                    log.warning("stopping the last window failed: %s", e)
            with self._changed:
                self._changed.notify_all()

    def _loop(self, recorder: _Recorder, opts: _Options) -> None:
        started = 0.0
        while not self._stop.is_set():
            if not recorder.recording:
                try:
                    recorder.start()
                except RuntimeError as e:
                    self._busy(e, "profiler busy, retrying")
                    self._stop.wait(min(_RETRY_S, opts.window_s))
                    continue
                started = time.time()
            self._set_state(RUNNING, None)
            self._stop.wait(max(0.0, started + opts.window_s - time.time()))
            ended = time.time()
            try:
                blob = recorder.stop()
            except RuntimeError as e:
                # Another session (a remote capture) took the C++ profiler during the window.
                self._busy(e, "window lost, profiler busy")
                self._stop.wait(min(_RETRY_S, opts.window_s))
                continue
            if self._stop.is_set():
                return
            # Start the next window before storing this one: the gap is only the stop above.
            next_started = started
            try:
                recorder.start()
                next_started = time.time()
            except RuntimeError as e:
                self._busy(e, "profiler busy, retrying")
            self._store(blob, started, ended, opts)
            started = next_started

    def _store(self, blob: bytes, started: float, ended: float, opts: _Options) -> None:
        assert self._dir is not None
        index = self._next_index
        self._next_index += 1
        path = self._dir / f"window-{index:08d}.xplane.pb"
        path.write_bytes(blob)
        with self._changed:
            self._windows.append(Window(index, started, ended, path, len(blob)))
            self._bytes += len(blob)
            while self._bytes > opts.max_bytes and len(self._windows) > 1:
                old = self._windows.popleft()
                self._bytes -= old.size
                self._evicted += 1
                old.path.unlink(missing_ok=True)
            self._changed.notify_all()
