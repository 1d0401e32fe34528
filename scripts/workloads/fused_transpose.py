"""Profile shape: a transpose that XLA fuses into its elementwise consumer.

The step computes ``tanh(x.T + y)`` on 2048x2048 f32 arrays. XLA:CPU fuses the
transpose into the ``add``/``tanh`` loop fusion (``add_tanh_fusion``): no standalone copy
runs, but the fusion reads ``x`` column by column (a strided 16 MiB read) every step. The
transpose's cost is inside that fusion, which is most of the step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

if __package__:
    from ._common import main, run_profiled
else:
    from _common import main, run_profiled

N = 2048


def step(x: jax.Array, y: jax.Array) -> jax.Array:
    """An elementwise op over a transposed operand."""
    return jnp.tanh(x.T + y)


def run(logdir: str, steps: int = 8) -> None:
    """Profile ``steps`` steps that transpose inside a fusion into ``logdir``."""
    kx, ky = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (N, N), jnp.float32)
    y = jax.random.normal(ky, (N, N), jnp.float32)
    run_profiled(step, (x, y), logdir, steps=steps)


if __name__ == "__main__":
    raise SystemExit(main(run, __doc__ or "fused_transpose"))
