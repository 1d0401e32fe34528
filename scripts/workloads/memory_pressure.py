"""Planted bottleneck: large live memory.

A cache of twelve f32[4096,4096] arrays (768 MiB) stays alive across steps and is
passed into every step, and the step materialises a 64 MiB intermediate
(``tanh`` of the first entry, which the matmul consumes as a separate buffer). The
step module's buffers (``get_peak_allocations``) therefore total about 830 MiB,
while the step itself only touches one row of most of them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

if __package__:
    from ._common import main, run_profiled
else:
    from _common import main, run_profiled

N = 4096  # one f32[N, N] buffer is 64 MiB
CACHE_BUFFERS = 12
OUT = 64


def step(cache: list[jax.Array], w: jax.Array) -> jax.Array:
    """A matmul over a big materialised intermediate, plus one row of every cached array."""
    h = jnp.tanh(cache[0])
    rows = jnp.sum(jnp.stack([c[0] for c in cache[1:]]), axis=0)
    return h @ w + rows[:, None]


def run(logdir: str, steps: int = 8) -> None:
    """Profile ``steps`` memory-hungry steps into ``logdir``."""
    kc, kw = jax.random.split(jax.random.key(0))
    cache = [jax.random.normal(kc, (N, N), jnp.float32)]
    cache += [jnp.full((N, N), float(i), jnp.float32) for i in range(1, CACHE_BUFFERS)]
    w = jax.random.normal(kw, (N, OUT), jnp.float32) / N**0.5
    run_profiled(step, (cache, w), logdir, steps=steps)


if __name__ == "__main__":
    raise SystemExit(main(run, __doc__ or "memory_pressure"))
