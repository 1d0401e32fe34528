"""The vLLM wrapper uploads no symlink and no file from outside its phased-profiling
directory (issue 34, item 9): a link to a private file, named like an xplane, or a linked
directory of them, is skipped; the phase's real traces still land in the run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mldiag.sdk import machinelearning_run
from mldiag.sdk.commands.run_vllm import TraceCollector, read_inside
from mldiag.sdk.custom_types.mlrun_types import ServingEngine

PRIVATE = b"-----BEGIN PRIVATE KEY----- not for the bucket"
TRACE = b"\x0a\x04real xplane bytes"


def test_links_in_the_phased_directory_are_never_uploaded(sdk_home: Path,
                                                           tmp_path: Path) -> None:
    run = machinelearning_run(name="vllm-links", metrics_record_interval_sec=-1,
                              serving_engine=ServingEngine.VLLM, metric_only_run=True,
                              monitor=False)
    outside = tmp_path / "private"
    (outside / "plugins" / "profile" / "t9").mkdir(parents=True)
    secret = outside / "id_rsa"
    secret.write_bytes(PRIVATE)
    (outside / "plugins" / "profile" / "t9" / "w1.xplane.pb").write_bytes(PRIVATE)
    root = tmp_path / "phased" / run.name
    phase = root / "prefill" / "plugins" / "profile" / "t1"
    phase.mkdir(parents=True)
    (phase / "w0.xplane.pb").write_bytes(TRACE)
    # A link to a private file, named as the worker names a trace.
    (phase / "w1.xplane.pb").symlink_to(secret)
    # A linked session directory, and a linked phase directory.
    (root / "prefill" / "plugins" / "profile" / "t2").symlink_to(
        outside / "plugins" / "profile" / "t9")
    (root / "decode").symlink_to(outside)
    collector = TraceCollector(run, [root])
    collector.poll(final=True)
    storage = run.plane.storage
    names = sorted(o.name for o in storage.list(""))
    xplanes = [n for n in names if n.endswith(".xplane.pb")]
    assert xplanes == [f"{run.session_dir('prefill-t1')}/w0.xplane.pb"], names
    assert storage.read_bytes(xplanes[0]) == TRACE
    for name in names:
        assert PRIVATE not in storage.read_bytes(name), name
    assert collector.sessions == {"prefill-t1": ["w0"]}
    run.close()


def test_read_inside_refuses_a_directory_swapped_for_a_link_after_the_walk(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "a" / "t.xplane.pb").write_bytes(TRACE)
    assert read_inside(root, root / "a" / "t.xplane.pb") == TRACE
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "t.xplane.pb").write_bytes(PRIVATE)
    os.rename(root / "a", tmp_path / "moved")
    (root / "a").symlink_to(outside)
    with pytest.raises(OSError):
        read_inside(root, root / "a" / "t.xplane.pb")
    with pytest.raises(OSError):
        read_inside(root, root / ".." / "outside" / "t.xplane.pb")
