"""One process of a multi-process JAX job using mldiag.sdk (run as N subprocesses on CPU).

    python multiprocess_workload.py --run R --coordinator HOST:PORT --processes N --index I
                                    --session S [--register-after S]

Every process joins the job with `jax.distributed.initialize` (a local coordinator on CPU),
registers the run under the machine's name (all N processes share $MLDIAG_HOST_NAME, as
processes on one machine share its host name), and captures a few steps with
`xprof(session_id=S)`. `--register-after` delays this process's registration, so that
another process starts the session before it is registered.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from mldiag.sdk import machinelearning_run, xprof


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--register-after", type=float, default=0.0)
    args = parser.parse_args()
    jax.distributed.initialize(coordinator_address=args.coordinator,
                               num_processes=args.processes, process_id=args.index,
                               initialization_timeout=120)
    time.sleep(args.register_after)
    run = machinelearning_run(name=args.run, heartbeat_s=1.0)
    print(f"registered {run.host} port {run.target.port}", flush=True)
    step = jax.jit(lambda w, x: w - 1e-3 * (x.T @ jnp.tanh(x @ w)))
    w = jnp.ones((128, 128)) / 128
    x = jnp.ones((32, 128))
    jax.block_until_ready(step(w, x))
    with xprof(session_id=args.session):
        for i in range(5):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                w = jax.block_until_ready(step(w, x))
    run.wait_uploads(timeout=120)
    print("uploaded", flush=True)
    run.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
