"""Collectives on a host's timeline: which ops are collectives, what each device spends in
them per step, and every collective execution kept for the cross-host pass
(`hosts/pod.py`): its step (by the step's own `step_num`), op, occurrence in the step, and
start and end averaged over the host's executors."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mldiag.analysis.collection.xspace.scan import XSpaceScan

# The most collective executions a host keeps for the cross-host pass; beyond it, every
# k-th step's (all of that step's), k the smallest that fits.
MAX_INSTANCES = 20_000


@dataclass
class CollectiveInstances:
    """Collective executions of one host, as columns: step index (into the host's steps),
    op name, occurrence of that op within the step, start and end (ns, the host's clock)."""

    step: NDArray[np.int64]
    op: list[str]
    occurrence: NDArray[np.int64]
    start_ns: NDArray[np.float64]
    end_ns: NDArray[np.float64]

    @classmethod
    def empty(cls) -> CollectiveInstances:
        return cls(np.zeros(0, np.int64), [], np.zeros(0, np.int64), np.zeros(0), np.zeros(0))

    def __len__(self) -> int:
        return len(self.step)

    def to_json(self) -> dict[str, Any]:
        names = sorted(set(self.op))
        index = {n: i for i, n in enumerate(names)}
        return {"ops": names, "rows": [
            [int(s), index[o], int(k), float(a), float(b)] for s, o, k, a, b in zip(
                self.step.tolist(), self.op, self.occurrence.tolist(), self.start_ns.tolist(),
                self.end_ns.tolist(), strict=True)]}

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> CollectiveInstances:
        if not d or not d.get("rows"):
            return cls.empty()
        rows = np.array([r[:5] for r in d["rows"]], dtype=np.float64)
        names = [str(n) for n in d["ops"]]
        return cls(rows[:, 0].astype(np.int64), [names[int(i)] for i in rows[:, 1]],
                   rows[:, 2].astype(np.int64), rows[:, 3], rows[:, 4])

    @classmethod
    def concat(cls, parts: list[CollectiveInstances]) -> CollectiveInstances:
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        return cls(np.concatenate([p.step for p in parts]), [o for p in parts for o in p.op],
                   np.concatenate([p.occurrence for p in parts]),
                   np.concatenate([p.start_ns for p in parts]),
                   np.concatenate([p.end_ns for p in parts]))


def step_numbers(scan: XSpaceScan, steps: NDArray[np.float64]) -> list[int]:
    """The step number (`step_num` stat) of the annotation each step starts with; -1 where
    the file holds none (a time window without the host's annotations)."""
    out = np.full(len(steps), -1, dtype=np.int64)
    if not len(steps):
        return []
    for plane, line in scan.passing((p, ln) for p in scan.planes
                                    if p.name.startswith("/host:") for ln in p.lines):
        stat = plane.stat_id("step_num")
        ev = line.events
        if stat is None or not len(ev):
            continue
        nums = scan.int_stat(ev, stat)
        has = (nums >= 0) & (ev.duration_ps > 0)
        if not has.any():
            continue
        starts = line.start_ns()[has]
        i = np.searchsorted(steps[:, 0], starts)
        ok = (i < len(steps)) & (steps[np.minimum(i, len(steps) - 1), 0] == starts)
        out[i[ok]] = np.maximum(out[i[ok]], nums[has][ok])
    return [int(n) for n in out.tolist()]


def instances(lines: list[tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int64]]],
               names: dict[int, str], steps: NDArray[np.float64],
               numbers: list[int]) -> CollectiveInstances:
    """The collective executions inside steps, one row per (step, op, occurrence in the
    step): each line's k-th execution of an op in a step is the same collective as every
    other line's k-th, and its start and end are their mean. Without steps, the whole
    capture is one (step index -1): the k-th execution of an op in it."""
    if not lines:
        return CollectiveInstances.empty()
    whole = not len(steps)
    if whole:
        steps = np.array([[-np.inf, np.inf]])
    cols: list[list[NDArray[Any]]] = [[], [], [], [], []]
    for start, end, ids in lines:
        i = np.searchsorted(steps[:, 0], start, side="right") - 1
        ok = (i >= 0) & (start < steps[np.maximum(i, 0), 1])
        start, end, ids, i = start[ok], end[ok], ids[ok], i[ok]
        order = np.lexsort((start, ids, i))
        start, end, ids, i = start[order], end[order], ids[order], i[order]
        first = np.ones(len(i), dtype=bool)
        first[1:] = (i[1:] != i[:-1]) | (ids[1:] != ids[:-1])
        at = np.arange(len(i))
        occurrence = at - np.maximum.accumulate(np.where(first, at, 0))
        for col, values in zip(cols, (i, ids, occurrence, start, end), strict=True):
            col.append(values)
    step, op, occ, start, end = (np.concatenate(c) for c in cols)
    if not len(step):
        return CollectiveInstances.empty()
    width = max(int(occ.max()) + 1, 1)
    ops = max(int(op.max()) + 1, 1)
    keys, inverse = np.unique((step * ops + op) * width + occ, return_inverse=True)
    count = np.bincount(inverse)
    mean_start = np.bincount(inverse, weights=start) / count
    mean_end = np.bincount(inverse, weights=end) / count
    k_step, rest = keys // (ops * width), keys % (ops * width)
    k_op, k_occ = rest // width, rest % width
    if len(keys) > MAX_INSTANCES:
        # Every k-th step by number (index without numbers), the same steps on every host.
        stride = -(-len(keys) // MAX_INSTANCES)
        label = k_occ if whole else np.array(
            [n if n >= 0 else i for i, n in enumerate(numbers)])[k_step]
        keep = label % stride == 0
        k_step, k_op, k_occ = k_step[keep], k_op[keep], k_occ[keep]
        mean_start, mean_end = mean_start[keep], mean_end[keep]
    return CollectiveInstances(k_step.astype(np.int64) - (1 if whole else 0),
                               [names[int(o)] for o in k_op], k_occ.astype(np.int64),
                               mean_start, mean_end)


_COLLECTIVE = re.compile(
    r"^(all[-_]gather|all[-_]reduce|reduce[-_]scatter|all[-_]to[-_]all|collective[-_]permute"
    r"|collective[-_]broadcast|ragged[-_]all[-_]to[-_]all"
    # Newer XLA names an instruction after the JAX primitive that made it (XLA:CPU:
    # `psum_invariant.7` for a psum's all-reduce).
    r"|psum|psum[-_]invariant|pmax|pmin|psum[-_]scatter|all[-_]gather[-_]invariant|ppermute"
    r"|pbroadcast)([-_](start|done))?(\.\d+)?$")


def is_collective(op: str) -> bool:
    """Whether an HLO op name is a collective (`all-gather.3`, `all_gather.3` on XLA:CPU,
    `all-reduce-start.1`, `psum_invariant.7`)."""
    return bool(_COLLECTIVE.match(op))


def summary(op_time: dict[tuple[str, str], float], op_lines: dict[tuple[str, str], int],
                 op_count: dict[tuple[str, str], int], host_steps: float,
                 host_step_ns: float) -> dict[str, Any] | None:
    """The collectives' time on the timeline, per executor: what each device spends in them
    per step, and that as a share of the step (None without steps or collectives)."""
    keys = [k for k in op_time if is_collective(k[1])]
    if not keys or not host_step_ns:
        return None
    per_exec = {k: op_time[k] / max(op_lines[k], 1) for k in keys}
    ops = sorted(keys, key=lambda k: (-per_exec[k], k))
    total = sum(per_exec.values())
    return {
        "method": "mldiag: collective ops on the timeline (device XLA Ops lines or XLA:CPU "
                  "executor threads), each op's time divided by the executors that ran it",
        "ms_per_step_per_executor": _round(total / 1e6 / max(host_steps, 1.0), 4),
        "percent_of_step": _round(100.0 * total / host_step_ns, 2),
        "ops": [{"op": k[1], "program_id": k[0], "executors": op_lines[k],
                 "count": op_count[k],
                 "ms_per_step_per_executor": _round(per_exec[k] / 1e6 / max(host_steps, 1.0),
                                                    4),
                 "percent_of_step": _round(100.0 * per_exec[k] / host_step_ns, 2)}
                for k in ops[:10]],
    }


def _round(x: float, nd: int = 3) -> float:
    return round(float(x), nd)
