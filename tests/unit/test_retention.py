"""What a session keeps: superseded objects are marked, and `mldiag gc` deletes from a local
bucket what the GCS lifecycle would (mldiag.retention)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mldiag.adapters.local.storage import LocalDirStorage
from mldiag.cli.main import main
from mldiag.model import HostRecord, SessionRecord
from mldiag.retention import DAY, mark_superseded, superseded_names

SESSION = "r/plugins/profile/s"
NOW = 2_000_000_000.0


def _write(storage: LocalDirStorage, name: str, age_days: float = 0.0) -> str:
    storage.write_bytes(name, b"x" * 100)
    t = NOW - age_days * DAY
    os.utime(storage.root / name, (t, t))
    return name


def test_a_reported_version_supersedes_older_versions_and_its_own_windows(
        tmp_path: Path) -> None:
    storage = LocalDirStorage(tmp_path / "bucket")
    old = [_write(storage, f"{SESSION}/analysis/v1/{n}") for n in ("analysis.json", "op_stats.pb",
                                                                   "hosts/h0.json")]
    windows = [_write(storage, f"{SESSION}/analysis/v2/windows/window0.op_stats.pb")]
    kept = [_write(storage, f"{SESSION}/analysis/v2/analysis.json"),
            _write(storage, f"{SESSION}/analysis/v2/op_stats.pb"),
            _write(storage, f"{SESSION}/analysis/summary.html"),
            _write(storage, f"{SESSION}/analysis/v10/x.json"),  # not a lower version
            _write(storage, f"{SESSION}/analysis/vx/x.json"),
            _write(storage, f"{SESSION}/h0.xplane.pb")]
    assert sorted(superseded_names(storage, f"{SESSION}/analysis", 2)) == sorted(old + windows)
    s = SessionRecord(run="r", session="s", state="ANALYZING", version=2, hosts={
        "h0": HostRecord(f"{SESSION}/h0.xplane.pb", "1", 100, 0.0)})
    assert mark_superseded(storage, f"{SESSION}/analysis", s, NOW) == 4
    assert set(storage.superseded()) == set(old + windows)
    assert not set(storage.superseded()) & set(kept)


def test_gc_deletes_what_each_retention_no_longer_keeps(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import mldiag.cli.gc as gc

    home = tmp_path / "home"
    storage = LocalDirStorage(home / "bucket")
    cache_old = _write(storage, f"xprof-cache/{SESSION}/analysis/k1/manifest.json", 20)
    cache_new = _write(storage, f"xprof-cache/{SESSION}/analysis/k2/manifest.json", 1)
    profile_old = _write(storage, f"{SESSION}/h0.xplane.pb", 100)
    report_old = _write(storage, f"{SESSION}/analysis/summary.html", 100)
    v1 = _write(storage, f"{SESSION}/analysis/v1/analysis.json", 100)
    v2 = _write(storage, f"{SESSION}/analysis/v2/windows/w0.json", 100)
    storage.supersede(v1, NOW - 8 * DAY)
    storage.supersede(v2, NOW - 2 * DAY)
    monkeypatch.setattr(gc.time, "time", lambda: NOW)
    every = {cache_old, cache_new, profile_old, report_old, v1, v2}

    assert main(["gc", "--home", str(home), "--dry-run", "--profile-days", "90"]) == 0
    assert "would delete 1 viewer cache objects, 1 superseded objects, 1 profiles" in (
        capsys.readouterr().out)
    assert {o.name for o in storage.list("")} == every
    assert main(["gc", "--home", str(home)]) == 0  # the defaults: 14, 7, and profiles kept
    assert {o.name for o in storage.list("")} == every - {cache_old, v1}
    assert v1 not in storage.superseded() and v2 in storage.superseded()
    assert main(["gc", "--home", str(home), "--profile-days", "90", "--cache-days", "0"]) == 0
    assert {o.name for o in storage.list("")} == every - {cache_old, v1, profile_old}
    with pytest.raises(SystemExit, match="number of days"):
        main(["gc", "--home", str(home), "--cache-days", "-1"])


def test_the_caches_prefix_is_no_run_name():
    """`xprof-cache/` is the viewer caches' prefix, which the bucket's lifecycle empties: a run
    of that name would lose its profiles with the caches, so no run is named so."""
    from mldiag.model import RESERVED_RUN_NAMES, check_name, parse_object_name
    from mldiag.viewer_cache import CACHE_ROOT

    assert CACHE_ROOT in RESERVED_RUN_NAMES
    with pytest.raises(ValueError, match="reserved for the viewer caches"):
        check_name("run", CACHE_ROOT)
    assert check_name("session", CACHE_ROOT) == CACHE_ROOT
    with pytest.raises(ValueError, match="the viewer caches' prefix, not a run"):
        parse_object_name(f"{CACHE_ROOT}/plugins/profile/s1/host0.xplane.pb")
    with pytest.raises(ValueError, match="not a run"):
        parse_object_name(f"team/{CACHE_ROOT}/plugins/profile/s1/host0.xplane.pb")
