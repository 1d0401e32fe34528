"""One process of a multi-process JAX job using mldiag.sdk (run as N subprocesses on CPU).

    python multiprocess_workload.py --run R --coordinator HOST:PORT --processes N --index I
                                    --session S [--start-delay S] [--start-after FILE]
                                    [--stopped FILE]

Every process joins the job with `jax.distributed.initialize` (a local coordinator on CPU,
jax's default shutdown barrier at exit), registers the run under the machine's name (all N
processes share $MLDIAG_HOST_NAME, as processes on one machine share its host name), and
captures a few steps with `xprof(session_id=S)`. `--start-after` waits for FILE before
`start()` (another process's `--stopped` marker, written once it stopped capturing and
closed its run), then `--start-delay` seconds more. It prints how long `start()` and `stop()`
took on its training thread: `timings {"start_s": ..., "stop_s": ...}`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

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
    parser.add_argument("--start-delay", type=float, default=0.0)
    parser.add_argument("--start-after", type=Path)
    parser.add_argument("--stopped", type=Path)
    args = parser.parse_args()
    jax.distributed.initialize(coordinator_address=args.coordinator,
                               num_processes=args.processes, process_id=args.index,
                               initialization_timeout=120)
    run = machinelearning_run(name=args.run, heartbeat_s=1.0)
    print(f"registered {run.host} port {run.target.port}", flush=True)
    step = jax.jit(lambda w, x: w - 1e-3 * (x.T @ jnp.tanh(x @ w)))
    w = jnp.ones((128, 128)) / 128
    x = jnp.ones((32, 128))
    jax.block_until_ready(step(w, x))
    if args.start_after is not None:
        deadline = time.monotonic() + 120
        while not args.start_after.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"{args.start_after} never appeared")
            time.sleep(0.05)
    time.sleep(args.start_delay)
    prof = xprof(session_id=args.session)
    started = time.monotonic()
    prof.start()
    start_s = time.monotonic() - started
    for i in range(5):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            w = jax.block_until_ready(step(w, x))
    started = time.monotonic()
    prof.stop()
    stop_s = time.monotonic() - started
    print("timings " + json.dumps({"start_s": start_s, "stop_s": stop_s}), flush=True)
    run.wait_uploads(timeout=120)
    print("uploaded", flush=True)
    run.close()  # its target is no longer live: a late process must not wait for it
    if args.stopped is not None:
        args.stopped.write_text("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
