"""The session's hosts side by side: who makes the others wait at the collectives, and how much.

Every host of a data-parallel (or any SPMD) job ends its steps in collectives, and a
collective ends on every participant at the same instant: none can leave before the last
arrives. So from each host's own timeline (`xspace.timeline.HostTimeline`: its steps, their
numbers, and every collective execution inside them, `xspace.collectives`) this pass:

- **aligns the steps** by step number (by order when the annotations carry none): the steps
  every host has are compared, the others named;
- **aligns the clocks**: a host's offset is the median, over the collectives every host ran,
  of its end minus the first host's end (hosts' clocks differ by far more than a step);
- **splits collective time** into waiting and transfer: for each collective, a host waits
  from its arrival until the last participant arrives, and transfers from then on. An async
  pair's `-start` is its issue, not a rendezvous, and is left out;
- **finds stragglers**: a host's lateness at a step is the time between the others' median
  arrival and its own, summed over the step's collectives. A host is a straggler when its
  median lateness is at least `LATE_SHARE` of the median step (and `LATE_MIN_MS`), and it is
  late in more steps than chance would make it: a one-sided sign test over the common steps,
  at `ALPHA` split over the hosts (Bonferroni). Jitter makes a different host late each step
  and fails the test; a balanced job has no lateness to speak of;
- **says what it costs**: what the other hosts lose waiting per step, and the step time the
  session would have if the straggler were as fast as the median host (each step less the
  others' median wait in it);
- **names the cause on that host**: which of its own figures (host wait before the device
  works, or device compute) exceeds the median host's by most, and, with Python-tracer
  frames, the function whose time per step grew most, with its own per-call time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mldiag.analysis.collection.xspace.timeline import HostTimeline

# A straggler's median lateness is at least this share of the median step, and this many ms.
LATE_SHARE = 0.05
LATE_MIN_MS = 0.5
# The sign test's level, split over the hosts tested.
ALPHA = 0.01
# Fewer common steps than this: no straggler test (too few to tell from chance).
MIN_STEPS = 5
# A straggler's Python frame is named when it holds this share of its excess host wait.
FUNCTION_SHARE = 0.25
# Hosts shown one by one in the per-host table and the heat map; the rest are summarised.
SHOWN_HOSTS = 16
# Steps kept per host in the heat map (the rest are binned).
HEAT_STEPS = 64


def _r(x: float, nd: int = 3) -> float:
    return round(float(x), nd)


def _sign_test(late: int, steps: int) -> float:
    """One-sided p-value of `late` or more late steps out of `steps` at even odds (the
    binomial tail, summed in log space: thousands of steps stay exact enough and fast)."""
    if steps <= 0 or late > steps:
        return 1.0 if steps <= 0 else 0.0
    log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, steps + 1)))])
    k = np.arange(late, steps + 1)
    log_terms = log_fact[steps] - log_fact[k] - log_fact[steps - k] - steps * math.log(2.0)
    top = float(log_terms.max())
    return min(1.0, math.exp(top) * float(np.exp(log_terms - top).sum()))


def _median_of_others(a: NDArray[np.float64]) -> NDArray[np.float64]:
    """For every element of each row, the median of the row's other elements: from the
    row sorted once, skipping the element's own rank (O(n log n) a row, not O(n²))."""
    n = a.shape[1]
    if n < 2:
        return np.zeros_like(a)
    order = np.argsort(a, axis=1, kind="stable")
    srt = np.take_along_axis(a, order, axis=1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(n)[None, :].repeat(len(a), axis=0), axis=1)
    lo, hi = (n - 2) // 2, (n - 1) // 2  # the middle of n-1 values

    def at(p: int) -> NDArray[np.float64]:
        # Position p among the others is p in the sorted row before the element's own
        # rank, p + 1 from it on.
        return np.where(p < rank, srt[:, [p]], srt[:, [min(p + 1, n - 1)]])
    return (at(lo) + at(hi)) / 2.0


