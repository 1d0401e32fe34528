"""The continuous-profiling ring buffer, on CPU jax with a real jitted loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mldiag import limits
from mldiag.sdk.continuous import (
    CollectTimeout,
    ContinuousError,
    NoWindows,
    RingBuffer,
)
from mldiag.sdk.xspace import parse_xspace
from tests.helpers.jax_steps import jit_loop, step_events
from tests.helpers.wait import wait_until

WINDOW_S = 0.3


@pytest.fixture
def ring(tmp_path: Path) -> Iterator[RingBuffer]:
    ring = RingBuffer(tmp_root=tmp_path)
    yield ring
    ring.stop()


def _wait_windows(ring: RingBuffer, count: int, timeout_s: float = 15.0) -> None:
    wait_until(lambda: ring.status()["windows"] + ring.status()["evicted_windows"] >= count,
               timeout=timeout_s, interval=0.05,
               what=lambda: f"{count} windows: {ring.status()}")


def test_ring_records_back_to_back_windows_while_a_loop_runs(ring: RingBuffer) -> None:
    with jit_loop():
        ring.start(window_s=WINDOW_S)
        _wait_windows(ring, 4)
        status = ring.status()
        windows = ring.windows()

    assert ring.active
    assert status["state"] == "RUNNING" and status["reason"] is None
    assert status["windows"] == len(windows) >= 4
    assert status["bytes"] == sum(w.size for w in windows)
    assert status["oldest_window_start"] == windows[0].start
    for w in windows:
        assert WINDOW_S - 0.01 <= w.end - w.start < WINDOW_S + 0.5
    for a, b in zip(windows, windows[1:], strict=False):
        # Back to back: the next window starts when this one has stopped, within a short gap.
        assert 0 <= b.start - a.end < 1.0


def test_byte_cap_evicts_the_oldest_and_keeps_the_newest(
        ring: RingBuffer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A cap below one window keeps exactly the newest (the shared limit is 1 MiB and up).
    monkeypatch.setattr(limits, "MIN_RING_BYTES", 1)
    with jit_loop():
        ring.start(window_s=WINDOW_S, max_bytes=1)
        _wait_windows(ring, 3)
        status = ring.status()
        (kept,) = ring.windows()

    assert status["windows"] == 1 and status["evicted_windows"] >= 2
    assert kept.index >= 2
    files = list(tmp_path.rglob("*.xplane.pb"))
    # Evicted files are deleted; a next window may be landing beside the kept one.
    assert kept.path in files and len(files) <= 2


def test_snapshot_merges_the_newest_windows_with_the_loops_steps(ring: RingBuffer) -> None:
    with jit_loop() as progress:
        ring.start(window_s=WINDOW_S)
        _wait_windows(ring, 4)
        newest = ring.windows()[-3:]
        capture = ring.snapshot_capture(duration_s=newest[-1].end - newest[0].start)
        steps_so_far = progress["steps"]

    assert capture.windows >= 3
    assert capture.start == newest[0].start
    steps = step_events(capture.data)
    assert len(steps) > 10
    numbers = [n for n, _ in sorted(steps, key=lambda s: s[1])]
    assert numbers == sorted(numbers) and numbers[-1] <= steps_so_far
    ops = {md.name for p in parse_xspace(capture.data).planes
           for md in p.event_metadata.values()}
    assert any("fusion" in name or "dot" in name for name in ops), sorted(ops)[:50]


def test_snapshot_spans_the_requested_duration_and_less_than_one_window_more(
        ring: RingBuffer) -> None:
    with jit_loop():
        ring.start(window_s=WINDOW_S)
        _wait_windows(ring, 6)
        captures = {n: ring.snapshot_capture(duration_s=n * WINDOW_S) for n in (2, 3)}
        longer = ring.snapshot_capture(duration_s=2.5 * WINDOW_S)

    for n, capture in captures.items():
        assert capture.windows == n
        # Back-to-back windows: the span is n windows and the small gaps between them.
        assert n * WINDOW_S <= capture.end - capture.start < (n + 1) * WINDOW_S
    assert longer.windows == 3 and longer.end - longer.start >= 2.5 * WINDOW_S


def test_snapshot_is_at_least_the_newest_window(ring: RingBuffer) -> None:
    with jit_loop():
        ring.start(window_s=WINDOW_S)
        _wait_windows(ring, 2)
        capture = ring.snapshot_capture(duration_s=0.01)

    assert capture.windows == 1
    assert step_events(capture.data)


def test_snapshot_before_the_first_window_raises_no_windows(ring: RingBuffer) -> None:
    ring.start(window_s=30.0)
    with pytest.raises(NoWindows, match="no complete window yet"):
        ring.snapshot()


def test_snapshot_with_the_ring_off_says_so() -> None:
    with pytest.raises(ContinuousError, match="continuous profiling is off") as e:
        RingBuffer().snapshot()
    assert not isinstance(e.value, NoWindows)


def test_collect_waits_for_the_requested_interval(ring: RingBuffer) -> None:
    with jit_loop():
        ring.start(window_s=WINDOW_S)
        start = time.time()
        capture = ring.collect_capture(start, start + 0.8, timeout_s=10.0)
        returned = time.time()

    assert returned >= start + 0.8
    assert capture.end >= start + 0.8
    assert capture.start < start + 0.8
    assert capture.windows >= 2
    assert step_events(capture.data)


def test_collect_gives_up_after_its_timeout(ring: RingBuffer) -> None:
    ring.start(window_s=30.0)
    now = time.time()
    started = time.monotonic()
    with pytest.raises(CollectTimeout, match="timed out after 0.3 s"):
        ring.collect(now, now + 1.0, timeout_s=0.3)
    assert time.monotonic() - started < 2.0


class _WatchedCondition(threading.Condition):
    """The ring's condition variable, saying when a thread waits on it and when it wakes."""

    def __init__(self, lock: Any) -> None:
        super().__init__(lock)
        self.waiting = threading.Event()
        self.woken = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        notified = super().wait(timeout)
        if notified:
            self.woken.set()
        return notified


