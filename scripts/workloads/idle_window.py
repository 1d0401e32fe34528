"""Profile shape: a capture window the device spends mostly idle.

Each iteration runs one small jitted op (a 256x256 matmul and tanh, well under a
millisecond on XLA:CPU) and then the host sleeps 20 ms, with no step markers. The device
is busy under 20% of the window; the idle time is the finding, and a roofline bound of the
little work that runs would mean nothing.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

if __package__:
    from ._common import main, run_profiled
else:
    from _common import main, run_profiled

N = 256
SLEEP_S = 0.02


def step(x: jax.Array, w: jax.Array) -> jax.Array:
    """One small dense layer."""
    return jnp.tanh(x @ w)


def _host_sleep(_: int) -> None:
    # Stands in for a host-side stall (data loading, logging) between device work.
    time.sleep(SLEEP_S)


def run(logdir: str, steps: int = 8) -> None:
    """Profile ``steps`` small ops separated by host sleeps into ``logdir``."""
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (N, N), jnp.float32)
    w = jax.random.normal(kw, (N, N), jnp.float32) / N**0.5
    run_profiled(step, (x, w), logdir, steps=steps, host_work=_host_sleep, step_markers=False)


if __name__ == "__main__":
    raise SystemExit(main(run, __doc__ or "idle_window"))