def _common_steps(hosts: Sequence[HostTimeline]) -> tuple[list[int], str, list[list[int]]]:
    """The step labels every host has, how they were matched, and each host's step indices
    for them."""
    numbered = all(len(h.step_numbers) == len(h.steps) and len(h.steps)
                   and min(h.step_numbers) >= 0 for h in hosts)
    if numbered:
        common = sorted(set.intersection(*(set(h.step_numbers) for h in hosts)))
        index = [{n: i for i, n in enumerate(h.step_numbers)} for h in hosts]
        return common, "step number", [[ix[n] for n in common] for ix in index]
    count = min(len(h.steps) for h in hosts)
    return list(range(count)), "order (the steps carry no step numbers)", [
        list(range(count)) for _ in hosts]


def _instance_table(hosts: Sequence[HostTimeline], picks: Sequence[Sequence[int]]
                    ) -> tuple[NDArray[np.int64], list[str], NDArray[np.float64],
                               NDArray[np.float64]]:
    """The collectives every host ran in the common steps: (common step position, op) per
    row, and (rows × hosts) start and end times on each host's own clock."""
    tables = []
    for h, pick in zip(hosts, picks, strict=True):
        position = {s: k for k, s in enumerate(pick)}
        ci = h.collective_instances
        rows = {}
        for s, op, occ, a, b in zip(ci.step.tolist(), ci.op, ci.occurrence.tolist(),
                                    ci.start_ns.tolist(), ci.end_ns.tolist(), strict=True):
            if s in position and not _is_issue(op):
                rows[(position[s], op, occ)] = (a, b)
        tables.append(rows)
    keys = sorted(set.intersection(*(set(t) for t in tables))) if tables else []
    start = np.array([[t[k][0] for t in tables] for k in keys]).reshape(len(keys), len(hosts))
    end = np.array([[t[k][1] for t in tables] for k in keys]).reshape(len(keys), len(hosts))
    return (np.array([k[0] for k in keys], dtype=np.int64), [k[1] for k in keys], start, end)


def _is_issue(op: str) -> bool:
    base = op.split(".")[0]
    return base.endswith(("-start", "_start"))


