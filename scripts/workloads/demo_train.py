"""Demo training job instrumented with mldiag.sdk: healthy steps, then an input stall.

A two-layer MLP (batch 256, width 1024, batches prefetched onto the device) trains on CPU or
any JAX backend: a healthy step is device work. Every step records its STEP_TIME, so the SDK's
degradation monitor learns a baseline. Once the file named by ``--stall-flag`` exists, the
host-side batch reader starts sleeping ``--stall-ms`` per step (a slow disk or decoder), so
each step becomes mostly host time with the device idle. The monitor notices, the run's
auto-capture policy snapshots the continuous-profiling ring, and the analysis should name an
input-pipeline (host-bound) problem at P0.

    python scripts/workloads/demo_train.py --run demo-train --stall-flag /tmp/stall
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from mldiag.sdk import machinelearning_run, metrics
from mldiag.sdk.metric_types import MetricType

BATCH, WIDTH = 256, 1024
PREFETCHED = 8


def train_step(params: tuple[jax.Array, jax.Array], x: jax.Array,
               y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One SGD step of a two-layer MLP."""

    def loss(p: tuple[jax.Array, jax.Array]) -> jax.Array:
        h = jnp.tanh(x @ p[0])
        return jnp.mean((h @ p[1] - y) ** 2)

    grads = jax.grad(loss)(params)
    return params[0] - 1e-3 * grads[0], params[1] - 1e-3 * grads[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--run", default="demo-train")
    parser.add_argument("--stall-flag", required=True,
                        help="start the input stall once this file exists")
    # Four times the step: the wait share stays over 50% (P0) even on a loaded 2-core machine.
    parser.add_argument("--stall-ms", type=float, default=80.0)
    parser.add_argument("--max-seconds", type=float, default=170.0)
    parser.add_argument("--port", type=int, default=int(os.environ.get("MLDIAG_DEMO_PORT",
                                                                       "9999")))
    args = parser.parse_args(argv)
    # SIGTERM ends the loop like Ctrl-C, so the SDK closes the run (uploads, ring) at exit.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    run = machinelearning_run(
        name=args.run, run_group="demo", configs={"batch": BATCH, "width": WIDTH},
        on_demand_xprof=True, port=args.port, heartbeat_s=2.0,
        # The stall makes steps about 3.5x slower; alerting at 2x keeps a loaded machine's
        # noise (healthy steps 60% slower on a busy 2-core box) from raising the alert.
        monitor={"sustain_s": 4.0, "warmup": 10, "threshold": 1.0})
    print(f"demo_train: run {run.name} registered, target {run.host} "
          f"(profiler :{args.port}; mldiag's captures by pull)", flush=True)

    key = jax.random.key(0)
    params = (jax.random.normal(key, (WIDTH, WIDTH)) / WIDTH**0.5,
              jax.random.normal(key, (WIDTH, 16)) / WIDTH**0.5)
    step = jax.jit(train_step)
    rng = np.random.default_rng(0)
    # A healthy input pipeline: batches prepared ahead and already on the device, so a step
    # is all device work. The stall below is the reader falling behind.
    batches = [(jnp.asarray(rng.standard_normal((BATCH, WIDTH), dtype=np.float32)),
                jnp.asarray(rng.standard_normal((BATCH, 16), dtype=np.float32)))
               for _ in range(PREFETCHED)]
    flag = Path(args.stall_flag)
    stalled = False
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < args.max_seconds:
        t0 = time.perf_counter()
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            x, y = batches[i % PREFETCHED]
            if stalled:
                time.sleep(args.stall_ms / 1e3)  # the reader no longer keeps up
            params = jax.block_until_ready(step(params, x, y))
        metrics.record(MetricType.STEP_TIME, time.perf_counter() - t0, step=i)
        if not stalled and i % 20 == 0 and flag.exists():
            stalled = True
            print(f"demo_train: step {i}: input stall injected ({args.stall_ms:g} ms per "
                  "batch)", flush=True)
        i += 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
