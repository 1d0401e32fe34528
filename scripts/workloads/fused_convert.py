"""Profile shape (a control): converts that XLA already fuses into their reductions.

The step sums bf16 activations in f32, ``jnp.sum(x.astype(jnp.float32), axis=-1)``.
XLA:CPU fuses the ``convert`` into the reducing kernel (one ``ynn_fusion``), so no f32
copy is ever written: ``jnp.sum(x, dtype=jnp.float32)`` would compile to the same HLO,
and no convert_reduce finding is warranted.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

if __package__:
    from ._common import main, run_profiled
else:
    from _common import main, run_profiled

ROWS = 4096
COLS = 4096


def step(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Row sums and the total of bf16 activations, accumulated in f32."""
    rows = jnp.sum(x.astype(jnp.float32), axis=-1)
    total = jnp.sum(x.astype(jnp.float32))
    return rows, total


def run(logdir: str, steps: int = 8) -> None:
    """Profile ``steps`` fused convert-and-reduce steps into ``logdir``."""
    x = jax.random.normal(jax.random.key(0), (ROWS, COLS), jnp.bfloat16)
    run_profiled(step, (x,), logdir, steps=steps)


if __name__ == "__main__":
    raise SystemExit(main(run, __doc__ or "fused_convert"))
