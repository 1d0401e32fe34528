"""Planted bottleneck: a layout-changing copy in front of a matmul.

The activations arrive column-major (``{0,1}``, e.g. produced by another program or
a transposed checkpoint), while XLA's matmul wants row-major (``{1,0}``). XLA:CPU
therefore inserts ``wrapped_copy`` (a ``kLoop`` fusion around one ``copy``) whose
only job is to rewrite the 2048x2048 f32 input from ``{0,1}`` to ``{1,0}`` every
step, before the dot. (Putting the input into that format once, before profiling,
compiles ``jit__device_put_reshard``: the same copy the other way round.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.layout import Format, Layout

if __package__:
    from ._common import main, run_profiled
else:
    from _common import main, run_profiled

N = 2048
K = 128


def step(x: jax.Array, w: jax.Array) -> jax.Array:
    """A dense layer over an input that is stored column-major."""
    return jnp.tanh(x @ w)


def run(logdir: str, steps: int = 8) -> None:
    """Profile ``steps`` steps whose input needs a layout copy into ``logdir``."""
    kx, kw = jax.random.split(jax.random.key(0))
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    column_major = Format(Layout(major_to_minor=(1, 0)), sharding)
    x = jax.device_put(jax.random.normal(kx, (N, N), jnp.float32), column_major)
    w = jax.random.normal(kw, (N, K), jnp.float32) / N**0.5
    run_profiled(
        step, (x, w), logdir, steps=steps, jit_kwargs={"in_shardings": (column_major, None)}
    )


if __name__ == "__main__":
    raise SystemExit(main(run, __doc__ or "layout_copy"))
