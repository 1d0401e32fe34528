"""Healthy baseline: a compute-bound MLP forward/backward step with nothing planted.

Inputs and weights are device-resident before profiling, there is no host work, and
the step is dominated by matmuls (dots) with fused tanh/elementwise epilogues.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

if __package__:
    from ._common import main, run_profiled
else:
    from _common import main, run_profiled

BATCH = 256
WIDTH = 512
LAYERS = 3


def _loss(params: list[jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    h = x
    for w in params:
        h = jnp.tanh(h @ w)
    return jnp.mean((h - y) ** 2)


def step(params: list[jax.Array], x: jax.Array, y: jax.Array) -> list[jax.Array]:
    grads = jax.grad(_loss)(params, x, y)
    return [w - 1e-3 * g for w, g in zip(params, grads, strict=True)]


def run(logdir: str, steps: int = 8) -> None:
    """Profile ``steps`` healthy MLP training steps into ``logdir``."""
    keys = jax.random.split(jax.random.key(0), LAYERS + 2)
    params = [
        jax.random.normal(k, (WIDTH, WIDTH), jnp.float32) / WIDTH**0.5 for k in keys[:LAYERS]
    ]
    x = jax.random.normal(keys[-2], (BATCH, WIDTH), jnp.float32)
    y = jax.random.normal(keys[-1], (BATCH, WIDTH), jnp.float32)
    run_profiled(step, (params, x, y), logdir, steps=steps)


if __name__ == "__main__":
    raise SystemExit(main(run, __doc__ or "baseline"))
