"""The async-overlap follow-up, computed during collection from lines the timeline pass has
decoded: xprof's own answer, field for field, given to the investigator without re-reading
the trace, and still counted against the four-call budget."""

from __future__ import annotations

import json
import random
import shutil
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from mldiag.analysis.collection.collect import collect
from mldiag.analysis.collection.profile_input import resolve_session
from mldiag.analysis.collection.xspace import async_overlap
from mldiag.analysis.collection.xspace import scan as xspace_scan
from mldiag.analysis.collection.xspace.scan import XSpaceScan
from mldiag.analysis.engine import investigate, precomputed_follow_ups
from mldiag.analysis.judgement.followups import ASYNC_OVERLAP, MAX_FOLLOW_UPS, FollowUps
from mldiag.analysis.judgement.triage import triage
from tests.helpers.fixtures import GPU_XPLANE as GPU
from tests.helpers.fixtures import TPU_XPLANE as TPU
from tests.helpers.fixtures import team_fixture


def _xprof(path: Path, **args: object) -> dict[str, object]:
    from xprof.cli.tools.analyze_async_overlap_tool import analyze_async_overlap

    out = json.loads(analyze_async_overlap(str(path), bypass_cache=True, **args))
    out.pop("session_id")
    return dict(out)


def _fixture(path: Path) -> Path:
    team_fixture(path)
    return path


