"""Profile shape: a jitted training loop that nobody annotated with step markers.

The loop is the convert_reduce step (a bf16 tensor cast whole to f32, then reduced twice)
run back to back with no ``StepTraceAnnotation``, as many real scripts are profiled. The
profile has no steps, so an analysis must judge it over the capture window, state its
shares as shares of device (window) time, and invent no step time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

if __package__:
    from ._common import main, run_profiled
else:
    from _common import main, run_profiled

ROWS = 1024
COLS = 4096


def step(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Row mean and variance of bf16 activations, through a materialised f32 copy."""
    xf = x.astype(jnp.float32)
    mean = xf.mean(axis=-1)
    var = (xf * xf).mean(axis=-1) - mean * mean
    return mean, var


def run(logdir: str, steps: int = 8) -> None:
    """Profile ``steps`` unannotated iterations into ``logdir``."""
    x = jax.random.normal(jax.random.key(0), (ROWS, COLS), jnp.bfloat16)
    run_profiled(step, (x,), logdir, steps=steps, step_markers=False)


if __name__ == "__main__":
    raise SystemExit(main(run, __doc__ or "no_step_markers"))
