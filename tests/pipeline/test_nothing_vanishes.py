"""Nothing vanishes and nothing is analysed twice: unchanged bytes keep their version,
symlinks out of the bucket are refused with the reason, and GCS's md5 travels with its event."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mldiag import entrypoints, stages
from mldiag.adapters.local.storage import LocalDirStorage, OutsideBucket
from mldiag.bootstrap import LocalRuntime
from mldiag.messages import ProfileObjectFinalized, parse
from mldiag.model import CAPTURING, FAILED, REPORTED
from tests.helpers.pipeline import MakeRuntime, bus_messages
from tests.helpers.wait import wait_until

RUN = "train"
NAME = f"{RUN}/plugins/profile/s1/h0.xplane.pb"
EVENTS = Path(__file__).resolve().parents[1] / "events"


def _last_finalize(rt: LocalRuntime) -> ProfileObjectFinalized:
    message = parse(bus_messages(rt.state, "profile-objects")[-1]["payload"])
    assert isinstance(message, ProfileObjectFinalized)
    return message


def test_unchanged_bytes_do_not_start_a_new_version(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    rt.storage.write_bytes(NAME, b"profile bytes v1")
    first = _last_finalize(rt)
    # Registered before it is hashed; the storage's hasher hashes it right after.
    assert first.content_hash == ""
    info = rt.storage.stat(NAME)
    assert info is not None
    digest = wait_until(lambda: rt.storage.known_hash(info), what="the background hash")
    assert digest.startswith("md5:")
    stages.on_profile_object(first, rt.services)
    s = rt.state.transition(RUN, "s1", REPORTED, now=0.0, verdict="OPTIMAL")
    assert s is not None and s.version == 1
    # `touch`: a new generation of the same bytes, found by the watcher. The old generation's
    # bytes are gone from the disk: its hash is the one the hasher kept.
    path = rt.storage.root / NAME
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 10**10))
    assert rt.watcher.scan() == 1
    touched = _last_finalize(rt)
    assert touched.generation != first.generation
    # Whether or not the hasher has got to the new generation yet (it did, here).
    wait_until(lambda: (now := rt.storage.stat(NAME)) is not None and rt.storage.known_hash(now),
               what="the new hash")
    stages.on_profile_object(touched, rt.services)
    s = rt.state.get_session(RUN, "s1")
    assert s is not None and (s.state, s.version, s.verdict) == (REPORTED, 1, "OPTIMAL")
    assert s.hosts["h0"].content_hash == digest
    # Reads pin the newest generation of those bytes, so re-reading them stays valid.
    assert s.hosts["h0"].generation == touched.generation
    # New bytes are a new version.
    rt.storage.write_bytes(NAME, b"profile bytes v2")
    stages.on_profile_object(_last_finalize(rt), rt.services)
    s = rt.state.get_session(RUN, "s1")
    assert s is not None and (s.state, s.version) == (CAPTURING, 2)


def test_a_symlink_out_of_the_bucket_fails_its_session_with_the_reason(
        make_runtime: MakeRuntime, tmp_path: Path, xplane_bytes: bytes) -> None:
    outside = tmp_path / "elsewhere.xplane.pb"
    outside.write_bytes(xplane_bytes)
    rt = make_runtime()
    rt.start()
    link = rt.storage.root / NAME
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    s = wait_until(lambda: (x if (x := rt.state.get_session(RUN, "s1")) and x.state == FAILED
                            else None), what="the session to fail")
    assert "outside the bucket" in s.reason and "refused" in s.reason


def test_the_storage_refuses_paths_that_leave_the_bucket(tmp_path: Path) -> None:
    storage = LocalDirStorage(tmp_path / "bucket")
    (tmp_path / "secret").write_bytes(b"s")
    (tmp_path / "outdir").mkdir()
    storage.write_bytes("r/inside.txt", b"in")
    (storage.root / "r/link-in.txt").symlink_to(storage.root / "r/inside.txt")
    (storage.root / "r/link-out.txt").symlink_to(tmp_path / "secret")
    (storage.root / "r/dir-out").symlink_to(tmp_path / "outdir")
    assert storage.read_bytes("r/link-in.txt") == b"in"  # within the bucket: fine
    with pytest.raises(OutsideBucket, match="outside the bucket"):
        storage.read_bytes("r/link-out.txt")
    with pytest.raises(OutsideBucket):
        storage.stat("r/link-out.txt")
    with pytest.raises(OutsideBucket):
        storage.write_bytes("r/dir-out/planted.txt", b"x")
    assert list((tmp_path / "outdir").iterdir()) == []


def test_a_gcs_finalize_event_carries_the_objects_md5() -> None:
    from cloudevents.http import CloudEvent

    event = json.loads((EVENTS / "storage_object_finalized.json").read_text())
    message = entrypoints.profile_object_finalized(
        CloudEvent({k: v for k, v in event.items() if k != "data"}, event["data"]))
    assert message.content_hash == f"md5:{event['data']['md5Hash']}"
