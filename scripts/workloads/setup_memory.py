"""Profile shape: a large one-off setup program next to a small steady step.

Inside the trace, before the first step, one jitted ``init`` builds nine f32[4096,4096]
buffers (576 MiB), a stand-in for weight init or a data cache; the steps then run
a 1024-wide dense layer. The biggest compiled program in the profile is the setup, not the
step: memory must be judged on the programs that ran in the measured steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

if __package__:
    from ._common import main, run_profiled
else:
    from _common import main, run_profiled

BIG = 4096  # one f32[BIG, BIG] buffer is 64 MiB
BUFFERS = 9
WIDTH = 1024
BATCH = 512


def init(scale: jax.Array) -> tuple[jax.Array, ...]:
    """Materialise BUFFERS big tables, then keep one small slice of each."""
    tables = [jnp.full((BIG, BIG), scale * (i + 1), jnp.float32) for i in range(BUFFERS)]
    return tuple(t[:WIDTH, :WIDTH] for t in tables) + tuple(tables)


def step(w: jax.Array, x: jax.Array) -> jax.Array:
    """A small steady layer."""
    return jnp.tanh(x @ w)


def run(logdir: str, steps: int = 8) -> None:
    """Profile one setup program and ``steps`` small steps into ``logdir``."""
    init_jit = jax.jit(init)
    x = jax.random.normal(jax.random.key(0), (BATCH, WIDTH), jnp.float32)
    w = jnp.eye(WIDTH, dtype=jnp.float32)
    run_profiled(step, (w, x), logdir, steps=steps,
                 setup=lambda: init_jit(jnp.float32(1e-3)))


if __name__ == "__main__":
    raise SystemExit(main(run, __doc__ or "setup_memory"))
