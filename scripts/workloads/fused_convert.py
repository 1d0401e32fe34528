"""Profile shape (a control): converts that XLA already fuses into their reductions.

The step sums two bf16 tensors in f32, each through ``x.astype(jnp.float32)`` and one
reduction (row sums of one, the total of the other). XLA:CPU fuses each ``convert`` into
its reducing kernel (a ``ynn_fusion`` each), so no f32 copy is ever written:
``jnp.sum(x, dtype=jnp.float32)`` would compile to the same HLO, and no convert_reduce
finding is warranted. (Two reductions of the *same* converted tensor would share one
materialised f32 copy: that is the planted convert_reduce workload.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

if __package__:
    from ._common import main, run_profiled
else:
    from _common import main, run_profiled

ROWS = 2048
COLS = 4096


def step(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Row sums of one bf16 tensor and the total of another, accumulated in f32."""
    rows = jnp.sum(x.astype(jnp.float32), axis=-1)
    total = jnp.sum(y.astype(jnp.float32))
    return rows, total


def run(logdir: str, steps: int = 8) -> None:
    """Profile ``steps`` fused convert-and-reduce steps into ``logdir``."""
    kx, ky = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (ROWS, COLS), jnp.bfloat16)
    y = jax.random.normal(ky, (ROWS, COLS), jnp.bfloat16)
    run_profiled(step, (x, y), logdir, steps=steps)


if __name__ == "__main__":
    raise SystemExit(main(run, __doc__ or "fused_convert"))
