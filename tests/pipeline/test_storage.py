"""LocalDirStorage and DirectoryWatcher: finalize events, half-written files, unsafe names."""

from __future__ import annotations

from pathlib import Path

import pytest

from mldiag.adapters.local.storage import DirectoryWatcher, LocalDirStorage
from mldiag.model import parse_object_name
from mldiag.ports import ObjectInfo

NAME = "run/plugins/profile/s1/host0.xplane.pb"


@pytest.fixture
def events() -> list[ObjectInfo]:
    return []


@pytest.fixture
def storage(tmp_path: Path, events: list[ObjectInfo]) -> LocalDirStorage:
    return LocalDirStorage(tmp_path / "bucket", on_finalize=events.append)


def test_writes_through_the_port_are_atomic_and_emit_one_event(
        storage: LocalDirStorage, events: list[ObjectInfo]) -> None:
    info = storage.write_bytes("r/plugins/profile/s/analysis/summary.html", b"<html>")
    assert storage.read_bytes(info.name) == b"<html>"
    assert events == [info] and info.size == 6
    assert storage.stat(info.name) == info
    assert storage.stat("r/missing") is None
    # No temporary file is left behind, and list() shows the object.
    assert [o.name for o in storage.list("r/")] == [info.name]
    assert storage.uri(info.name).startswith("file:///")
    # The watcher does not report the port's own writes a second time.
    watcher = DirectoryWatcher(storage, stability_s=0.0)
    assert watcher.scan(now=0) + watcher.scan(now=1) == 0


def test_a_rewrite_is_a_new_generation(storage: LocalDirStorage,
                                       events: list[ObjectInfo]) -> None:
    first = storage.write_bytes(NAME, b"one")
    second = storage.write_bytes(NAME, b"three")
    assert first.generation != second.generation
    assert [e.size for e in events] == [3, 5]


def test_a_file_being_appended_is_reported_once_after_it_stops_changing(
        storage: LocalDirStorage, events: list[ObjectInfo]) -> None:
    watcher = DirectoryWatcher(storage, stability_s=1.0)
    path = storage.root / NAME
    path.parent.mkdir(parents=True)
    chunks = [b"a" * 1000, b"b" * 2000, b"c" * 3000, b"d" * 10]
    t = 0.0
    for i, chunk in enumerate(chunks):
        with path.open("ab") as f:
            f.write(chunk)
        assert watcher.scan(now=t) == 0, f"reported while chunk {i} was still being written"
        t += 0.9  # each pause is shorter than the stability window
        assert watcher.scan(now=t) == 0
        t += 0.1
    assert events == []
    assert watcher.scan(now=t + 1.0) == 1
    assert [(e.name, e.size) for e in events] == [(NAME, sum(map(len, chunks)))]
    assert watcher.scan(now=t + 5.0) == 0 and len(events) == 1, "reported twice"


def test_temporary_names_are_ignored_until_renamed(storage: LocalDirStorage,
                                                   events: list[ObjectInfo]) -> None:
    watcher = DirectoryWatcher(storage, stability_s=0.5)
    session = storage.root / "run/plugins/profile/s1"
    session.mkdir(parents=True)
    temps = [".host0.xplane.pb", "host0.xplane.pb.tmp", "host0.xplane.pb.part",
             "host0.xplane.pb.crdownload", "notes.txt", "host0.trace.json.gz"]
    for name in temps:
        (session / name).write_bytes(b"x" * 10)
    for now in (0, 10, 20):
        watcher.scan(now=now)
    assert events == []
    (session / ".host0.xplane.pb").rename(session / "host0.xplane.pb")
    watcher.scan(now=30)
    watcher.scan(now=31)
    assert [e.name for e in events] == [NAME]


def test_a_file_removed_before_it_settles_is_forgotten(storage: LocalDirStorage,
                                                       events: list[ObjectInfo]) -> None:
    watcher = DirectoryWatcher(storage, stability_s=0.5)
    path = storage.root / NAME
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x")
    watcher.scan(now=0)
    path.unlink()
    assert watcher.scan(now=10) == 0 and events == []


