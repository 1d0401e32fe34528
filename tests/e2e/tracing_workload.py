"""A JAX workload that traces itself in a loop, as a user's own code does: a profiler server
(`jax.profiler.start_server(PORT)`) and `jax.profiler.start_trace`/`stop_trace` around a few
steps, again and again.

python tracing_workload.py --port PORT --logdir DIR [--seconds S]; prints "ready" once the
server is up, then one JSON line at the end: {"ok": N, "failed": N, "errors": [...]}.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    jax.profiler.start_server(args.port)

    @jax.jit
    def step(x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ x) / 8.0

    x = jnp.ones((128, 128))
    step(x).block_until_ready()
    print("ready", flush=True)
    ok, errors = 0, []
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        try:
            jax.profiler.start_trace(args.logdir)
            for _ in range(3):
                x = step(x)
            x.block_until_ready()
            jax.profiler.stop_trace()
            ok += 1
        except Exception as e:  # noqa: BLE001 - counted and reported: what the test checks
            errors.append(f"{type(e).__name__}: {e}"[:300])
        time.sleep(0.01)
    print(json.dumps({"ok": ok, "failed": len(errors), "errors": errors[:5]}), flush=True)


if __name__ == "__main__":
    main()
