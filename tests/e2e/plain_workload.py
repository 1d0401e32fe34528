"""A JAX workload without the mldiag SDK: only `jax.profiler.start_server(PORT)`, as the
product's on-demand prerequisite, vLLM's TPU worker and torch_xla's start_server give.

python plain_workload.py --port PORT [--seconds S]; prints "ready" once the server is up.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=300.0)
    args = parser.parse_args()
    jax.profiler.start_server(args.port)

    @jax.jit
    def step(x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ x) / 8.0

    x = jnp.ones((256, 256))
    step(x).block_until_ready()
    print("ready", flush=True)
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        x = step(x)
        x.block_until_ready()
        time.sleep(0.005)


if __name__ == "__main__":
    main()