def test_the_watcher_runs_in_its_thread(storage: LocalDirStorage,
                                        events: list[ObjectInfo]) -> None:
    from tests.helpers.wait import wait_until

    watcher = DirectoryWatcher(storage, stability_s=0.05, poll_s=0.02)
    watcher.start()
    try:
        path = storage.root / NAME
        path.parent.mkdir(parents=True)
        path.write_bytes(b"x" * 100)
        wait_until(lambda: events, what="the watcher's event")
    finally:
        watcher.stop()
    assert [(e.name, e.size) for e in events] == [(NAME, 100)]


@pytest.mark.parametrize("name", [
    "../outside.xplane.pb", "/etc/passwd", "run/../../outside", "run//x", "run/./x", "",
])
def test_unsafe_names_are_rejected_by_the_storage(storage: LocalDirStorage, name: str) -> None:
    with pytest.raises(ValueError, match="unsafe object name"):
        storage.write_bytes(name, b"x")
    with pytest.raises(ValueError, match="unsafe object name"):
        storage.read_bytes(name)
    assert not (storage.root.parent / "outside.xplane.pb").exists()


@pytest.mark.parametrize("name", [
    "run/plugins/profile/../h.xplane.pb",
    "ru n/plugins/profile/s/h.xplane.pb",
    "run/plugins/profile/s/.xplane.pb",
    "run/plugins/profile/s/-h.xplane.pb",
    "a//run/plugins/profile/s/h.xplane.pb",
])
def test_unsafe_profile_names_are_rejected_with_the_segment(name: str) -> None:
    with pytest.raises(ValueError, match="unsafe object name"):
        parse_object_name(name)


def test_profile_names_are_parsed_and_other_objects_ignored() -> None:
    p = parse_object_name("team/exp1/plugins/profile/2024_01_01/10.0.0.1_6003.xplane.pb")
    assert p is not None
    assert (p.prefix, p.run, p.session, p.host) == ("team", "exp1", "2024_01_01", "10.0.0.1_6003")
    assert p.analysis_dir == "team/exp1/plugins/profile/2024_01_01/analysis"
    assert parse_object_name("run/plugins/profile/s/analysis/summary.html") is None
    assert parse_object_name("run/plugins/profile/s/h.trace.json.gz") is None
    assert parse_object_name("run/h.xplane.pb") is None
    # The viewer's cache of a windowed host keeps its windows in XProf's layout, under the
    # session's analysis/: never a new session (it was one, analysed and cached again).
    cached = "run/plugins/profile/s/analysis/xprof_cache/k1/plugins/profile/s/h.window00.xplane.pb"
    assert parse_object_name(cached) is None
    # Its own prefix now (the lifecycle's), with analysis/ kept for this: even unzipped.
    assert parse_object_name(
        "xprof-cache/run/plugins/profile/s/analysis/k1/plugins/profile/s/h.window00.xplane.pb"
    ) is None
    assert parse_object_name("pre/run/plugins/profile/s/analysis/x/plugins/profile/t/h.xplane.pb") \
        is None
    nested = parse_object_name("analysis/plugins/profile/s/h.xplane.pb")
    assert nested is not None and nested.run == "analysis"
    riegeli = parse_object_name("run/plugins/profile/s/h.xplane.riegeli")
    assert riegeli is not None and riegeli.suffix == ".xplane.riegeli"


def test_a_symlink_loop_does_not_stop_the_watcher(storage: LocalDirStorage,
                                                  events: list[ObjectInfo]) -> None:
    watcher = DirectoryWatcher(storage, stability_s=0.5)
    broken = storage.root / "r3/plugins/profile/s"
    broken.mkdir(parents=True)
    (broken / "loop.xplane.pb").symlink_to("loop.xplane.pb")  # stat: too many symlink levels
    good = storage.root / NAME
    good.parent.mkdir(parents=True)
    good.write_bytes(b"x" * 10)
    for now in (0, 10):
        watcher.scan(now=now)
    assert [e.name for e in events] == [NAME]