def cross_host(hosts: Sequence[HostTimeline],
               functions: Mapping[str, Sequence[Mapping[str, Any]]] | None = None
               ) -> dict[str, Any] | None:
    """The session's cross-host figures (None for fewer than two hosts to compare).

    Hosts are compared step by step when every host has annotated steps; when some have
    none, round by round, a round ending with each execution of the collective every host
    runs most (what a job without step annotations still has in common).
    `functions`: per host, Python-tracer rows (`aggregate_xplane_events` rows: event,
    count, total_duration_ps), to name the straggler's own slow function."""
    if len(hosts) < 2:
        return None
    frame = _by_steps(hosts) if all(len(h.steps) for h in hosts) else _by_rounds(hosts)
    if frame is None:
        return None
    out, stepped = frame.head, frame.hosts
    names = [h.host for h in stepped]
    n_hosts, n_steps = len(stepped), frame.step_ms.shape[1]
    if not n_steps:
        out["note"] = "the hosts have no step in common"
        return out
    step_ms, busy_ms, coll_ms = frame.step_ms, frame.busy_ms, frame.coll_ms
    compute_ms = np.maximum(busy_ms - coll_ms, 0.0)
    host_wait_ms = np.maximum(step_ms - busy_ms, 0.0)
    pos, ops, start, end = frame.pos, frame.ops, frame.start, frame.end
    wait_ms = np.zeros((n_hosts, n_steps))
    transfer_ms = np.zeros((n_hosts, n_steps))
    late_ms = np.zeros((n_hosts, n_steps))
    offsets = np.zeros(n_hosts)
    per_op: dict[str, dict[str, Any]] = {}
    if len(pos):
        offsets = np.median(end - end[:, :1], axis=0)
        a = start - offsets
        b = end - offsets
        last = a.max(axis=1, keepdims=True)
        w = np.clip(np.minimum(last, b) - a, 0.0, None) / 1e6
        t = np.clip(b - np.maximum(a, last), 0.0, None) / 1e6
        # Lateness: own arrival less the median of the others' (n-1 columns each).
        lt = (a - _median_of_others(a)) / 1e6
        for j in range(n_hosts):
            wait_ms[j] = np.bincount(pos, weights=w[:, j], minlength=n_steps)
            transfer_ms[j] = np.bincount(pos, weights=t[:, j], minlength=n_steps)
            late_ms[j] = np.bincount(pos, weights=lt[:, j], minlength=n_steps)
        for op in sorted(set(ops)):
            sel = np.array([o == op for o in ops])
            per_op[op] = {"op": op, "instances": int(sel.sum()),
                          "wait_ms": _r(float(w[sel].sum()) / n_hosts / n_steps, 4),
                          "transfer_ms": _r(float(t[sel].sum()) / n_hosts / n_steps, 4),
                          "wait_ms_by_host": {names[j]: _r(float(w[sel, j].sum()) / n_steps, 4)
                                              for j in range(n_hosts)}}
        for item in per_op.values():
            total = item["wait_ms"] + item["transfer_ms"]
            item["wait_percent"] = _r(100.0 * item["wait_ms"] / total, 1) if total else None
    out["clock_offsets_ms"] = {names[j]: _r(offsets[j] / 1e6, 4) for j in range(n_hosts)}
    out["collectives_matched"] = int(len(pos))
    median_step = float(np.median(step_ms))
    # Stragglers.
    threshold = max(LATE_MIN_MS, LATE_SHARE * median_step)
    level = ALPHA / n_hosts
    tests = []
    for j in range(n_hosts):
        late_steps = int((late_ms[j] > 0.5 * threshold).sum())
        p = _sign_test(late_steps, n_steps)
        median_late = float(np.median(late_ms[j]))
        tests.append({"host": names[j], "median_lateness_ms": _r(median_late),
                      "late_steps": late_steps, "p_value": float(f"{p:.3g}"),
                      "straggler": bool(len(pos) and n_steps >= MIN_STEPS
                                        and median_late >= threshold and p < level)})
    out["straggler_test"] = {
        "rule": f"median lateness >= max({LATE_MIN_MS} ms, {LATE_SHARE:.0%} of the median "
                f"step) = {threshold:.3g} ms, and late (> half that) in more steps than "
                f"chance: one-sided sign test p < {ALPHA}/{n_hosts}",
        "min_steps": MIN_STEPS, "threshold_ms": _r(threshold), "hosts": tests}
    stragglers = [j for j, t in enumerate(tests) if t["straggler"]]
    rest = [j for j in range(n_hosts) if j not in stragglers] or list(range(n_hosts))
    # Per host.
    per_host = []
    for j in range(n_hosts):
        per_host.append({
            "host": names[j],
            "step_ms": _r(float(np.median(step_ms[j]))),
            "compute_ms": _r(float(np.median(compute_ms[j]))),
            "host_wait_ms": _r(float(np.median(host_wait_ms[j]))),
            "collective_ms": _r(float(np.median(coll_ms[j]))),
            "collective_wait_ms": _r(float(np.median(wait_ms[j]))),
            "collective_transfer_ms": _r(float(np.median(transfer_ms[j]))),
            "lateness_ms": _r(float(np.median(late_ms[j]))),
            "straggler": j in stragglers,
        })
    out["per_host"] = sorted(per_host, key=lambda r: (-r["lateness_ms"], r["host"]))
    rest_rows = out["per_host"][SHOWN_HOSTS:]
    if rest_rows:
        # The hosts beyond the first SHOWN_HOSTS as one row: the median of each column.
        out["per_host_rest"] = {
            "hosts": len(rest_rows),
            "stragglers": sum(1 for r in rest_rows if r["straggler"]),
            **{k: _r(float(np.median([r[k] for r in rest_rows]))) for k in (
                "step_ms", "compute_ms", "host_wait_ms", "collective_ms",
                "collective_wait_ms", "collective_transfer_ms", "lateness_ms")}}
    total_wait = float(wait_ms.sum())
    total_coll = total_wait + float(transfer_ms.sum())
    out["collective_split"] = {
        "wait_ms_per_step": _r(total_wait / n_hosts / n_steps, 4),
        "transfer_ms_per_step": _r((total_coll - total_wait) / n_hosts / n_steps, 4),
        "wait_percent": _r(100.0 * total_wait / total_coll, 1) if total_coll else None,
        "ops": sorted(per_op.values(), key=lambda r: -(r["wait_ms"] + r["transfer_ms"]))[:10],
    }
    out["median_step_ms"] = _r(median_step)
    out["heat_map"] = _heat_map(names, frame.labels, late_ms, wait_ms, step_ms, out["per_host"])
    out["stragglers"] = [_straggler(j, stepped, names, rest, step_ms, compute_ms,
                                    host_wait_ms, wait_ms, late_ms, functions)
                         for j in stragglers]
    return out


