"""XProf's memory profile allocator by allocator, as its Memory Profile page shows it.

`xprof get_memory_profile` prints one summary of xprof's memory profile converter
(`memory_profile.json`, what the XProf UI's Memory Profile page draws): its peak, and the
stack, heap, free memory and fragmentation at that peak, belong to the allocator with the
highest peak, but its `memory_capacity_gib` is the largest `memoryCapacity` of *any*
allocator. On a GPU trace the host's pinned-memory allocator (`gpu_host_bfc`, 64 GiB) is
the largest, so the CLI sets a GPU's 5.78 GiB peak against 64 GiB, while its own heap + free
at that peak is the GPU's 14.41 GiB, the capacity the page shows for that memory id.

`summarize` keeps, for every memory id, the figures the page shows (`profileSummary`:
`memoryCapacity`, `peakStats`, `peakStatsTimePs`), and names the allocator whose peak the CLI
prints (`peak_allocator`; on a tie of peaks, the first in the page's order). The capacity to
judge a peak against is that allocator's own; the result says whether it equals stack + heap
+ free at its peak (XProf defines it so) and whether the CLI printed it (`cli_check`).

Fragmentation is XProf's too: the page's "Fragmentation" of a memory id is its
`peakStats.fragmentation` (1 - the largest free chunk / all free memory, at that allocator's
peak). It differs between allocators (the TPU fixture's memory ids 1 and 2: 10.96%, the
CLI's figure; 0 and 3: 0.00%, and the page opens on 0), so each is kept with its memory id.

Only the peak's figures are kept: on a large host the converter reads a copy that holds each
allocator's peak event alone (`memory_peaks`), where they are the same as on the whole trace
(the lifetime peak, the timeline and the active allocations are not).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The snapshot's pass of these figures (`evidence.MEMORY_ALLOCATORS`) and the key that carries
# them, per host, beside the CLI's output until collection files them under that pass.
KEY = "xprof_allocators"
_GIB = 1024**3


def _int(value: Any) -> int | None:
    # The converter writes int64 fields as strings (protobuf JSON).
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _gib(value: int | None) -> float | None:
    # As the CLI rounds: GiB to 2 decimals.
    return round(value / _GIB, 2) if value is not None and value >= 0 else None


def allocator(memory_id: str, summary: Mapping[str, Any]) -> dict[str, Any]:
    """One memory id's figures as the Memory Profile page shows them: XProf's bytes (and
    fraction) verbatim, their GiB (and %) as the CLI rounds them, and the cross-check of its
    capacity against stack + heap + free at its peak."""
    peak = summary.get("peakStats") or {}
    capacity = _int(summary.get("memoryCapacity"))
    in_use = _int(peak.get("peakBytesInUse"))
    stack = _int(peak.get("stackReservedBytes"))
    heap = _int(peak.get("heapAllocatedBytes"))
    free = _int(peak.get("freeMemoryBytes"))
    raw_frag = peak.get("fragmentation")
    fragmentation = float(raw_frag) if isinstance(raw_frag, int | float) else 0.0
    parts = [stack, heap, free]
    summed = sum(p for p in parts if p is not None) if any(p is not None for p in parts) \
        else None
    return {
        "memory_id": memory_id,
        "memory_capacity_bytes": capacity,
        "peak_bytes_in_use": in_use,
        "stack_reserved_bytes": stack,
        "heap_allocated_bytes": heap,
        "free_memory_bytes": free,
        # Absent from the page's JSON when 0 (protobuf omits defaults): the page shows 0.00%.
        "fragmentation": fragmentation,
        "peak_stats_time_ps": _int(summary.get("peakStatsTimePs")),
        "memory_capacity_gib": _gib(capacity),
        "peak_memory_usage_gib": _gib(in_use),
        "stack_reservation_gib": _gib(stack),
        "heap_allocation_gib": _gib(heap),
        "free_memory_gib": _gib(free),
        "fragmentation_percent": round(100.0 * fragmentation, 2),
        "utilization_percent": round(100.0 * in_use / capacity, 2)
        if capacity and in_use is not None else None,
        # XProf's page: "Stack Reservation + Heap Allocation + Free Memory = Memory Capacity".
        "stack_heap_free_bytes": summed,
        "capacity_is_stack_heap_free": summed == capacity if summed is not None
        and capacity is not None else None,
    }


def summarize(raw: Mapping[str, Any], cli: Mapping[str, Any] | None = None
              ) -> dict[str, Any] | None:
    """The allocators of one memory profile (`memory_profile.json`, the converter's output)
    and the one whose peak `xprof get_memory_profile` prints (`cli`, its output, to check
    its capacity against); None when the profile has no allocator."""
    per = raw.get("memoryProfilePerAllocator")
    if not isinstance(per, Mapping) or not per:
        return None
    allocators = [allocator(str(k), (v or {}).get("profileSummary") or {})
                  for k, v in per.items() if isinstance(v, Mapping)]
    if not allocators:
        return None
    ids = [str(m) for m in raw.get("memoryIds") or []] or sorted(a["memory_id"]
                                                                 for a in allocators)
    order = {m: i for i, m in enumerate(ids)}
    allocators.sort(key=lambda a: (order.get(a["memory_id"], len(order)), a["memory_id"]))
    # The CLI's pick: the highest `peakBytesInUse` (a strict `>`). On a tie the CLI takes the
    # first in the converter's map, whose order changes from run to run; here the first in
    # the page's order, and `cli_check` says whether the CLI printed its figures.
    best: dict[str, Any] | None = None
    for a in allocators:
        if a["peak_bytes_in_use"] is not None and (
                best is None or a["peak_bytes_in_use"] > best["peak_bytes_in_use"]):
            best = a
    out: dict[str, Any] = {
        # The page's memory id menu, in its order; it opens on the first.
        "memory_ids": ids,
        "allocators": allocators,
        "peak_allocator": best["memory_id"] if best is not None else None,
        "peak": best,
    }
    if cli is not None and best is not None:
        out["cli_check"] = cli_check(cli, best, allocators)
    return out


def cli_check(cli: Mapping[str, Any], best: Mapping[str, Any],
              allocators: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether `xprof get_memory_profile`'s output is the peak allocator's: its capacity
    (the CLI prints the largest allocator's), and its peak's stack, heap, free memory and
    fragmentation (the CLI's own pick, which a tie can move to another allocator)."""
    stated = cli.get("memory_capacity_gib")
    cap = best["memory_capacity_gib"]
    agrees = isinstance(stated, int | float) and cap is not None and abs(
        float(stated) - cap) < 0.005
    details = cli.get("peak_usage_details") or {}
    pairs = (("peak_memory_usage_gib", cli.get("peak_memory_usage_gib")),
             *((k, details.get(k)) for k in ("stack_reservation_gib", "heap_allocation_gib",
                                              "free_memory_gib", "fragmentation_percent")))
    out: dict[str, Any] = {
        "cli_memory_capacity_gib": stated,
        "peak_allocator_capacity_gib": cap,
        "capacity_agrees": agrees,
        "peak_stats_agree": all(isinstance(v, int | float) and best[k] is not None
                                and abs(float(v) - float(best[k])) < 0.005
                                for k, v in pairs),
    }
    if not agrees and isinstance(stated, int | float):
        # Whose capacity the CLI printed: the largest of all the allocators'.
        out["cli_capacity_of"] = [a["memory_id"] for a in allocators
                                  if a["memory_capacity_gib"] is not None
                                  and abs(a["memory_capacity_gib"] - float(stated)) < 0.005]
    return out
