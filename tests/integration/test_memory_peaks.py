"""xprof's memory profile summary is the same from a host plane reduced to its allocators'
peak events (`memory_peaks.write_peaks`) as from the whole trace: the CLI tool's output on
the real fixtures, and every allocator's summary on hand-written allocator events with ties,
every kind of allocator id, and long lines read chunk by chunk."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from mldiag.analysis.collection.hosts import memory_peaks
from mldiag.analysis.collection.profile_input import resolve_session
from mldiag.analysis.collection.xprof_tools import XprofWorkspace
from mldiag.analysis.collection.xspace import scan as xspace_scan
from tests.helpers.fixtures import fixture_id, team_fixture, team_xplanes

FIXTURES = team_xplanes()


def _memory_profile(xplane: Path) -> dict[str, Any]:
    with XprofWorkspace(resolve_session(xplane.parent)) as ws:
        return ws.call("get_memory_profile")


def _peaks_copy(xplane: Path, tmp_path: Path) -> Path:
    out = tmp_path / "peaks" / "plugins" / "profile" / "run1" / xplane.name
    out.parent.mkdir(parents=True)
    memory_peaks.write_peaks(xplane, out)
    return out


@pytest.mark.parametrize("xplane", FIXTURES, ids=fixture_id)
def test_the_fixtures_memory_profile_from_their_peak_events(xplane: Path,
                                                           tmp_path: Path) -> None:
    team_fixture(xplane)
    whole = _memory_profile(xplane)
    assert whole["peak_memory_usage_gib"] > 0
    copy = _peaks_copy(xplane, tmp_path)
    assert copy.stat().st_size < xplane.stat().st_size / 4
    assert _memory_profile(copy) == whole


# Stat metadata ids of the hand-written host plane.
_INDEX, _ORDINAL, _NAME, _RESERVED, _ALLOCATED, _AVAILABLE, _FRAG, _PEAK = range(1, 9)
_STATS = {_INDEX: "index_on_host", _ORDINAL: "device_ordinal", _NAME: "allocator_name",
          _RESERVED: "bytes_reserved", _ALLOCATED: "bytes_allocated",
          _AVAILABLE: "bytes_available", _FRAG: "fragmentation", _PEAK: "peak_bytes_in_use",
          # Names that a reference value points at (an allocator named by reference).
          20: "GPU_0_bfc", 21: "gpu_host_bfc"}


def _allocator_events(path: Path, seed: int, events: int) -> None:
    """A host plane of allocations and deallocations over a few allocators named every way
    xprof reads them, with usages from a few values (many ties at each allocator's peak, on
    several lines) and a different free size and fragmentation on every event."""
    from mldiag.sdk.xspace import XSpace

    rng = random.Random(seed)
    space = XSpace()
    plane = space.planes.add(id=1, name=memory_peaks.HOST_PLANE)
    for k, name in _STATS.items():
        plane.stat_metadata[k].id = k
        plane.stat_metadata[k].name = name
    for k, name in ((1, "MemoryAllocation"), (2, "MemoryDeallocation"), (3, "other")):
        plane.event_metadata[k].id = k
        plane.event_metadata[k].name = name
    ids = [(_INDEX, "int", 0), (_INDEX, "int", 1), (_ORDINAL, "int", 1), (_NAME, "str", "big"),
           (_NAME, "ref", 20), (_NAME, "ref", 21), (_NAME, "int", 5)]
    for line_id in range(3):
        line = plane.lines.add(id=line_id, name=f"thread{line_id}", timestamp_ns=1000)
        for i in range(events):
            ev = line.events.add(metadata_id=rng.choice((1, 1, 2, 3)), offset_ps=i * 10,
                                 duration_ps=5)
            if ev.metadata_id == 3:
                continue
            chosen = rng.sample(ids, rng.choice((1, 1, 2)))  # two: the last one counts
            for stat_id, kind, value in chosen:
                stat = ev.stats.add(metadata_id=stat_id)
                if kind == "int":
                    stat.int64_value = value
                elif kind == "str":
                    stat.str_value = value
                else:
                    stat.ref_value = value
            reserved = ev.stats.add(metadata_id=_RESERVED)
            if rng.random() < 0.9:
                reserved.int64_value = rng.choice((0, 2**30, 2**31))
            else:  # xprof's `IntValue()` reads 0 from a uint64
                reserved.uint64_value = 2**32
            ev.stats.add(metadata_id=_ALLOCATED, int64_value=rng.choice((0, 2**29, 2**30)))
            ev.stats.add(metadata_id=_AVAILABLE, int64_value=rng.randrange(2**33))
            frag = ev.stats.add(metadata_id=_FRAG)
            if rng.random() < 0.5:
                frag.double_value = rng.random()
            else:
                frag.int64_value = 0
            ev.stats.add(metadata_id=_PEAK, int64_value=rng.randrange(2**34))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(space.SerializeToString())


def _per_allocator(xplane: Path) -> dict[str, Any]:
    """xprof's converter's own summary of each allocator (`memory_profile.json`), without
    the lifetime peak (the last event's stat, which the CLI tool does not print)."""
    import json

    from xprof.cli.internal.oss import xprof_client

    _, raw = xprof_client.get_client().fetch(
        tool_name="memory_profile.json", session_id=str(xplane.parent), format="json")
    allocators = json.loads(raw)["memoryProfilePerAllocator"]
    return {name: {k: v for k, v in a["profileSummary"].items()
                   if k != "peakBytesUsageLifetime"} for name, a in allocators.items()}


@pytest.mark.parametrize("seed", range(4))
def test_hand_written_allocators_peak_as_xprof_picks_them(
        seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    xplane = tmp_path / "trace" / "plugins" / "profile" / "run1" / "host.xplane.pb"
    _allocator_events(xplane, seed, 3000)
    whole = _memory_profile(xplane)
    assert whole["peak_memory_usage_gib"] == 3.0  # 2 GiB reserved, 1 GiB allocated
    # Lines chained a few KiB at a time: the peaks are found chunk by chunk.
    monkeypatch.setattr(xspace_scan, "_CHAIN_BYTES", 4096)
    copy = _peaks_copy(xplane, tmp_path)
    # Every allocator's peak, its stack, heap, free bytes, fragmentation, time and capacity.
    summaries = _per_allocator(xplane)
    assert len(summaries) == 6
    assert _per_allocator(copy) == summaries
    # The CLI tool's maxima. (Which allocator's details it prints when several reach the
    # same peak follows the converter's map order, which differs from run to run of xprof
    # on the same file.)
    reduced = _memory_profile(copy)
    for key in ("peak_memory_usage_gib", "memory_capacity_gib"):
        assert reduced[key] == whole[key]
    with xspace_scan.XSpaceScan(copy) as scan:
        kept = sum(len(line.events) for line in scan.planes[0].lines)
    assert kept == len(summaries)


@pytest.mark.parametrize("xplane", FIXTURES, ids=fixture_id)
def test_the_collection_s_memory_profile_is_the_tool_s_at_any_size(
        xplane: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`host_copies.peaks_memory_profile`, as the collection calls it: the tool on the file
    below `PEAKS_MIN_BYTES`, on the peak events' copy from it on; the same answer."""
    from mldiag.analysis.collection.hosts import copies as host_copies

    team_fixture(xplane)
    with XprofWorkspace(resolve_session(xplane.parent)) as ws:
        src = ws.run_dir / xplane.name
        direct = host_copies.peaks_memory_profile(ws, src, None)
        assert not ws.side_run_dir_path(host_copies.PEAKS_DIR).exists()
        monkeypatch.setattr(host_copies, "PEAKS_MIN_BYTES", 0)
        from_peaks = host_copies.peaks_memory_profile(ws, src, None)
        assert (ws.side_run_dir_path(host_copies.PEAKS_DIR) / xplane.name).is_file()
    assert from_peaks == direct and direct["peak_memory_usage_gib"] > 0
