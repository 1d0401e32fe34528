"""analysis.json `hosts` sections of any size, shaped as the cross-host pass writes them
(`collection/hosts/pod.py`): per-host rows worst first, stragglers, the collective split and
a heat map of at most 16 hosts and a summary row, at most 64 step columns, and the summary
row of the hosts beyond the first 16 (`per_host_rest`)."""

from __future__ import annotations

from typing import Any

SHOWN, COLUMNS = 16, 64


def pod_hosts(n_hosts: int, n_steps: int, *, straggler: int | None = 1,
              late_ms: float = 40.0, name: str = "host") -> dict[str, Any]:
    """A pod of `n_hosts` hosts over `n_steps` common steps; host `straggler` (None: none)
    arrives `late_ms` late at every step and the others wait for it."""
    names = [f"{name}{i}" for i in range(n_hosts)]
    late = {h: (late_ms if i == straggler else 0.01 * (i % 5) - 0.02)
            for i, h in enumerate(names)}
    order = sorted(names, key=lambda h: (-late[h], h))
    per_host = [{"host": h, "step_ms": 42.0 + 0.001 * i, "compute_ms": 0.3,
                 "host_wait_ms": late_ms + 1 if late[h] == late_ms else 1.0,
                 "collective_ms": 1.0 if late[h] == late_ms else late_ms + 1,
                 "collective_wait_ms": 0.0 if late[h] == late_ms else late_ms,
                 "collective_transfer_ms": 0.6, "lateness_ms": round(late[h], 3),
                 "straggler": late[h] == late_ms} for i, h in enumerate(order)]
    cols = min(COLUMNS, n_steps)
    bins = [(n_steps * c // cols, n_steps * (c + 1) // cols - 1) for c in range(cols)]
    labels = [f"{a}" if a == b else f"{a}-{b}" for a, b in bins]
    rows: list[dict[str, Any]] = [{"host": h, "lateness_ms": [late[h]] * cols,
             "wait_ms": [0.0 if late[h] == late_ms else late_ms] * cols}
            for h in order[:SHOWN]]
    rest = order[SHOWN:]
    if rest:
        rows.append({"host": f"{len(rest)} other hosts (median)",
                     "lateness_ms": [-0.01] * cols, "wait_ms": [late_ms] * cols,
                     "summary_of": len(rest)})
    stragglers = [] if straggler is None else [{
        "host": names[straggler], "lateness_ms_per_step": late_ms,
        "others_wait_ms_per_step": late_ms, "others_wait_percent_of_step": 95.0,
        "cause": "host wait", "cause_excess_ms_per_step": late_ms,
        "excess_ms_per_step": {"host wait": late_ms, "device compute": 0.0},
        "own": {"host_wait_ms": late_ms + 1, "compute_ms": 0.3, "step_ms": 42.0},
        "median_host": {"host_wait_ms": 1.0, "compute_ms": 0.3},
        "session_step_ms": 42.0, "session_step_ms_if_median": 2.0,
        "function": {"event": "$train.py:35 batch", "where": "train.py:35",
                     "excess_ms_per_step": late_ms, "ms_per_call": late_ms + 0.5,
                     "others_ms_per_call": 0.5}}]
    beyond = per_host[SHOWN:]
    per_host_rest = {"hosts": len(beyond), "stragglers": sum(r["straggler"] for r in beyond),
                     **{k: sorted(r[k] for r in beyond)[len(beyond) // 2] for k in (
                         "step_ms", "compute_ms", "host_wait_ms", "collective_ms",
                         "collective_wait_ms", "collective_transfer_ms", "lateness_ms")}
                     } if beyond else None
    return {
        **({"per_host_rest": per_host_rest} if per_host_rest else {}),
        "method": "mldiag: hosts' steps aligned by step number",
        "hosts": n_hosts, "common_steps": n_steps, "steps_matched_by": "step number",
        "step_ranges": [{"host": h, "steps": n_steps, "first": 0, "last": n_steps - 1}
                        for h in names],
        "hosts_with_other_steps": [],
        "clock_offsets_ms": {h: round(-0.5 * (i % 4), 4) for i, h in enumerate(names)},
        "median_step_ms": 42.0, "per_host": per_host,
        "collective_split": {"wait_ms_per_step": 30.0, "transfer_ms_per_step": 0.7,
                             "wait_percent": 97.7,
                             "ops": [{"op": "all-reduce.1", "instances": n_steps,
                                      "wait_ms": 30.0, "transfer_ms": 0.7,
                                      "wait_ms_by_host": {}, "wait_percent": 97.7}]},
        "straggler_test": {"rule": "median lateness >= max(0.5 ms, 5% of the median step)",
                           "min_steps": 5, "threshold_ms": 2.1, "hosts": []},
        "stragglers": stragglers,
        "heat_map": {"steps": labels, "rows": rows, "hosts_shown": min(SHOWN, n_hosts),
                     "hosts_summarised": len(rest)},
    }
