"""`mldiag analyze LOGDIR` over several runs and sessions, and over folders without xplanes."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from mldiag.cli.main import main
from tests.helpers.fixtures import TPU_XPLANE as TPU
from tests.helpers.fixtures import team_fixture


def test_every_session_is_analysed_and_a_bad_one_fails_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    team_fixture(TPU)
    logdir = tmp_path / "logdir"
    for run, session in (("trainA", "2026_01_01_00_00_00"), ("trainB", "2026_01_02_00_00_00")):
        dest = logdir / run / "plugins/profile" / session / "host0.xplane.pb"
        dest.parent.mkdir(parents=True)
        shutil.copyfile(TPU, dest)
    # The newest-named session is corrupt.
    bad = logdir / "trainB/plugins/profile/2026_12_31_00_00_00/host0.xplane.pb"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"\x08\x96\x01 not an xspace" * 10)
    out = tmp_path / "out"
    code = main(["analyze", str(logdir), "--out", str(out), "-q"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 2  # after trying all
    assert sum(ln.startswith("NEEDS_ATTENTION  train") for ln in lines) == 2
    (failed,) = [ln for ln in lines if ln.startswith("FAILED")]
    assert "trainB/2026_12_31_00_00_00" in failed and "not a readable XSpace" in failed
    for run, session in (("trainA", "2026_01_01_00_00_00"), ("trainB", "2026_01_02_00_00_00")):
        assert (out / run / session / "summary.html").is_file()
    # --latest keeps the one-session behaviour: the newest (here, the bad one) alone.
    assert main(["analyze", str(logdir), "--out", str(tmp_path / "one"), "-q",
                 "--latest"]) == 2


def test_a_folder_of_trace_viewer_exports_is_named_with_how_to_get_an_xplane(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    session = tmp_path / "plugins/profile/s1"
    session.mkdir(parents=True)
    (session / "host0.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}'))
    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no .xplane.pb files found" in err and "host0.trace.json.gz" in err
    assert "jax.profiler.trace" in err
