"""The HLO protos written from a copy of the trace that holds only its metadata plane are
xprof's own, byte for byte: the follow-ups and the op_stats job no longer load every event of
a large host to write them."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from xprof.cli.internal.oss import hlo_tools

from mldiag.analysis.collection.profile_input import resolve_session
from mldiag.analysis.collection.xprof_tools import XprofWorkspace
from tests.helpers.fixtures import SHARED_FIXTURES, team_fixture


@pytest.mark.parametrize("fixture", ["tpu_inference_2", "gpu_multi_worker"])
def test_protos_from_the_metadata_plane_are_xprofs_own(fixture: str, tmp_path: Path) -> None:
    source = SHARED_FIXTURES / fixture
    team_fixture(source)
    logdir = tmp_path / fixture
    shutil.copytree(source, logdir)
    session = resolve_session(logdir)
    with XprofWorkspace(session) as ws:
        ws.ensure_hlo_protos()
        ours = {p.name: p.read_bytes() for p in ws.run_dir.glob("*.hlo_proto.pb")}
        copy = ws.side_run_dir_path("hlo") / session.xplanes[0].name
        assert copy.stat().st_size < session.xplanes[0].stat().st_size / 2
    with XprofWorkspace(session) as ws:
        hlo_tools.generate_hlo_protos(str(ws.run_dir))
        theirs = {p.name: p.read_bytes() for p in ws.run_dir.glob("*.hlo_proto.pb")}
    assert ours and ours.keys() == theirs.keys()
    # The same messages; xprof writes map entries in hash order, which differs from one
    # writing to the next (seen: two entries of jit__psum's swapped), so they are compared as
    # decoded field trees with each message's fields in a canonical order.
    for name, blob in ours.items():
        assert _canonical(blob) == _canonical(theirs[name]), name


def _canonical(blob: bytes, depth: int = 0) -> Any:
    """A protobuf message as a sorted tuple of (field, value), length-delimited values that
    decode as messages decoded in turn; bytes that do not decode stay bytes."""
    from mldiag.analysis.collection.xspace.protobuf import CorruptProtobuf, fields

    try:
        items = list(fields(blob, 0, len(blob)))
    except (CorruptProtobuf, IndexError, ValueError):
        return blob
    out = []
    for num, wt, value, end in items:
        if wt == 2:
            inner = blob[value:end]
            out.append((num, _canonical(inner, depth + 1) if inner and depth < 64 else inner))
        elif wt in (1, 5):
            out.append((num, blob[value:end]))
        else:
            out.append((num, value))
    return tuple(sorted(out, key=repr))
