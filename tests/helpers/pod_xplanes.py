"""TPU-shaped multi-host sessions, written as real XSpace files, with a planted straggler.

Each host has a `/host:CPU` plane whose `python` line holds the step annotations (`train`,
with its `step_num`) and `devices` `/device:TPU:k` planes whose `XLA Ops` lines run, every
step, a fusion (the compute) and then an async all-reduce (`all-reduce-start`, then
`all-reduce-done` until the last host has arrived, plus the transfer). The hosts run in
lockstep on one global timeline, as a pod does; each writes its events on its own clock
(`clock_offset_ms`). A stretched host computes longer, arrives last, and the others' done
events wait for it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mldiag.sdk.xspace import XSpace


@dataclass
class PodShape:
    hosts: int = 4
    devices: int = 4
    steps: int = 20
    compute_ms: float = 8.0
    transfer_ms: float = 1.0
    prep_ms: float = 0.5
    # host index -> its compute stretched by this factor
    stretch: dict[int, float] = field(default_factory=dict)
    # every step, one random host computes this much longer (jitter, no straggler)
    jitter_ms: float = 0.0
    # host index -> the step numbers it has (a host that crashed mid-capture)
    step_range: dict[int, range] = field(default_factory=dict)
    clock_offset_ms: Sequence[float] = ()
    seed: int = 7
    # False: no step annotations (a job that never marks its steps)
    annotated: bool = True
    # every this many steps, every host computes this much longer (an evaluation step):
    # steps, or rounds, of very different lengths
    long_every: int = 0
    long_ms: float = 0.0
    # > 0: XLA:CPU hosts (no device planes) whose steps run on this many executor threads in
    # turn (`tf_XLAExecute/k` lines of the host plane), as XLA:CPU's pool hands them out
    cpu_threads: int = 0


def _plane(space: Any, name: str, pid: int) -> tuple[Any, dict[str, int], dict[str, int]]:
    plane = space.planes.add()
    plane.id, plane.name = pid, name
    return plane, {}, {}


def _meta(plane: Any, table: dict[str, int], name: str) -> int:
    if name not in table:
        table[name] = len(table) + 1
        plane.event_metadata[table[name]].id = table[name]
        plane.event_metadata[table[name]].name = name
    return table[name]


def _stat(plane: Any, table: dict[str, int], name: str) -> int:
    if name not in table:
        table[name] = len(table) + 1
        plane.stat_metadata[table[name]].id = table[name]
        plane.stat_metadata[table[name]].name = name
    return table[name]


def write_pod(session_dir: Path, shape: PodShape) -> list[Path]:
    """Write `shape.hosts` xplanes `host{i}.xplane.pb` into `session_dir`; their paths."""
    rng = random.Random(shape.seed)
    session_dir.mkdir(parents=True, exist_ok=True)
    offsets = list(shape.clock_offset_ms) or [rng.uniform(-50, 50) for _ in range(shape.hosts)]
    # Global timeline (ms): per step, each host's arrival at the all-reduce.
    t = 1.0
    timeline = []  # (step, start, arrivals[h], end_of_allreduce, end_of_step)
    for step in range(shape.steps):
        slow = rng.randrange(shape.hosts) if shape.jitter_ms else -1
        extra = shape.long_ms if shape.long_every and (step + 1) % shape.long_every == 0 else 0.0
        arrivals = [t + shape.prep_ms + extra + shape.compute_ms * shape.stretch.get(h, 1.0)
                    + (shape.jitter_ms if h == slow else 0.0) + rng.uniform(0, 0.05)
                    for h in range(shape.hosts)]
        done = max(arrivals) + shape.transfer_ms
        timeline.append((step, t, arrivals, done, done + 0.2))
        t = done + 0.4
    paths = []
    for h in range(shape.hosts):
        space = XSpace()
        steps = shape.step_range.get(h, range(shape.steps))
        off = offsets[h] - min(offsets)  # every event at a non-negative offset
        host, events, stats = _plane(space, "/host:CPU", 1)
        line = host.lines.add()
        line.id, line.name, line.timestamp_ns = 1, "python", 0
        train, num = _meta(host, events, "train"), _stat(host, stats, "step_num")
        for step, start, _, _, end in timeline:
            if step not in steps or not shape.annotated:
                continue
            e = line.events.add()
            e.metadata_id, e.offset_ps = train, int((start + off) * 1e9)
            e.duration_ps = int((end - start) * 1e9)
            s = e.stats.add()
            s.metadata_id, s.int64_value = num, step
        if shape.cpu_threads:
            threads = [host.lines.add() for _ in range(shape.cpu_threads)]
            for k, t_line in enumerate(threads):
                t_line.id, t_line.name, t_line.timestamp_ns = 10 + k, f"tf_XLAExecute/{k}", 0
            fusion = _meta(host, events, "ynn_fusion")
            reduce = _meta(host, events, "psum_invariant.7")
            for step, start, arrivals, done, _ in timeline:
                if step not in steps:
                    continue
                t_line = threads[step % shape.cpu_threads]
                for mid, t0, t1 in ((fusion, start + shape.prep_ms, arrivals[h]),
                                    (reduce, arrivals[h], done)):
                    e = t_line.events.add()
                    e.metadata_id, e.offset_ps = mid, int((t0 + off) * 1e9)
                    e.duration_ps = int((t1 - t0) * 1e9)
        for d in range(0 if shape.cpu_threads else shape.devices):
            dev, dev_events, _ = _plane(space, f"/device:TPU:{d}", 2 + d)
            ops = dev.lines.add()
            ops.id, ops.name, ops.timestamp_ns = 1, "XLA Ops", 0
            fusion = _meta(dev, dev_events, "%fusion.1 = bf16[8,1024]{1,0} fusion(p0, p1)")
            issue = _meta(dev, dev_events,
                          "%all-reduce-start.1 = bf16[1024]{0} all-reduce-start(f)")
            wait = _meta(dev, dev_events, "%all-reduce-done.1 = bf16[1024]{0} all-reduce-done(s)")
            for step, start, arrivals, done, _ in timeline:
                if step not in steps:
                    continue
                a = arrivals[h] + d * 0.01
                for mid, t0, t1 in ((fusion, start + shape.prep_ms, a), (issue, a, a + 0.01),
                                    (wait, a + 0.01, done)):
                    e = ops.events.add()
                    e.metadata_id, e.offset_ps = mid, int((t0 + off) * 1e9)
                    e.duration_ps = int((t1 - t0) * 1e9)
        path = session_dir / f"host{h}.xplane.pb"
        path.write_bytes(space.SerializeToString())
        paths.append(path)
    return paths
