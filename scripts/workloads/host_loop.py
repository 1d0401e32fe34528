"""Planted bottleneck: a host loop of small eager operations.

Each step is a Python loop that applies ``x + b`` and ``jnp.maximum`` row block by row block
without ``jax.jit``: every operation is its own dispatch of a tiny program, so the host
(JAX's dispatch) fills the step and the device waits between the little kernels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

if __package__:
    from ._common import main
else:
    from _common import main

ROWS, WIDTH, BLOCKS = 64, 256, 40


def step(x: jax.Array, b: jax.Array) -> jax.Array:
    """Not jitted: one dispatch per operation per block."""
    out = x
    for _ in range(BLOCKS):
        out = jnp.maximum(out + b, 0.0) * 0.5
    return out


def run(logdir: str, steps: int = 8) -> None:
    """Profile ``steps`` eager host-loop steps into ``logdir``."""
    x = jnp.ones((ROWS, WIDTH), jnp.float32)
    b = jnp.full((WIDTH,), 0.1, jnp.float32)
    jax.block_until_ready(step(x, b))  # compile the little programs before the trace
    with jax.profiler.trace(logdir):
        for i in range(steps):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                x = jax.block_until_ready(step(x, b))


if __name__ == "__main__":
    raise SystemExit(main(run, __doc__ or "host_loop"))
