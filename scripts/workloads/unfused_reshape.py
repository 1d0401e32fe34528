"""Planted bottleneck: an unfused reshape -> transpose -> reshape between two matmuls.

A projection produces ``[B, H*D]``; the step splits heads, moves the head axis to the
front and flattens again (``[B,H*D] -> [B,H,D] -> [H,B,D] -> [H*B,D]``) before a
second matmul. Neither matmul can absorb that data movement, so XLA:CPU runs it as a
standalone ``copy_bitcast_fusion`` (bitcast -> transpose -> copy -> bitcast) between
two ``ynn_fusion`` dots, a full extra pass over the activations every step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

if __package__:
    from ._common import main, run_profiled
else:
    from _common import main, run_profiled

BATCH = 2048
MODEL = 64
HEADS = 32
HEAD_DIM = 64
OUT = 32


def step(x: jax.Array, w_in: jax.Array, w_out: jax.Array) -> jax.Array:
    """Project, regroup the activations head-major, project again."""
    h = x @ w_in
    heads = h.reshape(BATCH, HEADS, HEAD_DIM).transpose(1, 0, 2).reshape(HEADS * BATCH, HEAD_DIM)
    return heads @ w_out


def run(logdir: str, steps: int = 8) -> None:
    """Profile ``steps`` steps with a standalone reshape/transpose chain into ``logdir``."""
    kx, k1, k2 = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (BATCH, MODEL), jnp.float32)
    w_in = jax.random.normal(k1, (MODEL, HEADS * HEAD_DIM), jnp.float32) / MODEL**0.5
    w_out = jax.random.normal(k2, (HEAD_DIM, OUT), jnp.float32) / HEAD_DIM**0.5
    run_profiled(step, (x, w_in, w_out), logdir, steps=steps)


if __name__ == "__main__":
    raise SystemExit(main(run, __doc__ or "unfused_reshape"))
