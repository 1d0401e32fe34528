"""Profile shape: a step dominated by LAPACK custom calls on XLA:CPU.

Each step solves a linear system, takes an eigendecomposition and a singular value
decomposition of 192x192 matrices (``jnp.linalg.solve``/``eigh``/``svd``). XLA:CPU runs
them as FFI custom calls into LAPACK (``lapack_*_ffi``): opaque to XLA, with no FLOP count
in the HLO cost model, and most of the step's time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

if __package__:
    from ._common import main, run_profiled
else:
    from _common import main, run_profiled

N = 192


def step(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Solve, eigendecompose and SVD a symmetric positive definite matrix."""
    spd = a @ a.T + N * jnp.eye(N, dtype=a.dtype)
    x = jnp.linalg.solve(spd, b)
    evals, evecs = jnp.linalg.eigh(spd)
    s = jnp.linalg.svd(spd + x[:, :1], compute_uv=False)
    return evecs[:, -1] * evals[-1], x, s


def run(logdir: str, steps: int = 8) -> None:
    """Profile ``steps`` linear-algebra steps into ``logdir``."""
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (N, N), jnp.float32) / N**0.5
    b = jax.random.normal(kb, (N, 16), jnp.float32)
    run_profiled(step, (a, b), logdir, steps=steps)


if __name__ == "__main__":
    raise SystemExit(main(run, __doc__ or "custom_calls"))