@dataclass
class _Frame:
    """The hosts side by side, per compared unit (a step, or a collective round): what the
    rest of the pass reads whichever way the units were matched."""

    head: dict[str, Any]
    hosts: list[HostTimeline]
    labels: list[int]
    step_ms: NDArray[np.float64]
    busy_ms: NDArray[np.float64]
    coll_ms: NDArray[np.float64]
    pos: NDArray[np.int64]
    ops: list[str]
    start: NDArray[np.float64]
    end: NDArray[np.float64]


def _head(matched_by: str, hosts: int, units: int, unit: str) -> dict[str, Any]:
    return {"method": "mldiag: hosts' " + unit + "s aligned by " + matched_by + "; clocks "
            "aligned on the collectives' common end; a collective's wait is from a host's "
            "arrival to the last participant's, its transfer the rest",
            "hosts": hosts, "common_steps": units, "steps_matched_by": matched_by,
            "unit": unit}


def _by_steps(hosts: Sequence[HostTimeline]) -> _Frame:
    stepped = list(hosts)
    common, matched_by, picks = _common_steps(stepped)
    n_hosts, n_steps = len(stepped), len(common)
    ranges: list[dict[str, Any]] = [
        {"host": h.host, "steps": len(h.steps),
         "first": (h.step_numbers[0] if h.step_numbers else 0),
         "last": (h.step_numbers[-1] if h.step_numbers else len(h.steps) - 1)}
        for h in stepped]
    # The hosts whose steps differ from most hosts' (one that crashed mid-capture).
    counts = [r["steps"] for r in ranges]
    usual = max(set(counts), key=lambda c: (counts.count(c), c))
    partial = [str(r["host"]) for r in ranges if r["steps"] != usual]
    head = _head(matched_by, n_hosts, n_steps, "step") | {
        "step_ranges": ranges, "hosts_with_other_steps": partial}
    if n_steps and (partial or any(c != n_steps for c in counts)):
        head["note"] = (f"aligned on the {n_steps} steps every host has ({common[0]}-"
                        f"{common[-1]})" + (
                            f"; {', '.join(partial)} {'has' if len(partial) == 1 else 'have'} "
                            f"other steps than the other hosts' {usual}" if partial else ""))
    step_ms = np.zeros((n_hosts, n_steps))
    busy_ms = np.zeros((n_hosts, n_steps))
    coll_ms = np.zeros((n_hosts, n_steps))
    for j, (h, pick) in enumerate(zip(stepped, picks, strict=True)):
        ix = np.array(pick, dtype=np.int64)
        step_ms[j] = (h.steps[ix, 1] - h.steps[ix, 0]) / 1e6
        busy_ms[j] = h.busy_per_step_ns[ix] / 1e6 if len(h.busy_per_step_ns) else 0.0
        if len(h.collective_per_step_ns) == len(h.steps):
            coll_ms[j] = h.collective_per_step_ns[ix] / 1e6
    pos, ops, start, end = _instance_table(stepped, picks) if n_steps else (
        np.zeros(0, np.int64), [], np.zeros((0, n_hosts)), np.zeros((0, n_hosts)))
    return _Frame(head, stepped, list(common), step_ms, busy_ms, coll_ms, pos, ops, start,
                  end)


