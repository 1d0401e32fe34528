"""The HLO protos written from a copy of the trace that holds only its metadata plane are
xprof's own, byte for byte: the follow-ups and the op_stats job no longer load every event of
a large host to write them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from xprof.cli.internal.oss import hlo_tools

from mldiag.analysis.collection.profile_input import resolve_session
from mldiag.analysis.collection.xprof_tools import XprofWorkspace
from tests.conftest import SHARED_FIXTURES


@pytest.mark.parametrize("fixture", ["tpu_inference_2", "gpu_multi_worker"])
def test_protos_from_the_metadata_plane_are_xprofs_own(fixture: str, tmp_path: Path) -> None:
    source = SHARED_FIXTURES / fixture
    if not source.is_dir():
        pytest.fail(f"real profile fixture {source} is absent", pytrace=False)
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
    assert ours and ours == theirs
