"""Two pods host by host: each host's step, lateness and waits before and after, and the
stragglers that appeared or went away (diff.json's `hosts`).

Both sides' figures are their analysis.json `hosts` sections as the cross-host pass wrote
them (each host's median over its session's common steps); only the deltas are computed here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Each host's figures compared, from the sides' `hosts.per_host` rows.
FIGURES = ("step_ms", "lateness_ms", "host_wait_ms", "collective_wait_ms",
           "collective_transfer_ms", "compute_ms")


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _rows(hosts: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(r["host"]): r for r in hosts.get("per_host") or ()
            if isinstance(r, Mapping) and r.get("host") is not None}


def _stragglers(hosts: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(s["host"]): s for s in hosts.get("stragglers") or ()
            if isinstance(s, Mapping) and s.get("host") is not None}


def _side(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {**{k: _number(row.get(k)) for k in FIGURES}, "straggler": bool(row.get("straggler"))}


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(b - a, 3)


def _straggler_line(s: Mapping[str, Any]) -> dict[str, Any]:
    return {"host": str(s.get("host")), "lateness_ms_per_step": s.get("lateness_ms_per_step"),
            "others_wait_percent_of_step": s.get("others_wait_percent_of_step"),
            "cause": s.get("cause")}


def host_diff(a: object, b: object) -> dict[str, Any] | None:
    """diff.json's `hosts` block for two analysis.json `hosts` sections, or None unless both
    sides have one.

    `rows`: one per host of either side, `a` and `b` its figures (None on the side it is not
    on) and `delta` (B − A); stragglers of either side first, then the largest change in
    lateness or step. `stragglers`: `appeared` (in B, not A), `went_away` (in A, not B) and
    `stayed`, each with the side's own lateness, others' wait and cause."""
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        return None
    if not a.get("per_host") or not b.get("per_host"):
        return None
    rows_a, rows_b = _rows(a), _rows(b)
    rows = []
    for host in list(rows_a) + [h for h in rows_b if h not in rows_a]:
        sa, sb = _side(rows_a.get(host)), _side(rows_b.get(host))
        rows.append({
            "host": host, "on": "both" if sa and sb else "A only" if sa else "B only",
            "a": sa, "b": sb,
            "delta": {k: _delta((sa or {}).get(k), (sb or {}).get(k)) for k in FIGURES}})

    def order(row: Mapping[str, Any]) -> tuple[bool, float, str]:
        straggler = bool((row["a"] or {}).get("straggler") or (row["b"] or {}).get("straggler"))
        change = max(abs(row["delta"]["lateness_ms"] or 0.0), abs(row["delta"]["step_ms"] or 0.0))
        return (not straggler, -change, row["host"])
    rows.sort(key=order)
    st_a, st_b = _stragglers(a), _stragglers(b)
    return {
        "hosts": {"a": a.get("hosts"), "b": b.get("hosts")},
        "common_steps": {"a": a.get("common_steps"), "b": b.get("common_steps")},
        "median_step_ms": {"a": a.get("median_step_ms"), "b": b.get("median_step_ms")},
        "collective_wait_percent": {
            "a": (a.get("collective_split") or {}).get("wait_percent"),
            "b": (b.get("collective_split") or {}).get("wait_percent")},
        "stragglers": {
            "appeared": [_straggler_line(st_b[h]) for h in st_b if h not in st_a],
            "went_away": [_straggler_line(st_a[h]) for h in st_a if h not in st_b],
            "stayed": [{"host": h, "a": _straggler_line(st_a[h]), "b": _straggler_line(st_b[h])}
                       for h in st_a if h in st_b]},
        "rows": rows,
    }


def sentence(block: Mapping[str, Any]) -> str:
    """What the stragglers did, for the diff's headline: "" when none came or went."""
    said = []
    for key, verb in (("appeared", "appeared"), ("went_away", "went away")):
        gone = block.get("stragglers", {}).get(key) or []
        if gone:
            named = ", ".join(f"{s['host']} ({s['lateness_ms_per_step']} ms late per step)"
                              if key == "appeared" else str(s["host"]) for s in gone)
            said.append(f"straggler {named} {verb}" if len(gone) == 1
                        else f"stragglers {named} {verb}")
    if not said:
        return ""
    text = " and ".join(said)
    return text[0].upper() + text[1:] + "."
