"""The Storage port: LocalDirStorage and GcsStorage (on fake-gcs-server) keep one contract."""

from __future__ import annotations

import gzip
import hashlib
import os
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from mldiag.adapters.local.storage import LocalDirStorage
from mldiag.errors import ProfileUnreadable
from tests.contract.conftest import Subject, unique
from tests.emulators import Emulators

MIB = 1024**2
UNSAFE = ["", "/abs/x.pb", "a//b.pb", "a/../b.pb", "../b.pb", "a/./b.pb", "a/b/"]
CONTROL = ["a/b\n.pb", "a/\x00b.pb", "a/\x1bb.pb"]


@pytest.fixture(params=["local", pytest.param("gcs", marks=pytest.mark.emulator)])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    if request.param == "local":
        yield Subject("LocalDirStorage", LocalDirStorage(tmp_path / "bucket"))
        return
    from mldiag.adapters.gcp.storage import GcsStorage

    emu: Emulators = request.getfixturevalue("emu")
    client = emu.storage_client()
    bucket = client.create_bucket(unique("contract-"))
    # Small ranges, so a modest object already takes many parallel reads.
    yield Subject("GcsStorage", GcsStorage(bucket.name, client=client, chunk_size=4 * MIB,
                                           workers=4, tmp_dir=tmp_path))


def test_write_read_stat_and_list(storage: Subject) -> None:
    s = storage.adapter
    info = s.write_bytes("r/plugins/profile/s/h0.xplane.pb", b"abc")
    assert (info.name, info.size) == ("r/plugins/profile/s/h0.xplane.pb", 3)
    s.write_bytes("r/plugins/profile/s/h1.xplane.pb", b"defg")
    s.write_bytes("other/x.json", b"{}", content_type="application/json")
    assert s.read_bytes("r/plugins/profile/s/h1.xplane.pb") == b"defg"
    stat = s.stat("r/plugins/profile/s/h0.xplane.pb")
    assert stat is not None and stat == info
    assert stat.updated > 1.6e9, "updated is epoch seconds"
    assert s.stat("r/plugins/profile/s/missing.xplane.pb") is None
    assert [o.name for o in s.list("r/")] == ["r/plugins/profile/s/h0.xplane.pb",
                                              "r/plugins/profile/s/h1.xplane.pb"]
    assert [o.size for o in s.list("")] == [2, 3, 4]


def test_reading_a_missing_object_is_file_not_found(storage: Subject) -> None:
    with pytest.raises(FileNotFoundError):
        storage.adapter.read_bytes("r/nothing.json")


def test_an_overwrite_changes_the_generation(storage: Subject) -> None:
    s = storage.adapter
    first = s.write_bytes("r/a/analysis.json", b"v1")
    second = s.write_bytes("r/a/analysis.json", b"version 2")
    assert second.generation != first.generation and second.size == 9
    assert s.read_bytes("r/a/analysis.json") == b"version 2"


def test_a_create_only_write_never_replaces(storage: Subject) -> None:
    s = storage.adapter
    with storage.clause("create_only"):
        s.write_bytes("r/claim.txt", b"first", if_absent=True)
        with pytest.raises(FileExistsError):
            s.write_bytes("r/claim.txt", b"second", if_absent=True)
        assert s.read_bytes("r/claim.txt") == b"first"


def test_uri_names_the_object(storage: Subject) -> None:
    uri = storage.adapter.uri("r/plugins/profile/s/analysis/summary.html")
    assert uri.startswith(("file:///", "gs://"))
    assert uri.endswith("/r/plugins/profile/s/analysis/summary.html")


@pytest.mark.parametrize("name", UNSAFE)
def test_names_with_path_tricks_are_refused(storage: Subject, name: str) -> None:
    s = storage.adapter
    with pytest.raises(ValueError):
        s.write_bytes(name, b"x")
    with pytest.raises(ValueError):
        s.read_bytes(name)
    with pytest.raises(ValueError):
        s.stat(name)


@pytest.mark.parametrize("name", CONTROL)
def test_names_with_control_characters_are_refused(storage: Subject, name: str) -> None:
    with storage.clause("control_chars"), pytest.raises(ValueError):
        storage.adapter.write_bytes(name, b"x")


def test_local_files_gives_one_directory_under_base_names(storage: Subject) -> None:
    s = storage.adapter
    names = [f"r/plugins/profile/s/h{i}.xplane.pb" for i in range(3)]
    for i, n in enumerate(names):
        s.write_bytes(n, bytes([i]) * (i + 1) * 1000)
    s.write_bytes("r/plugins/profile/s/empty.xplane.pb", b"")
    with s.local_files([*names, "r/plugins/profile/s/empty.xplane.pb"]) as local:
        assert sorted(p.name for p in local.iterdir() if p.name.endswith(".pb")) == [
            "empty.xplane.pb", "h0.xplane.pb", "h1.xplane.pb", "h2.xplane.pb"]
        assert (local / "h2.xplane.pb").read_bytes() == b"\x02" * 3000
        assert (local / "empty.xplane.pb").read_bytes() == b""
    with pytest.raises(ValueError), s.local_files(["r/a/x.pb", "r/b/y.pb"]):
        pass


