"""One process of a planted data-parallel JAX job on CPU (run as N subprocesses).

    python pod_workload.py --coordinator HOST:PORT --processes N --index I --out SESSION_DIR
                           [--steps S] [--slow K] [--slow-input-ms MS] [--slow-compute X]
                           [--no-steps]

Every process joins the job with `jax.distributed.initialize` (gloo collectives on CPU) and
trains a jitted step on its shard of the batch: a matmul chain, then a cross-process sum
(`psum` in `shard_map`: an all-reduce of one scalar). Process K (`--slow`) waits MS longer
for its input before each step (`--slow-input-ms`), or runs its matmul X times
(`--slow-compute`). Each process profiles its steps with `jax.profiler` (Python tracer on)
and leaves its trace as `SESSION_DIR/host{I}.xplane.pb`: the hosts of one session. With
`--no-steps` the steps are not annotated (many jobs never mark them).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import tempfile
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--coordinator", required=True)
    p.add_argument("--processes", type=int, required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--slow", type=int, default=-1)
    p.add_argument("--slow-input-ms", type=float, default=0.0)
    p.add_argument("--slow-compute", type=int, default=1)
    p.add_argument("--no-steps", action="store_true", help="no step annotations")
    args = p.parse_args()
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.processes,
                               process_id=args.index, initialization_timeout=120)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()), ("d",))
    n = 256
    def local_step(w, x):
        for _ in range(args.slow_compute if args.index == args.slow else 1):
            x = jnp.tanh(x @ w)
        return jnp.sum(x)
    @jax.jit
    def step(w, x):
        loss = jax.shard_map(lambda w, x: jax.lax.psum(local_step(w, x), "d"), mesh=mesh,
                             in_specs=(P(), P("d")), out_specs=P())(w, x)
        return w - 1e-6 * loss
    w = jax.device_put(jnp.ones((n, n)) / n, NamedSharding(mesh, P()))
    def batch():
        if args.index == args.slow and args.slow_input_ms:
            time.sleep(args.slow_input_ms / 1e3)
        local = np.ones((64, n), np.float32)
        return jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local)
    w = jax.block_until_ready(step(w, batch()))
    tmp = tempfile.mkdtemp()
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 1
    jax.profiler.start_trace(tmp, profiler_options=options)
    for i in range(args.steps):
        if args.no_steps:
            w = jax.block_until_ready(step(w, batch()))
            continue
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            x = batch()
            w = jax.block_until_ready(step(w, x))
    jax.profiler.stop_trace()
    [f] = glob.glob(f"{tmp}/plugins/profile/*/*.xplane.pb")
    os.makedirs(args.out, exist_ok=True)
    shutil.move(f, os.path.join(args.out, f"host{args.index}.xplane.pb"))
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
