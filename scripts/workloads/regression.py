"""One program captured twice, the second time with one planted change (for `mldiag diff`).

`DIR/before` gets a profile of a small dense step, `DIR/after` one of the same step with the
change that ``--change`` names planted, both from one process, one after the other, so that
the rest (the machine's load, the warm caches) is as equal as it can be:

- ``stall``: the batch reader sleeps ``STALL_S`` on the host inside every step (an input
  pipeline falling behind): host wait grows, the device work does not;
- ``layout``: the activations arrive column-major (``{0,1}``), so the step recompiles with
  a copy into the row-major layout its dot wants;
- ``batch``: the batch is doubled: the same ops on inputs twice as large;
- ``collective``: on two devices (virtual ones on CPU), each device's accumulator is summed
  across the devices: a new all-reduce every step (``before`` is the same program without it);
- ``none``: nothing: two captures of the same program (run-to-run variation only).

Three more recompile the same program, a step of elementwise work feeding a matmul, with one
change in one line (`RECOMPILED`), so the compiled HLO changes and XLA renames its fusions:

- ``transpose``: the activations are materialized transposed before the matmul (a transpose
  fusion and a copy, and the matmul split out of its fusion);
- ``dtype``: the step starts with a softmax; it and the elementwise work run in float16
  instead of float32 (which XLA:CPU computes several times slower);
- ``fusion``: an optimization barrier splits the elementwise fusion in two (a fusion
  boundary that moves: the intermediate is written out and read back).

    python scripts/workloads/regression.py --logdir DIR --change layout [--steps 8]
    python scripts/workloads/regression.py --logdir DIR --change stall,layout  # DIR/<change>/
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CHANGES = ("stall", "layout", "batch", "collective", "transpose", "dtype", "fusion", "none")
RECOMPILED = ("transpose", "dtype", "fusion")
STALL_S = 0.04
# Elements of the accumulator that `collective` sums across the devices every step (8 MB).
ACCUMULATOR = 2 * 1024 * 1024
# (batch, width, out) of each change's program: large enough that the planted change stands
# well clear of run-to-run variation on a loaded 2-core machine, small enough for seconds.
SIZES = {
    "stall": (512, 1024, 256),
    "layout": (1024, 2048, 32),
    "batch": (1024, 1024, 256),
    "collective": (64, 512, 256),
    "none": (512, 1024, 256),
    "transpose": (1024, 2048, 32),
    "dtype": (2048, 2048, 32),
    "fusion": (1024, 2048, 32),
}


def devices_for(change: str) -> int:
    return 2 if change == "collective" else 1


def _program(change: str, planted: bool) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """(step function, its arguments, run_profiled's keyword arguments)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.layout import Format, Layout
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    batch, width, out = SIZES[change]
    if change in RECOMPILED:
        return _recompiled(change, planted)
    if planted and change == "batch":
        batch *= 2
    kx, kw = jax.random.split(jax.random.key(0))

    def update(w: jax.Array, x: jax.Array) -> jax.Array:
        # A forward pass and a cheap update from its output.
        h = jnp.tanh(x @ w)
        return jnp.mean(h, axis=0, keepdims=True) * w

    if change == "collective":
        n = devices_for(change)
        mesh = Mesh(jax.devices()[:n], ("d",))

        def local(w: jax.Array, x: jax.Array, acc: jax.Array) -> tuple[jax.Array, ...]:
            new_w = (w[0] - 1e-3 * update(w[0], x))[None]
            if not planted:
                return (new_w,)
            # Each device's accumulator (statistics, gradients) summed across the devices.
            return new_w, jax.lax.psum(acc, "d")

        step = jax.shard_map(local, mesh=mesh, in_specs=(P("d"), P("d"), P("d")),
                             out_specs=(P("d"), P("d")) if planted else (P("d"),))
        # Placed on the devices once, as a training loop keeps them: no resharding per step.
        shard = jax.sharding.NamedSharding(mesh, P("d"))
        w = jax.device_put(jax.random.normal(kw, (n, width, out), jnp.float32) / width**0.5,
                           shard)
        x = jax.device_put(jax.random.normal(kx, (batch * n, width), jnp.float32), shard)
        acc = jax.device_put(jnp.ones((n, ACCUMULATOR), jnp.float32), shard)
        return step, (w, x, acc), {}

    def dense(w: jax.Array, x: jax.Array) -> jax.Array:
        return w - 1e-3 * update(w, x)

    w = jax.random.normal(kw, (width, out), jnp.float32) / width**0.5
    x = jax.random.normal(kx, (batch, width), jnp.float32)
    kwargs: dict[str, Any] = {}
    if planted and change == "layout":
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        column_major = Format(Layout(major_to_minor=(1, 0)), sharding)
        x = jax.device_put(x, column_major)
        kwargs["jit_kwargs"] = {"in_shardings": (None, column_major)}
    if planted and change == "stall":
        host_batch = np.asarray(x)

        def load_batch(i: int) -> tuple[jax.Array, jax.Array]:
            time.sleep(STALL_S)  # a slow reader: disk, network or decoding
            return w, jax.device_put(host_batch)

        kwargs["host_work"] = load_batch
    return dense, (w, x), kwargs


def _recompiled(change: str, planted: bool) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """One program for `RECOMPILED`: every line the same on both sides but the planted one."""
    import jax
    import jax.numpy as jnp

    batch, width, out = SIZES[change]
    kx, kw = jax.random.split(jax.random.key(1))
    same = (lambda v: v)  # noqa: E731
    barrier = jax.lax.optimization_barrier
    if planted and change == "transpose":
        def layout(v: jax.Array) -> jax.Array:
            return barrier(v.T).T  # the planted change: a materialized transpose
    else:
        layout = same
    if planted and change == "dtype":
        def precision(v: jax.Array) -> jax.Array:
            return v.astype(jnp.float16)  # the planted change: float16 activations
    else:
        precision = same
    split = barrier if planted and change == "fusion" else same

    def step(w: jax.Array, x: jax.Array) -> jax.Array:
        if change == "dtype":
            x = jax.nn.softmax(precision(x), axis=-1)
        e = split(jnp.exp(x * 0.5))
        a = (e * 2.0 + 1.0).astype(jnp.float32)
        h = jnp.tanh(layout(a) @ w)
        return w - 1e-3 * jnp.mean(h, axis=0, keepdims=True) * w

    w = jax.random.normal(kw, (width, out), jnp.float32) / width**0.5
    x = jax.random.normal(kx, (batch, width), jnp.float32)
    return step, (w, x), {}


def run(logdir: str, change: str, steps: int = 8) -> tuple[Path, Path]:
    """Profile the program without, then with, the planted change; returns the two logdirs
    (`before`, `after`)."""
    if __package__:
        from ._common import run_profiled
    else:
        from _common import run_profiled

    out = []
    for planted in (False, True):
        target = Path(logdir) / ("after" if planted else "before")
        step, args, kwargs = _program(change, planted and change != "none")
        run_profiled(step, args, str(target), steps=steps, **kwargs)
        out.append(target)
    return out[0], out[1]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--logdir", required=True, help="writes DIR/before and DIR/after")
    parser.add_argument("--change", default="stall",
                        help=f"one of {', '.join(CHANGES)}, or several separated by commas "
                        "(each pair then goes to DIR/<change>/before and after)")
    parser.add_argument("--steps", type=int, default=8)
    ns = parser.parse_args(argv)
    changes = [c.strip() for c in ns.change.split(",") if c.strip()]
    unknown = sorted(set(changes) - set(CHANGES))
    if unknown or not changes:
        parser.error(f"unknown change(s) {', '.join(unknown) or '(none)'}: choose from "
                     f"{', '.join(CHANGES)}")
    n = max(devices_for(c) for c in changes)
    if n > 1 and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        # Before JAX starts: on CPU this splits the host into `n` virtual devices.
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_force_host_platform_device_count={n}").strip()
    for change in changes:
        run(str(Path(ns.logdir) / change) if len(changes) > 1 else ns.logdir, change,
            ns.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