def test_local_files_of_a_missing_object_is_file_not_found(storage: Subject) -> None:
    with storage.clause("missing_objects"), pytest.raises(FileNotFoundError), \
            storage.adapter.local_files(["r/s/gone.xplane.pb"]):
        pass


def test_a_large_object_is_materialised_without_holding_it_in_memory(
        storage: Subject) -> None:
    s = storage.adapter
    size = 40 * MIB + 123  # not a multiple of the range size: the last range is short
    data = os.urandom(size)
    s.write_bytes("r/plugins/profile/big/h0.xplane.pb", data)
    want = hashlib.sha256(data).hexdigest()
    del data
    tracemalloc.start()
    try:
        with s.local_files(["r/plugins/profile/big/h0.xplane.pb"]) as local:
            _, peak = tracemalloc.get_traced_memory()
            path = local / "h0.xplane.pb"
            assert path.stat().st_size == size
            digest = hashlib.sha256()
            with path.open("rb") as f:
                while chunk := f.read(MIB):
                    digest.update(chunk)
    finally:
        tracemalloc.stop()
    assert digest.hexdigest() == want
    assert peak < size / 4, f"materialising held {peak / MIB:.1f} MiB of a {size} B object"
    if hasattr(s, "ranged_reads"):
        assert s.ranged_reads == 11, "40 MiB in 4 MiB ranges is 11 ranged reads"


def test_a_gzip_encoded_gcs_object_is_refused_with_the_reason(storage: Subject) -> None:
    from mldiag.adapters.gcp.storage import GcsStorage
    from mldiag.errors import ProfileUnreadable

    s = storage.adapter
    if not isinstance(s, GcsStorage):
        pytest.skip("only GCS objects carry a Content-Encoding")
    name = "r/plugins/profile/s/gz.xplane.pb"
    blob = s.client.bucket(s.bucket).blob(name)
    blob.content_encoding = "gzip"
    blob.upload_from_string(gzip.compress(b"x" * 10_000))
    with pytest.raises(ProfileUnreadable, match="gzip-encoded"), s.local_files([name]):
        pass


def test_local_files_reads_the_registered_generation_and_checks_size_first(
        storage: Subject) -> None:
    s = storage.adapter
    name = "r/plugins/profile/s/h0.xplane.pb"
    first = s.write_bytes(name, b"first generation")
    with s.local_files([name], generations={name: first.generation}, max_bytes=1024) as d:
        assert (d / "h0.xplane.pb").read_bytes() == b"first generation"
    # Rewritten after it was registered (and size-checked): that version never reads the
    # new bytes; the new generation is its own version. (Longer: a new generation even
    # within one tick of the local bucket's mtime, which its generation also carries.)
    second = s.write_bytes(name, b"second generation, longer")
    assert second.generation != first.generation
    with pytest.raises(ProfileUnreadable, match="rewritten since it was registered"):
        with s.local_files([name], generations={name: first.generation}):
            pass
    with pytest.raises(ProfileUnreadable, match="over the per-host cap"):
        with s.local_files([name], generations={name: second.generation}, max_bytes=8):
            pass


def _mark(storage: Subject, name: str) -> float | None:
    """When `name` was marked superseded, as the adapter's backing store keeps it."""
    adapter = storage.adapter
    if isinstance(adapter, LocalDirStorage):
        return adapter.superseded().get(name)
    blob = adapter.client.bucket(adapter.bucket).get_blob(name)
    return None if blob is None or blob.custom_time is None else blob.custom_time.timestamp()


def test_a_superseded_mark_is_kept_and_never_moved_later(storage: Subject) -> None:
    s = storage.adapter
    s.write_bytes("r/plugins/profile/s/analysis/v1/a.json", b"{}")
    s.write_bytes("r/plugins/profile/s/analysis/v2/a.json", b"{}")
    s.supersede("r/plugins/profile/s/analysis/v1/a.json", 1_800_000_000.0)
    s.supersede("r/plugins/profile/s/analysis/v1/a.json", 1_900_000_000.0)
    assert _mark(storage, "r/plugins/profile/s/analysis/v1/a.json") == 1_800_000_000.0
    assert _mark(storage, "r/plugins/profile/s/analysis/v2/a.json") is None
    s.supersede("r/plugins/profile/s/analysis/v3/gone.json", 1_800_000_000.0)  # no error
    assert s.read_bytes("r/plugins/profile/s/analysis/v1/a.json") == b"{}"
    assert [o.name for o in s.list("r/")] == ["r/plugins/profile/s/analysis/v1/a.json",
                                              "r/plugins/profile/s/analysis/v2/a.json"]
