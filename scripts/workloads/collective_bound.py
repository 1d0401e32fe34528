"""Planted bottleneck: a step dominated by an all-gather across 8 devices.

Eight XLA:CPU devices (``--xla_force_host_platform_device_count=8``) each hold a shard of
a 4096x1024 f32 activation. Every step all-gathers the whole array onto every device
(``jax.lax.all_gather`` inside ``shard_map``, 16 MiB per device) and then does only a small
reduction with it, so the collective, not the compute, sets the step time. XLA:CPU has no
op profile of its own: the collective shows only on the timeline, as ``all-gather`` thunks
on each device's executor thread.
"""

from __future__ import annotations

import os

# Before jax is imported: the device count is read once, at backend start.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

if __package__:
    from ._common import main, run_profiled
else:
    from _common import main, run_profiled

ROWS, COLS = 4096, 1024


def run(logdir: str, steps: int = 8) -> None:
    """Profile ``steps`` all-gather-bound steps on 8 CPU devices into ``logdir``."""
    mesh = Mesh(jax.devices()[:8], ("d",))

    def gather_then_reduce(x: jax.Array) -> jax.Array:
        full = jax.lax.all_gather(x, "d", tiled=True)  # every device gets the whole array
        return jnp.sum(full[:8], axis=0, keepdims=True)  # and uses a sliver of it

    step = jax.shard_map(gather_then_reduce, mesh=mesh, in_specs=P("d"), out_specs=P("d"))
    x = jax.device_put(jnp.ones((ROWS, COLS), jnp.float32), NamedSharding(mesh, P("d")))
    run_profiled(step, (x,), logdir, steps=steps)


if __name__ == "__main__":
    raise SystemExit(main(run, __doc__ or "collective_bound"))
