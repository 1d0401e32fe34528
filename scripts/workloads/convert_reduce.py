"""Planted bottleneck: a bf16 tensor converted whole to f32 before it is reduced.

The step computes row statistics of bf16 activations by casting the whole tensor
(``x.astype(jnp.float32)``) and reducing the f32 copy twice (mean and mean of
squares). XLA:CPU materialises that copy as ``wrapped_convert`` (a ``kLoop`` fusion
around one ``convert``, bf16[4096,4096] -> f32[4096,4096], 64 MiB) feeding two
``ynn_fusion`` reduces, instead of accumulating in f32 while reading bf16.
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
    """Row mean and variance of bf16 activations, accumulated in f32."""
    xf = x.astype(jnp.float32)
    mean = xf.mean(axis=-1)
    var = (xf * xf).mean(axis=-1) - mean * mean
    return mean, var


def run(logdir: str, steps: int = 8) -> None:
    """Profile ``steps`` convert-then-reduce steps into ``logdir``."""
    x = jax.random.normal(jax.random.key(0), (ROWS, COLS), jnp.bfloat16)
    run_profiled(step, (x,), logdir, steps=steps)


if __name__ == "__main__":
    raise SystemExit(main(run, __doc__ or "convert_reduce"))