def test_collect_is_woken_when_the_ring_stops(ring: RingBuffer) -> None:
    ring.start(window_s=30.0)
    watched = ring._changed = _WatchedCondition(ring._lock)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            ring.collect(time.time(), time.time() + 20.0, timeout_s=20.0)
        except ContinuousError as e:
            errors.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    # Stopped only once collect waits for windows, so it is the stop that ends the wait.
    assert watched.waiting.wait(10.0), "collect never waited for windows"
    ring.stop()
    waiter.join(timeout=5.0)
    assert not waiter.is_alive()
    assert watched.woken.is_set(), "collect ended without being notified"
    assert len(errors) == 1 and not isinstance(errors[0], CollectTimeout)
    assert "continuous profiling is off" in str(errors[0])


def test_stop_deletes_the_ring_and_frees_the_profiler(ring: RingBuffer, tmp_path: Path) -> None:
    import jax

    with jit_loop():
        ring.start(window_s=WINDOW_S)
        _wait_windows(ring, 2)
        assert list(tmp_path.iterdir())
        ring.stop()

    assert not ring.active
    assert list(tmp_path.iterdir()) == []
    assert ring.status()["state"] == "OFF" and ring.status()["windows"] == 0
    ring.stop()  # idempotent
    # The profiler is free again for a programmatic trace.
    with jax.profiler.trace(tmp_path / "after"):
        pass
    assert list((tmp_path / "after").rglob("*.xplane.pb"))


def test_ring_waits_while_another_trace_holds_the_profiler(ring: RingBuffer,
                                                           tmp_path: Path) -> None:
    import jax

    jax.profiler.start_trace(str(tmp_path / "programmatic"))
    try:
        ring.start(window_s=WINDOW_S)
        wait_until(lambda: ring.status()["state"] == "WAITING"
                   and "busy" in str(ring.status()["reason"]), timeout=5.0, interval=0.05,
                   what=lambda: f"the ring to wait for the busy profiler: {ring.status()}")
        assert ring.active and ring.status()["windows"] == 0
    finally:
        jax.profiler.stop_trace()
    with jit_loop():
        _wait_windows(ring, 1)
    assert ring.status()["state"] == "RUNNING"


def test_start_is_idempotent_and_validates_options(ring: RingBuffer) -> None:
    for bad in ({"window_s": 0}, {"window_s": "2"}, {"max_bytes": 0},
                {"host_tracer_level": 4}, {"python_tracer_level": True},
                {"device_tracer_level": 2}):
        with pytest.raises(ValueError):
            ring.start(**bad)
    assert not ring.active
    ring.start(window_s=30.0)
    ring.start(window_s=1.0)
    assert ring.status()["window_s"] == 30.0


@pytest.mark.slow
def test_public_export_route_records_the_same_windows(ring: RingBuffer, tmp_path: Path) -> None:
    ring._fast_stop = False  # jax's public stop-and-export route, for other jax versions
    with jit_loop():
        ring.start(window_s=WINDOW_S)
        _wait_windows(ring, 2)
        data = ring.snapshot()

    assert step_events(data)
    # Nothing of the export is left beside the windows.
    assert not list(tmp_path.rglob("*.trace.json.gz"))