@pytest.mark.parametrize("xplane", [TPU, GPU], ids=["tpu", "gpu"])
@pytest.mark.parametrize("top_k", [0, 3, 10, 5000])
@pytest.mark.parametrize("chunk", [None, 4096], ids=["lines", "chunks"])
def test_column_wise_equals_xprofs_own(xplane: Path, top_k: int, chunk: int | None,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    if chunk is not None:  # each line decoded a few KiB at a time
        monkeypatch.setattr(xspace_scan, "_CHAIN_BYTES", chunk)
    with XSpaceScan(_fixture(xplane)) as scan:
        ours = async_overlap.analyze_scans([("", scan)], top_k=top_k)
    assert ours == _xprof(xplane, top_k=top_k)


def test_hosts_are_labelled_and_never_merged_as_xprofs(tmp_path: Path) -> None:
    # Two hosts of one session: xprof labels them by file stem and keys by_plane per host.
    run = tmp_path / "plugins/profile/run1"
    run.mkdir(parents=True)
    shutil.copyfile(_fixture(TPU), run / "host_a.xplane.pb")
    shutil.copyfile(TPU, run / "host_b.xplane.pb")
    scans = [XSpaceScan(p) for p in sorted(run.glob("*.xplane.pb"))]
    try:
        ours = async_overlap.analyze_scans(
            [(p.name.removesuffix(".xplane.pb"), s) for p, s in zip(
                sorted(run.glob("*.xplane.pb")), scans, strict=True)], top_k=10)
    finally:
        for s in scans:
            s.close()
    theirs = _xprof(run, top_k=10)
    assert ours == theirs
    assert "host_b:/device:TPU:3" in ours["by_plane"]


def _fifo(keys: list[int], starts: list[bool]) -> tuple[list[int], list[int], int]:
    # xprof's pairing, written as it is: a queue of open starts per key.
    open_: dict[int, deque[int]] = {}
    s_out, d_out, unpaired = [], [], 0
    for i, (k, s) in enumerate(zip(keys, starts, strict=True)):
        if s:
            open_.setdefault(k, deque()).append(i)
        elif open_.get(k):
            s_out.append(open_[k].popleft())
            d_out.append(i)
        else:
            unpaired += 1
    return s_out, d_out, unpaired + sum(len(q) for q in open_.values())


def test_start_done_pairing_matches_a_queue_on_any_sequence() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randrange(0, 40)
        keys = [rng.randrange(3) for _ in range(n)]
        starts = [rng.random() < 0.5 for _ in range(n)]
        s_i, d_i, unpaired = async_overlap._pairs(np.array(keys, dtype=np.int64),
                                                  np.array(starts, dtype=bool))
        assert (s_i.tolist(), d_i.tolist(), unpaired) == _fifo(keys, starts)


def test_the_follow_up_on_the_tpu_fixture_is_answered_from_collection(tmp_path: Path) -> None:
    _fixture(TPU)
    session = resolve_session(TPU.parent)
    snapshot = collect(session)
    known = precomputed_follow_ups(snapshot)["analyze_async_overlap"]
    assert known["args"] == ASYNC_OVERLAP
    # Equal to running the follow-up itself, in a worker, on the same session.
    with FollowUps(session, max_calls=1) as direct:
        ran = direct.call("analyze_async_overlap", "direct", **ASYNC_OVERLAP)
    assert ran["status"] == "DATA" and "precomputed" not in ran
    assert known["data"] == ran["data"]
    # The investigator's own call takes it, at no cost but one of its four calls.
    out = investigate(snapshot, triage(snapshot), session=session)
    (call,) = [f for f in out["follow_ups"] if f["tool"] == "analyze_async_overlap"]
    assert call["precomputed"] and call["elapsed_ms"] == 0.0 and call["data"] == ran["data"]
    assert len(out["follow_ups"]) <= MAX_FOLLOW_UPS
    # The timeline pass's output does not carry it: the snapshot's own block does.
    assert "precomputed" not in snapshot["passes"]["mldiag.timeline"]["data"]


_NAMES = ("fusion.1", "%convolution.2 = f32[8] convolution(a, b)", "all-gather-start.1",
          "all-gather-done.1", "copy-start", "copy-done", "send.2", "send-done.2",
          "%all-reduce-start.3 = f32[8] all-reduce-start(x)", "all-reduce-done.3",
          "fusion.7.call-start", "fusion.7.call-done")


def _synthetic(path: Path, seed: int) -> None:
    """A TPU chip with its SparseCores: op lines with compute and async ops (some unpaired),
    and on one plane an Async XLA Ops line, at random times."""
    from mldiag.sdk.xspace import XSpace

    rng = random.Random(seed)
    space = XSpace()
    planes = [("/device:TPU:0", ("XLA Ops", "Sparse Core Ops", "Async XLA Ops")),
              ("/device:TPU:0 SparseCore 0", ("Sparse Core Ops",)),
              ("/device:TPU:0 SparseCore Foo 1", ("XLA Ops", "Steps")),
              ("/device:TPU:1", ("XLA Ops",))]
    for pid, (name, lines) in enumerate(planes):
        plane = space.planes.add(id=pid, name=name)
        for mid, n in enumerate(_NAMES, start=1):
            plane.event_metadata[mid].id = mid
            plane.event_metadata[mid].name = n
        for lid, line_name in enumerate(lines):
            line = plane.lines.add(id=lid, name=line_name, timestamp_ns=rng.randrange(10**6))
            for _ in range(rng.randrange(0, 60)):
                line.events.add(metadata_id=rng.randrange(1, len(_NAMES) + 1),
                                offset_ps=rng.randrange(10**9), duration_ps=rng.choice(
                                    [0, rng.randrange(1, 10**8), rng.randrange(10**6)]))
    path.write_bytes(space.SerializeToString())


@pytest.mark.parametrize("seed", range(8))
def test_column_wise_equals_xprofs_own_on_random_chips(
        tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    xplane = tmp_path / "chip.xplane.pb"
    _synthetic(xplane, seed)
    if seed % 2:  # each line decoded in chunks of a few events
        monkeypatch.setattr(xspace_scan, "_CHAIN_BYTES", 128)
    with XSpaceScan(xplane) as scan:
        ours = async_overlap.analyze_scans([("", scan)], top_k=7)
    assert ours == _xprof(xplane, top_k=7)