def _by_rounds(hosts: Sequence[HostTimeline]) -> _Frame | None:
    """Hosts without annotated steps, compared round by round: round k ends with the k-th
    execution of the marker (the collective every host runs most), and each host's
    collectives are matched by op and execution count over the whole capture. A host's
    compute and host wait in a round are its capture's shares of the round's length."""
    tables, kept, left = [], [], []
    for h in hosts:
        ci = h.collective_instances
        rows = {(op, int(k)): (float(a), float(b)) for op, k, a, b in zip(
            ci.op, ci.occurrence.tolist(), ci.start_ns.tolist(), ci.end_ns.tolist(),
            strict=True) if not _is_issue(op)}
        if rows:  # a host that ran no collective (a coordinator) is not compared
            tables.append(rows)
            kept.append(h)
        else:
            left.append(f"{h.host}: no step annotations and no collective in its capture")
    hosts = kept
    if len(hosts) < 2:
        return None
    counts: list[dict[str, int]] = []
    for rows in tables:
        c: dict[str, int] = {}
        for op, k in rows:
            c[op] = max(c.get(op, 0), k + 1)
        counts.append(c)
    shared = set.intersection(*(set(c) for c in counts))
    if not shared:
        return None
    marker = max(sorted(shared), key=lambda op: min(c[op] for c in counts))
    rounds = min(c[marker] for c in counts) - 1  # round k: after end k-1 until end k
    n_hosts = len(hosts)
    head = _head(f"collective rounds (no step annotations): round k ends with the k-th "
                 f"`{marker}`", n_hosts, max(rounds, 0), "round") | {
        "step_ranges": [{"host": h.host, "steps": c[marker] - 1, "first": 1,
                         "last": c[marker] - 1} for h, c in zip(hosts, counts, strict=True)],
        "hosts_with_other_steps": [], "marker": marker,
        **({"failed_hosts": left} if left else {})}
    if rounds < 1:
        return _Frame(head, list(hosts), [], *(np.zeros((n_hosts, 0)),) * 3,
                      np.zeros(0, np.int64), [], np.zeros((0, n_hosts)), np.zeros((0, n_hosts)))
    marks = np.array([[rows[(marker, k)][1] for k in range(rounds + 1)] for rows in tables])
    step_ms = np.diff(marks, axis=1) / 1e6
    busy_ms = np.zeros((n_hosts, rounds))
    coll_ms = np.zeros((n_hosts, rounds))
    for j, h in enumerate(hosts):
        # Each round gets the capture's shares of its own length: busy, and in collectives.
        span = max(h.active_span_ns, 1.0)
        busy_ms[j] = min(h.busy_in_span_ns / span, 1.0) * step_ms[j]
        coll_ms[j] = np.minimum(min(h.collective_busy_ns / span, 1.0) * step_ms[j], busy_ms[j])
    keys = sorted(set.intersection(*(set(t) for t in tables)))
    pos_l, ops, starts, ends = [], [], [], []
    for op, k in keys:
        b = [t[(op, k)][1] for t in tables]
        r = int(np.searchsorted(marks[0], b[0], side="left"))
        if not 1 <= r <= rounds:
            continue
        pos_l.append(r - 1)
        ops.append(op)
        starts.append([t[(op, k)][0] for t in tables])
        ends.append(b)
    return _Frame(head, list(hosts), list(range(1, rounds + 1)), step_ms, busy_ms, coll_ms,
                  np.array(pos_l, dtype=np.int64), ops,
                  np.array(starts).reshape(len(pos_l), n_hosts),
                  np.array(ends).reshape(len(pos_l), n_hosts))


def _straggler(j: int, hosts: Sequence[HostTimeline], names: list[str], rest: list[int],
               step_ms: NDArray[np.float64], compute_ms: NDArray[np.float64],
               host_wait_ms: NDArray[np.float64], wait_ms: NDArray[np.float64],
               late_ms: NDArray[np.float64],
               functions: Mapping[str, Sequence[Mapping[str, Any]]] | None) -> dict[str, Any]:
    others = [k for k in rest if k != j]
    n_steps = step_ms.shape[1]
    # What the others lose: their collective wait per step, and as a share of their step.
    lost = np.median(wait_ms[others], axis=0) if others else np.zeros(n_steps)
    lost_ms = float(np.median(lost))
    their_step = float(np.median(step_ms[others])) if others else float(np.median(step_ms))
    # The session's step if this host were as fast as the median host: every host's step
    # would lose the others' wait in it (the collectives would start when they arrive).
    session_step = np.median(step_ms, axis=0)
    without = np.maximum(session_step - lost, 0.0)
    cause_delta = {
        "host wait":
            float(np.median(host_wait_ms[j]) - np.median(host_wait_ms[others]))
            if others else 0.0,
        "device compute": float(np.median(compute_ms[j]) - np.median(compute_ms[others]))
        if others else 0.0,
    }
    cause = max(cause_delta, key=lambda k: cause_delta[k])
    out: dict[str, Any] = {
        "host": names[j],
        "lateness_ms_per_step": _r(float(np.median(late_ms[j]))),
        "others_wait_ms_per_step": _r(lost_ms),
        "others_wait_percent_of_step": _r(100.0 * lost_ms / their_step, 1)
        if their_step else None,
        "cause": cause,
        "cause_excess_ms_per_step": _r(cause_delta[cause]),
        "excess_ms_per_step": {k: _r(v) for k, v in cause_delta.items()},
        "own": {"host_wait_ms": _r(float(np.median(host_wait_ms[j]))),
                "compute_ms": _r(float(np.median(compute_ms[j]))),
                "step_ms": _r(float(np.median(step_ms[j])))},
        "median_host": {"host_wait_ms": _r(float(np.median(host_wait_ms[others])))
                        if others else None,
                        "compute_ms": _r(float(np.median(compute_ms[others])))
                        if others else None},
        "session_step_ms": _r(float(np.median(session_step))),
        "session_step_ms_if_median": _r(float(np.median(without))),
    }
    function = _slow_function(names[j], [names[k] for k in others], functions, n_steps,
                              {h.host: len(h.steps) for h in hosts})
    # A Python frame explains host wait only, and only one that holds a good part of it.
    if (function is not None and cause.startswith("host wait")
            and function["excess_ms_per_step"] >= FUNCTION_SHARE * cause_delta[cause]):
        out["function"] = function
    return out


