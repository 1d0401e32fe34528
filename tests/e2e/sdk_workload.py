"""A JAX job that uses mldiag.sdk, for the capture tests (run as a subprocess).

    python sdk_workload.py --run R [--port P] [--no-server] [--programmatic SESSION]
                           [--seconds S] [--busy S] [--stream-at-exit]

It registers the run (host name from $MLDIAG_HOST_NAME), takes its capture requests by pull,
runs JAX's profiler server on `--port` unless `--no-server` (on_demand_xprof=False), and
trains a small jitted step until `--seconds` pass or it gets SIGTERM. With
`--programmatic SESSION` it also captures a few steps with `xprof(session_id=SESSION)`. With
`--busy S` its own `jax.profiler.start_trace` holds the profiler for the first S seconds (what
a user's `jax.profiler.trace` does), so remote captures meet a busy profiler. With
`--stream-at-exit` a hook that runs at exit before the run closes lists the run's targets (a
streaming read) until one fails, as the SDK's heartbeat or pull thread can when it fires as
the interpreter finalizes: on Firestore, gRPC can no longer start the thread a stream needs,
and the channel is left waiting on a call that never ends.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

import jax
import jax.numpy as jnp

from mldiag.sdk import machinelearning_run, metrics, xprof
from mldiag.sdk.metric_types import MetricType


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True)
    parser.add_argument("--port", type=int, default=9999)
    parser.add_argument("--programmatic", default="")
    parser.add_argument("--process-index-list", default="")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--busy", type=float, default=0.0)
    parser.add_argument("--no-server", action="store_true")
    parser.add_argument("--stream-at-exit", action="store_true")
    parser.add_argument("--wait-targets", type=int, default=1,
                        help="start the programmatic capture once this many targets are live "
                        "(what jax.distributed's start-up barrier gives a real multi-host job)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run = machinelearning_run(name=args.run, on_demand_xprof=not args.no_server,
                              port=args.port, heartbeat_s=1.0)
    if args.stream_at_exit:
        def stream() -> None:
            for _ in range(2):  # the first may still find gRPC's thread running
                try:
                    run.plane.state.list_targets(args.run)
                except RuntimeError as e:
                    print(f"stream at exit: {e}", flush=True)
                    return  # a next stream would wait forever
        # Exit hooks run last-registered first: this one before the run's close().
        threading._register_atexit(stream)  # type: ignore[attr-defined]
    busy_until = 0.0
    if args.busy:
        # In the run's home when there is one (a test's temp dir, gone with it on SIGKILL).
        busy_dir = tempfile.mkdtemp(prefix="busy-", dir=os.environ.get("MLDIAG_HOME"))
        atexit.register(shutil.rmtree, busy_dir, ignore_errors=True)  # SIGTERM exits via sys.exit
        jax.profiler.start_trace(busy_dir)
        busy_until = time.monotonic() + args.busy
    step = jax.jit(lambda w, x: w - 1e-3 * (x.T @ jnp.tanh(x @ w)))
    w = jnp.ones((256, 256)) / 256
    x = jnp.ones((64, 256))
    jax.block_until_ready(step(w, x))
    print("ready", flush=True)
    if args.programmatic:
        deadline = time.monotonic() + 60
        while len([t for t in run.plane.state.list_targets(args.run)
                   if time.time() - t.last_heartbeat < 30]) < args.wait_targets:
            if time.monotonic() > deadline:
                raise SystemExit("the other targets never registered")
            time.sleep(0.05)
        indices = [int(i) for i in args.process_index_list.split(",") if i] or None
        with xprof(process_index_list=indices, session_id=args.programmatic):
            for i in range(10):
                with jax.profiler.StepTraceAnnotation("train", step_num=i):
                    w = jax.block_until_ready(step(w, x))
        run.wait_uploads(timeout=60)
        print("uploaded", flush=True)
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < args.seconds:
        t0 = time.perf_counter()
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            w = jax.block_until_ready(step(w, x))
        metrics.record(MetricType.STEP_TIME, time.perf_counter() - t0)
        time.sleep(0.005)
        i += 1
        if busy_until and time.monotonic() > busy_until:
            jax.profiler.stop_trace()
            busy_until = 0.0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
