"""XProf's memory profile allocator by allocator (`mldiag.memory_allocators`): the capacity of
the allocator that holds the peak, as XProf's Memory Profile page shows it, beside
`xprof get_memory_profile`'s own summary, which pairs that peak with the largest allocator's
capacity (the GPU fixture's 64 GiB host allocator)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from mldiag.analysis.collection.collect import collect
from mldiag.analysis.collection.hosts import copies as host_copies
from mldiag.analysis.collection.hosts import memory_allocators
from mldiag.analysis.collection.profile_input import resolve_session
from mldiag.analysis.collection.xprof_tools import XprofWorkspace
from mldiag.analysis.judgement import evidence as ev


def _profile(logdir: Path) -> dict[str, Any]:
    session = resolve_session(logdir)
    with XprofWorkspace(session) as ws:
        return host_copies.peaks_memory_profile(ws, ws.run_dir / session.xplanes[0].name, None)


def test_the_gpu_capacity_is_the_peak_allocators_not_the_host_allocators(
        gpu_logdir: Path) -> None:
    got = _profile(gpu_logdir)
    # xprof's CLI, as it prints it: the GPU's peak against the host allocator's 64 GiB.
    assert got["memory_capacity_gib"] == 64.0 and got["peak_memory_usage_gib"] == 5.78
    found = got[memory_allocators.KEY]
    assert found["memory_ids"] == ["GPU_1_bfc", "GPU_4_bfc", "GPU_6_bfc", "gpu_host_bfc"]
    peak = found["peak"]
    assert found["peak_allocator"] == peak["memory_id"] == "GPU_6_bfc"
    assert peak["memory_capacity_bytes"] == 15477102400 and peak["memory_capacity_gib"] == 14.41
    assert peak["heap_allocated_bytes"] + peak["free_memory_bytes"] == 15477102400
    assert peak["capacity_is_stack_heap_free"] is True
    assert peak["utilization_percent"] == 40.12  # 6210111488 of 15477102400 bytes
    assert all(a["capacity_is_stack_heap_free"] for a in found["allocators"])
    host = next(a for a in found["allocators"] if a["memory_id"] == "gpu_host_bfc")
    assert host["memory_capacity_gib"] == 64.0
    assert found["cli_check"] == {
        "cli_memory_capacity_gib": 64.0, "peak_allocator_capacity_gib": 14.41,
        "capacity_agrees": False, "peak_stats_agree": True, "cli_capacity_of": ["gpu_host_bfc"]}


def test_the_tpu_fragmentation_is_each_allocators(tpu_logdir: Path) -> None:
    found = _profile(tpu_logdir)[memory_allocators.KEY]
    frag = {a["memory_id"]: a["fragmentation_percent"] for a in found["allocators"]}
    # The Memory Profile page opens on memory id 0 (0.00%); the CLI's 10.96% is id 1's (and
    # id 2's, which ties with it on the peak and on every figure the CLI prints).
    assert found["memory_ids"][0] == "0" and frag == {"0": 0.0, "1": 10.96, "2": 10.96,
                                                       "3": 0.0}
    assert found["peak_allocator"] == "1"
    assert found["cli_check"]["capacity_agrees"] is True
    assert found["cli_check"]["peak_stats_agree"] is True
    assert found["peak"]["memory_capacity_gib"] == 31.25


def test_a_large_hosts_peaks_copy_gives_the_same_allocators(
        gpu_logdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = _profile(gpu_logdir)
    logdir = tmp_path / "gpu"
    shutil.copytree(gpu_logdir, logdir)
    # Every host takes the large hosts' path: the converter reads the peak events alone.
    monkeypatch.setattr(host_copies, "PEAKS_MIN_BYTES", 0)
    copied = _profile(logdir)
    assert copied == whole


def test_collection_files_the_allocators_as_a_pass_beside_the_clis_output(
        gpu_logdir: Path) -> None:
    snap = collect(gpu_logdir)
    cli = snap["tools"]["get_memory_profile"]["data"]
    assert memory_allocators.KEY not in cli and cli["memory_capacity_gib"] == 64.0
    entry = snap["passes"][ev.MEMORY_ALLOCATORS]
    assert entry["status"] == "DATA" and entry["from"] == list(ev.PASSES[ev.MEMORY_ALLOCATORS])
    row = ev.cite(snap, ev.MEMORY_ALLOCATORS, "peak.memory_capacity_gib")
    assert row["value"] == 14.41 and row["from"]
    assert ev.get(snap, ev.MEMORY_ALLOCATORS, "cli_check.capacity_agrees") is False


def test_a_tie_of_peaks_picks_the_same_allocator_whatever_the_converters_order() -> None:
    def summary(cap: int, peak: int, frag: float) -> dict[str, Any]:
        return {"profileSummary": {"memoryCapacity": str(cap), "peakStats": {
            "peakBytesInUse": str(peak), "heapAllocatedBytes": str(peak),
            "freeMemoryBytes": str(cap - peak), "fragmentation": frag}}}

    per = {"b": summary(100, 60, 0.5), "a": summary(100, 60, 0.0), "host": summary(400, 1, 0.0)}
    ids = ["a", "b", "host"]
    one = memory_allocators.summarize({"memoryProfilePerAllocator": per, "memoryIds": ids})
    other = memory_allocators.summarize(
        {"memoryProfilePerAllocator": dict(reversed(per.items())), "memoryIds": ids})
    assert one == other and one is not None and one["peak_allocator"] == "a"
    assert memory_allocators.summarize({"memoryProfilePerAllocator": {}}) is None