def _slow_function(host: str, others: list[str],
                   functions: Mapping[str, Sequence[Mapping[str, Any]]] | None,
                   n_steps: int, steps: Mapping[str, int]) -> dict[str, Any] | None:
    """The Python frame whose time per step on `host` exceeds the other hosts' median by
    most, with its per-call time there and on them."""
    if not functions or host not in functions:
        return None

    def table(h: str) -> dict[str, tuple[float, int]]:
        # Frames with a file and line (`$file.py:12 fn`): what a fix can point at.
        return {str(r["event"]): (float(r.get("total_duration_ps") or 0.0) / 1e9,
                                  int(r.get("count") or 0))
                for r in functions.get(h, ()) if ".py:" in str(r.get("event", ""))}
    mine = table(host)
    paired = [(h, table(h)) for h in others if h in functions]
    theirs = [t for _, t in paired]
    best, best_gain = None, 0.0
    for event, (total, _calls) in mine.items():
        per_step = total / max(steps.get(host, n_steps), 1)
        other = [t.get(event, (0.0, 0))[0] / max(steps.get(h, n_steps), 1) for h, t in paired]
        gain = per_step - (float(np.median(other)) if other else 0.0)
        if gain > best_gain:
            best, best_gain = event, gain
    if best is None:
        return None
    total, calls = mine[best]
    other_calls = [t[best] for t in theirs if best in t and t[best][1]]
    return {"event": best, "where": best[1:].split(" ", 1)[0],
            "excess_ms_per_step": _r(best_gain),
            "ms_per_call": _r(total / calls) if calls else None,
            "others_ms_per_call": _r(float(np.median([t / c for t, c in other_calls])))
            if other_calls else None}


def _heat_map(names: list[str], common: list[int], late_ms: NDArray[np.float64],
              wait_ms: NDArray[np.float64], step_ms: NDArray[np.float64],
              per_host: list[dict[str, Any]]) -> dict[str, Any]:
    """Host × step lateness, worst hosts first; beyond SHOWN_HOSTS the rest as one row
    (their median), and beyond HEAT_STEPS steps binned (each bin's mean)."""
    order = [names.index(r["host"]) for r in per_host]
    shown = order[:SHOWN_HOSTS]
    rest = order[SHOWN_HOSTS:]
    bins = np.array_split(np.arange(len(common)), min(HEAT_STEPS, len(common)))

    def binned(row: NDArray[np.float64]) -> list[float]:
        return [_r(float(row[b].mean())) for b in bins]
    rows: list[dict[str, Any]] = [{"host": names[j], "lateness_ms": binned(late_ms[j]),
             "wait_ms": binned(wait_ms[j])} for j in shown]
    if rest:
        rows.append({"host": f"{len(rest)} other hosts (median)",
                     "lateness_ms": binned(np.median(late_ms[rest], axis=0)),
                     "wait_ms": binned(np.median(wait_ms[rest], axis=0)),
                     "summary_of": len(rest)})
    return {"steps": [f"{common[b[0]]}" if len(b) == 1 else f"{common[b[0]]}-{common[b[-1]]}"
                      for b in bins],
            "rows": rows, "hosts_shown": len(shown), "hosts_summarised": len(rest)}
