"""Planted bottleneck: a host-bound input pipeline.

Every step builds its batch on the host (numpy generation plus a simulated slow
reader, ``time.sleep``) and only then runs a small jitted step, so about 85-90% of
each ``train`` step is host time with the device idle.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

if __package__:
    from ._common import main, run_profiled
else:
    from _common import main, run_profiled

BATCH = 256
WIDTH = 512
HOST_STALL_S = 0.02


def step(w: jax.Array, x: jax.Array) -> jax.Array:
    """One small dense layer forward/backward."""

    def loss(w: jax.Array) -> jax.Array:
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    return w - 1e-3 * jax.grad(loss)(w)


def run(logdir: str, steps: int = 8) -> None:
    """Profile ``steps`` host-stalled steps into ``logdir``."""
    w = jax.random.normal(jax.random.key(0), (WIDTH, WIDTH), jnp.float32) / WIDTH**0.5

    def load_batch(i: int) -> tuple[jax.Array, jax.Array]:
        rng = np.random.default_rng(i)
        batch = rng.standard_normal((BATCH, WIDTH), dtype=np.float32)
        time.sleep(HOST_STALL_S)  # a slow reader: disk, network or decoding
        return w, jax.device_put(batch)

    run_profiled(step, load_batch(0), logdir, steps=steps, host_work=load_batch)


if __name__ == "__main__":
    raise SystemExit(main(run, __doc__ or "host_bound"))
