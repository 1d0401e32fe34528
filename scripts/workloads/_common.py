"""Shared harness for the planted-bottleneck JAX workloads.

Each workload module defines ``run(logdir, steps)`` and calls :func:`main` from
``if __name__ == "__main__"``, so it runs as a script
(``python scripts/workloads/<name>.py --logdir DIR``) or in-process from tests.
The profile lands in the standard XProf layout:
``DIR/plugins/profile/<timestamp>/<host>.xplane.pb``.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax


def run_profiled(
    step_fn: Callable[..., Any],
    args: Sequence[Any],
    logdir: str,
    steps: int = 8,
    warmup: int = 2,
    host_work: Callable[[int], Any] | None = None,
    jit_kwargs: Mapping[str, Any] | None = None,
    step_markers: bool = True,
    setup: Callable[[], Any] | None = None,
) -> Any:
    """Jit ``step_fn``, warm it up, then run ``steps`` profiled steps into ``logdir``.

    ``host_work(i)``, when given, runs on the host at the start of every step, inside
    the step annotation, and its result (when not None) replaces ``args`` for that
    step; that is how a workload plants an input-pipeline stall. ``jit_kwargs`` go to
    ``jax.jit`` (shardings or layouts of the inputs). Each profiled step is a
    ``StepTraceAnnotation("train", step_num=i)`` and blocks on its results, so the
    ``train`` step events cover all of that step's device work; with
    ``step_markers=False`` the steps run bare, as a loop nobody annotated. ``setup()``,
    when given, runs once inside the trace before the first step (a one-off program such
    as weight init that the profile records but that is not part of any step).

    Returns the outputs of the last step.
    """
    jitted = jax.jit(step_fn, **(jit_kwargs or {}))
    current = tuple(args)
    out: Any = None
    for i in range(warmup):
        if host_work is not None:
            produced = host_work(i)
            if produced is not None:
                current = tuple(produced)
        out = jax.block_until_ready(jitted(*current))
    with jax.profiler.trace(logdir):
        if setup is not None:
            jax.block_until_ready(setup())
        for i in range(steps):
            marker = (jax.profiler.StepTraceAnnotation("train", step_num=i) if step_markers
                      else contextlib.nullcontext())
            with marker:
                if host_work is not None:
                    produced = host_work(i)
                    if produced is not None:
                        current = tuple(produced)
                out = jax.block_until_ready(jitted(*current))
    return out


def main(
    run: Callable[[str, int], None], description: str, argv: Sequence[str] | None = None
) -> int:
    """Parse ``--logdir DIR [--steps N]`` and call ``run(logdir, steps)``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--logdir", required=True, help="XProf logdir to write the trace into")
    parser.add_argument("--steps", type=int, default=8, help="number of profiled steps")
    ns = parser.parse_args(argv)
    if ns.steps < 1:
        parser.error("--steps must be at least 1")
    run(ns.logdir, ns.steps)
    return 0
