"""A stand-in for vLLM's TPU worker (vllm-project/tpu-inference), as far as profiling goes.

It reads the variables the worker reads: with `USE_JAX_PROFILER_SERVER=True` it starts
`jax.profiler.start_server(JAX_PROFILER_SERVER_PORT)`; with `PHASED_PROFILING_DIR` it traces
one phase into `<dir>/<phase>/dp_rank_0/` and moves the capture up to
`<dir>/<phase>/plugins/profile/<ts>/`, as the worker's phased profiler does when a phase ends.
Then it "serves" (runs a jitted step in a loop) until `--stop-file` exists. Other arguments
(`serve MODEL --port=...`) are vLLM's and ignored.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import time
from pathlib import Path

import jax
import jax.numpy as jnp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop-file", required=True, type=Path)
    args, _vllm_args = parser.parse_known_args()
    if os.environ.get("USE_JAX_PROFILER_SERVER", "").lower() in ("1", "true"):
        jax.profiler.start_server(int(os.environ.get("JAX_PROFILER_SERVER_PORT", "9999")))
    step = jax.jit(lambda a: jnp.tanh(a @ a).sum())
    x = jnp.ones((256, 256))
    step(x).block_until_ready()  # the compile, before any phase is traced
    phased = os.environ.get("PHASED_PROFILING_DIR")
    if phased:
        phase_dir = Path(phased) / "decode_heavy"
        sandbox = phase_dir / "dp_rank_0"
        sandbox.mkdir(parents=True, exist_ok=True)
        (sandbox / "batch_composition_stats.json").write_text(json.dumps(
            {"batch_id": 7, "num_prefill_tokens": 0, "num_decode_tokens": 64}))
        jax.profiler.start_trace(str(sandbox))
        for i in range(5):
            with jax.profiler.StepTraceAnnotation("decode", step_num=i):
                step(x).block_until_ready()
        jax.profiler.stop_trace()
        ts = datetime.datetime.now().strftime("%Y_%m_%d_%H_%M_%S")
        dst = phase_dir / "plugins" / "profile" / ts
        dst.mkdir(parents=True, exist_ok=True)
        for src in (sandbox / "plugins" / "profile").glob("*/*.xplane.pb"):
            shutil.move(src, dst / src.name)
    while not args.stop_file.exists():
        step(x).block_until_ready()
        time.sleep(0.005)


if __name__ == "__main__":
    main()
