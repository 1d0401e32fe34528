"""A jitted training-like loop to profile, and the steps a profile of it recorded."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STEP_NAME = "train"


@contextmanager
def jit_loop(size: int = 128, pause_s: float = 0.001) -> Iterator[dict[str, int]]:
    """A jitted matmul training-like loop in a background thread, one step annotation each."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def step(x: Any) -> Any:
        return jnp.tanh(x @ x) * 0.5

    x = jnp.ones((size, size))
    step(x).block_until_ready()  # compile before anything is traced
    stop = threading.Event()
    progress = {"steps": 0}

    def run() -> None:
        nonlocal x
        while not stop.is_set():
            with jax.profiler.StepTraceAnnotation(STEP_NAME, step_num=progress["steps"]):
                x = step(x)
                x.block_until_ready()
            progress["steps"] += 1
            time.sleep(pause_s)

    thread = threading.Thread(target=run, name="jit-loop", daemon=True)
    thread.start()
    try:
        yield progress
    finally:
        stop.set()
        thread.join()


def step_events(blob: bytes) -> list[tuple[int, float]]:
    """(step number, start ns) of every training step event in a serialized XSpace."""
    from xprof.profile_data import ProfileData

    steps = []
    for plane in ProfileData.from_serialized_xspace(blob).planes:
        for line in plane.lines:
            for event in line.events:
                if event.name == STEP_NAME:
                    stats = dict(event.stats)
                    steps.append((int(stats["step_num"]), float(event.start_ns)))
    return steps
