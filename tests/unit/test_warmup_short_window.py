"""The warm-up rule keeps a short window's steps: a leading slow step is called warm-up only
when enough steps follow it to say it is an outlier (Tunix's `profile_steps=range(3, 5)`
captures two or three steps, and lost the first to the rule)."""

from __future__ import annotations

import numpy as np

from mldiag.analysis.collection.xspace.timeline import WARMUP_MIN_AFTER, warmup_split

MS = 1e6


def steps_of(*durations_ms: float) -> np.ndarray:
    ends = np.cumsum(durations_ms) * MS
    return np.stack([ends - np.array(durations_ms) * MS, ends], axis=1)


def test_a_short_window_keeps_its_first_step() -> None:
    # Three profiled steps, the first 2.5x the others: no compile event, too few to judge.
    kept, gone = warmup_split(steps_of(25.0, 10.0, 10.0), np.zeros((0, 2)))
    assert len(kept) == 3 and gone == []
    kept, gone = warmup_split(steps_of(25.0, 10.0), np.zeros((0, 2)))
    assert len(kept) == 2 and gone == []


def test_a_long_enough_window_still_leaves_out_its_warm_up() -> None:
    window = steps_of(25.0, *[10.0] * WARMUP_MIN_AFTER)
    kept, gone = warmup_split(window, np.zeros((0, 2)))
    assert len(kept) == WARMUP_MIN_AFTER and [g["step_index"] for g in gone] == [0]
    # Two slow leading steps: each leaves out while enough steps follow it.
    kept, gone = warmup_split(steps_of(40.0, 30.0, *[10.0] * 3), np.zeros((0, 2)))
    assert [g["step_index"] for g in gone] == [0, 1] and len(kept) == 3


def test_a_compile_step_is_left_out_whatever_the_window() -> None:
    window = steps_of(400.0, 10.0)
    kept, gone = warmup_split(window, np.array([[1 * MS, 390 * MS]]))
    assert len(kept) == 1 and gone[0]["reason"] == "compilation"
