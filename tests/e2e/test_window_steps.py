"""A large host's steps, found by the cut itself: the host lines it decodes give the same steps
(and compile and warm-up steps left out) as a pass of their own, on a real capture with step
markers and a compile inside the window."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from mldiag.analysis.collection.hosts import op_stats_shards as shards
from mldiag.analysis.collection.xspace import timeline
from mldiag.analysis.collection.xspace.scan import XSpaceScan


def test_the_cut_finds_the_host_s_steps_as_their_own_pass_does(
        workload_run_dir: Callable[[str], Path], tmp_path: Path) -> None:
    (xplane,) = workload_run_dir("compile_in_window").glob("*.xplane.pb")
    with XSpaceScan(xplane) as scan:
        steps, excluded = timeline.host_steps(scan)
    assert len(steps) >= 3 and excluded  # steps, and the compile step left out
    with XSpaceScan(xplane) as scan:
        spans = timeline.HostSpans(scan)
        shards.write_windows(scan, [int(steps[len(steps) // 2][0] * 1000)],
                             [tmp_path / "w0.pb", tmp_path / "w1.pb"], each_line=spans.add)
        found, left_out = spans.host_steps()
    np.testing.assert_array_equal(found, steps)
    assert left_out == excluded
