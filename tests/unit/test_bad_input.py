"""Unreadable input gives a one-line reason and a non-zero exit, never a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mldiag.cli.main import main
from tests.helpers.fixtures import TPU_XPLANE as TPU
from tests.helpers.fixtures import team_fixture


def _session(tmp_path: Path, content: bytes) -> Path:
    d = tmp_path / "logdir" / "plugins" / "profile" / "s1"
    d.mkdir(parents=True)
    (d / "host0.xplane.pb").write_bytes(content)
    return tmp_path / "logdir"


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["analyze", "-q", *args])
    err = capsys.readouterr().err.strip()
    return code, err


def test_missing_path(tmp_path, capsys):
    code, err = _run(capsys, str(tmp_path / "nope"))
    assert code == 2
    assert "no such file or directory" in err and "Traceback" not in err
    assert len(err.splitlines()) == 1


def test_empty_xplane(tmp_path, capsys):
    code, err = _run(capsys, str(_session(tmp_path, b"")))
    assert code == 2 and "empty file (0 bytes)" in err and len(err.splitlines()) == 1


def test_not_an_xspace(tmp_path, capsys):
    code, err = _run(capsys, str(_session(tmp_path, b'{"this": "is json, not an XSpace"}' * 20)))
    assert code == 2 and "not" in err and "XSpace" in err and len(err.splitlines()) == 1


def test_truncated_xplane(tmp_path, capsys):
    team_fixture(TPU)
    code, err = _run(capsys, str(_session(tmp_path, TPU.read_bytes()[:20000])))
    assert code == 2 and "truncated or corrupt" in err and len(err.splitlines()) == 1


def test_directory_without_profiles(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, err = _run(capsys, str(tmp_path / "empty"))
    assert code == 2 and "no .xplane.pb files found" in err


def test_oversized_host_file_fails_with_reason(tmp_path):
    from mldiag.analysis.collection.profile_input import validate_xplane
    from mldiag.errors import ProfileUnreadable

    team_fixture(TPU)
    copy = tmp_path / "h.xplane.pb"
    shutil.copy(TPU, copy)
    with pytest.raises(ProfileUnreadable, match="exceeds the per-host cap"):
        validate_xplane(copy, max_bytes=1024)


def test_xspace_without_events(tmp_path, capsys):
    # A parseable XSpace with one empty plane: nothing was captured.
    code, err = _run(capsys, str(_session(tmp_path, b"\x0a\x00")))
    assert code == 2 and "no events" in err and len(err.splitlines()) == 1


def test_unwritable_output_is_one_line(tmp_path, capsys):
    team_fixture(TPU)
    logdir = _session(tmp_path, TPU.read_bytes())
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code, err = _run(capsys, str(logdir), "--out", str(blocker / "out"))
    assert code == 1 and "cannot write the report" in err and "Traceback" not in err
    assert len(err.splitlines()) == 1


def test_read_only_commands_on_a_home_without_state(tmp_path, capsys):
    home = tmp_path / "nowhere"
    assert main(["sessions", "--home", str(home), "list"]) == 1
    err = capsys.readouterr().err.strip()
    assert "no mldiag state in" in err and len(err.splitlines()) == 1
    assert not home.exists()


def test_a_session_over_the_memory_budget_says_so_in_one_line(tmp_path, capsys):
    team_fixture(TPU)
    code, err = _run(capsys, str(_session(tmp_path, TPU.read_bytes())), "--out",
                     str(tmp_path / "out"), "--memory-budget", "64M")
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("mldiag: too large: session of 0.8 MB (1 host(s)) needs about")
    assert "over the memory budget of 0.06 GiB" in err


def test_a_bad_memory_budget_variable_is_one_line(tmp_path, capsys, monkeypatch):
    team_fixture(TPU)
    monkeypatch.setenv("MLDIAG_MEMORY_BUDGET", "lots")
    code, err = _run(capsys, str(_session(tmp_path, TPU.read_bytes())), "--out",
                     str(tmp_path / "out"))
    assert code == 1 and err == ("mldiag: error: MLDIAG_MEMORY_BUDGET: not a size: 'lots' "
                                 "(use bytes or a K/M/G/T suffix)")
