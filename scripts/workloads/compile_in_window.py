"""Planted artefact: the first profiled step compiles the program.

The profiler wraps the whole loop, warm-up included (as when a training run is wrapped whole
in ``xprof()``): step 0 traces and compiles ``step`` inside the trace, the other steps run the
compiled program. The compile step is an outlier many times the median step; judging step
time with it in would blame JAX's own compile machinery.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

if __package__:
    from ._common import main, run_profiled
else:
    from _common import main, run_profiled

N = 512


def step(x: jax.Array, w: jax.Array) -> jax.Array:
    """A few layers, enough that compiling takes far longer than a step."""
    for _ in range(6):
        x = jnp.tanh(x @ w) + jnp.sin(x)
    return x


def run(logdir: str, steps: int = 8) -> None:
    """Profile ``steps`` steps into ``logdir``, the first one compiling."""
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (N, N), jnp.float32)
    w = jax.random.normal(kw, (N, N), jnp.float32) / N**0.5
    jax.block_until_ready((x, w))
    run_profiled(step, (x, w), logdir, steps=steps, warmup=0)


if __name__ == "__main__":
    raise SystemExit(main(run, __doc__ or "compile_in_window"))
