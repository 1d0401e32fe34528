"""A fanned-out session's collection (each host's op_stats built by its own `collect_host`,
one of them in time windows, combined as xprof combines hosts) answers what the collection
of the whole session answers: every tool's data equal."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from mldiag.analysis.collection.collect import collect
from mldiag.analysis.collection.hosts.share import collect_host
from mldiag.analysis.collection.profile_input import ProfileSession
from tests.helpers.fixtures import REPO, team_fixture
from tests.helpers.fixtures import TPU_XPLANE as TPU

MB = 1024**2


def _generate(tmp: Path, copies: int) -> Path:
    sys.path.insert(0, str(REPO / "bench"))
    from tpu_shape import generate

    generate(tmp, copies * TPU.stat().st_size / MB)
    (xplane,) = (tmp / "plugins/profile/run1").glob("*.xplane.pb")
    return xplane


def _data(snapshot: dict[str, Any], path: Path) -> dict[str, Any]:
    """Each tool's status and data, with the session's directory named alike."""
    text = json.dumps({name: (t["status"], t.get("data"))
                       for name, t in snapshot["tools"].items()})
    return dict(json.loads(text.replace(str(path), "SESSION")))


def test_fanned_out_hosts_answer_as_the_whole_session(tmp_path: Path) -> None:
    team_fixture(TPU)
    whole = tmp_path / "whole/plugins/profile/run1"
    whole.mkdir(parents=True)
    shutil.copyfile(_generate(tmp_path / "a", 4), whole / "host-a.xplane.pb")
    shutil.copyfile(_generate(tmp_path / "b", 2), whole / "host-b.xplane.pb")
    hosts = ["host-a", "host-b"]
    expected = collect(ProfileSession(run="r", name="s", path=whole, xplanes=tuple(
        whole / f"{h}.xplane.pb" for h in hosts)))
    out = tmp_path / "parts"
    # host-a (3.4 MB) is cut in time windows of 1.5 MB; host-b (1.7 MB) is built whole.
    parts = {h: collect_host(whole / f"{h}.xplane.pb", h, out, window_min_bytes=2 * MB,
                             window_bytes=MB + MB // 2) for h in hosts}
    assert parts["host-a"]["parts"]["op_stats"]["windows"] >= 2
    # Its windows' host databases add up to its own (nothing spans a cut).
    assert parts["host-a"]["parts"]["op_stats"]["host_inexact"] == ""
    assert parts["host-b"]["parts"]["op_stats"]["windows"] == 1
    view = tmp_path / "view/plugins/profile/run1"
    view.mkdir(parents=True)
    for h in hosts:
        (view / f"{h}.xplane.pb").symlink_to(out / f"{h}.xplane.pb")
    got = collect(ProfileSession(run="r", name="s", path=view, xplanes=tuple(
        view / f"{h}.xplane.pb" for h in hosts)), host_parts=parts,
        host_op_stats={h: out / f"{h}.op_stats.pb" for h in hosts})
    assert got["collection"]["skipped"] == [] and got["collection"]["killed"] == []
    a, b = _data(got, view), _data(expected, whole)
    for name in b:
        if name == "get_memory_profile":  # the fan-out names the host of the worst peak
            continue
        if a[name][0] == b[name][0] == "NO_DATA":  # the fan-out's reason names each host
            continue
        assert a[name] == b[name], name
    def passes(snapshot: dict[str, Any]) -> dict[str, Any]:
        return {k: {f: v for f, v in p.items() if f != "elapsed_ms"}
                for k, p in snapshot["passes"].items()}

    assert passes(got) == passes(expected)
