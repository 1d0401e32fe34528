"""Benchmark: step-time overhead of continuous profiling (the SDK's ring buffer) on a jitted loop.

    python bench/continuous.py [--blocks 8] [--block-s 5] [--window-s 2] [--json OUT]

A small MLP training step (jitted forward, backward and SGD update on CPU) runs in one
process in alternating blocks: ring off, ring on, off, on... Each block runs for `--block-s`
seconds of steps, so an "on" block spans several windows, each with its stop and store.
Step times are pooled per mode; the overhead is the relative difference of the pooled median,
p90 and mean (the mean includes the steps that coincide with a window's stop). Because other
processes share the machine, it also reports the median over adjacent (off, ring) block pairs
of the median's overhead, and the process CPU time per step, which includes the ring's thread
and does not depend on what else runs.

Prints a table, then as the last line: overhead_median_pct=<..> overhead_mean_pct=<..>.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from mldiag.sdk.continuous import RingBuffer


def make_step(batch: int, width: int) -> tuple[Any, Any]:
    """A jitted SGD step of a 3-layer MLP, and its initial (params, batch)."""
    key = jax.random.PRNGKey(0)
    k1, k2, k3, kx, ky = jax.random.split(key, 5)
    scale = 1.0 / width**0.5
    params = {
        "w1": jax.random.normal(k1, (width, width)) * scale,
        "w2": jax.random.normal(k2, (width, width)) * scale,
        "w3": jax.random.normal(k3, (width, 10)) * scale,
    }
    x = jax.random.normal(kx, (batch, width))
    y = jax.nn.one_hot(jax.random.randint(ky, (batch,), 0, 10), 10)

    def loss(p: dict[str, Any], x: Any, y: Any) -> Any:
        h = jax.nn.relu(x @ p["w1"])
        h = jax.nn.relu(h @ p["w2"])
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(h @ p["w3"]) * y, axis=-1))

    @jax.jit
    def step(p: dict[str, Any], x: Any, y: Any) -> tuple[dict[str, Any], Any]:
        value, grads = jax.value_and_grad(loss)(p, x, y)
        return jax.tree_util.tree_map(lambda a, g: a - 0.01 * g, p, grads), value

    return step, (params, x, y)


def run_block(step: Any, state: list[Any], seconds: float, first: int) -> tuple[list[float], float]:
    """Step for `seconds`; returns each step's wall time in ms, and the process CPU seconds."""
    times = []
    cpu = time.process_time()
    params, x, y = state
    end = time.perf_counter() + seconds
    i = first
    while time.perf_counter() < end:
        t = time.perf_counter()
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            params, value = step(params, x, y)
            value.block_until_ready()
        times.append((time.perf_counter() - t) * 1000.0)
        i += 1
    state[0] = params
    return times, time.process_time() - cpu


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def _stats(values: list[float]) -> dict[str, float]:
    return {"steps": len(values), "median_ms": statistics.median(values),
            "p90_ms": _p90(values), "mean_ms": statistics.fmean(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=8, help="blocks per mode (alternated)")
    parser.add_argument("--block-s", type=float, default=5.0, help="seconds per block")
    parser.add_argument("--window-s", type=float, default=2.0, help="ring window")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    step, init = make_step(args.batch, args.width)
    state = list(init)
    run_block(step, state, 2.0, 0)  # compile and warm up
    samples: dict[str, list[float]] = {"off": [], "ring": []}
    cpu_s: dict[str, float] = {"off": 0.0, "ring": 0.0}
    block_medians: dict[str, list[float]] = {"off": [], "ring": []}
    ring_status: list[dict[str, Any]] = []
    steps = 0
    with tempfile.TemporaryDirectory(prefix="bench-ring-") as tmp:
        ring = RingBuffer(tmp_root=tmp)
        for _ in range(args.blocks):
            for mode in ("off", "ring"):
                if mode == "ring":
                    ring.start(window_s=args.window_s)
                times, cpu = run_block(step, state, args.block_s, steps)
                steps += len(times)
                samples[mode].extend(times)
                cpu_s[mode] += cpu
                block_medians[mode].append(statistics.median(times))
                if mode == "ring":
                    ring_status.append(ring.status())
                    ring.stop()

    off, on = _stats(samples["off"]), _stats(samples["ring"])
    overhead = {k: (on[k] / off[k] - 1.0) * 100.0 for k in ("median_ms", "p90_ms", "mean_ms")}
    pairs = [(r / o - 1.0) * 100.0 for o, r in zip(block_medians["off"], block_medians["ring"],
                                                   strict=True)]
    overhead["paired_median_ms"] = statistics.median(pairs)
    for mode, s in (("off", off), ("ring", on)):
        s["cpu_ms_per_step"] = cpu_s[mode] * 1000.0 / s["steps"]
    overhead["cpu_ms_per_step"] = (on["cpu_ms_per_step"] / off["cpu_ms_per_step"] - 1.0) * 100.0
    windows = sum(s["windows"] + s["evicted_windows"] for s in ring_status)
    window_bytes = sum(s["bytes"] for s in ring_status) / max(
        1, sum(s["windows"] for s in ring_status))
    result = {
        "cores": os.cpu_count(), "python": sys.version.split()[0], "jax": jax.__version__,
        "backend": jax.default_backend(), "batch": args.batch, "width": args.width,
        "blocks_per_mode": args.blocks, "block_s": args.block_s, "window_s": args.window_s,
        "off": off, "ring": on, "overhead_pct": overhead, "windows_recorded": windows,
        "mean_window_bytes": window_bytes,
    }
    print(f"jax {jax.__version__} on {jax.default_backend()}, {os.cpu_count()} cores; "
          f"MLP batch {args.batch} width {args.width}; {args.blocks} blocks of "
          f"{args.block_s:g} s per mode, alternated; ring window {args.window_s:g} s")
    print(f"{'mode':<8}{'steps':>8}{'median ms':>12}{'p90 ms':>10}{'mean ms':>10}"
          f"{'CPU ms/step':>13}")
    for name, s in (("off", off), ("ring", on)):
        print(f"{name:<8}{s['steps']:>8}{s['median_ms']:>12.3f}{s['p90_ms']:>10.3f}"
              f"{s['mean_ms']:>10.3f}{s['cpu_ms_per_step']:>13.3f}")
    print(f"{'overhead':<8}{'':>8}{overhead['median_ms']:>11.1f}%{overhead['p90_ms']:>9.1f}%"
          f"{overhead['mean_ms']:>9.1f}%{overhead['cpu_ms_per_step']:>12.1f}%")
    print("median overhead per adjacent block pair: "
          + ", ".join(f"{p:+.1f}%" for p in pairs)
          + f" (median {overhead['paired_median_ms']:+.1f}%)")
    print(f"windows recorded: {windows}, mean window size {window_bytes / 1e6:.2f} MB")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(f"overhead_median_pct={overhead['median_ms']:.1f} "
          f"overhead_mean_pct={overhead['mean_ms']:.1f} "
          f"overhead_cpu_pct={overhead['cpu_ms_per_step']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
