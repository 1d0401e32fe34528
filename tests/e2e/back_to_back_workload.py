"""A JAX job that captures two sessions back to back with mldiag.sdk (run as a subprocess).

    python back_to_back_workload.py --run R

Session `a` runs Python-heavy steps, so its trace is large and its upload is still running
when session `b` starts; `b`'s steps sleep 5 + 4 ms on the host (the workload's own host work)
and record their JAX loss with `metrics.record`. The SDK's work in `b` (the upload of `a`,
the loss conversions) is instrumentation, never the host work the analysis names.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from mldiag.sdk import machinelearning_run, metrics, xprof
from mldiag.sdk.metric_types import MetricType


@jax.jit
def step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    def loss(w: jax.Array) -> jax.Array:
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    value, grad = jax.value_and_grad(loss)(w)
    return w - 1e-3 * grad, value


def _python_work(n: int) -> int:
    return sum(i * 2 for i in range(n))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True)
    args = parser.parse_args()
    run = machinelearning_run(name=args.run)
    w, x = jnp.ones((512, 512)) / 512, jnp.ones((256, 512))
    w, value = step(w, x)
    value.block_until_ready()
    with xprof(session_id="a"):
        for i in range(5):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                _python_work(60_000)
                w, value = step(w, x)
                value.block_until_ready()
    with xprof(session_id="b"):
        for i in range(8):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                w, value = step(w, x)
                metrics.record(MetricType.LOSS, value, step=i)
                time.sleep(0.005)
                value.block_until_ready()
                # More of the step than the sleep, so the sleep stays shorter than a step
                # even on a loaded machine (a frame as long as a step is taken for the loop).
                time.sleep(0.004)
    run.wait_uploads(timeout=120)
    run.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
