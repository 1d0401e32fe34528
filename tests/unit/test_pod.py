"""The cross-host pass (`collection/hosts/pod.py`) on TPU-shaped pods written as XSpaces:
steps and clocks aligned, collective time split into waiting and transfer, and a straggler
named only when one host is late step after step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mldiag.analysis.collection.hosts.pod import SHOWN_HOSTS, cross_host
from mldiag.analysis.collection.xspace.timeline import analyze_host
from tests.helpers.pod_xplanes import PodShape, write_pod


def _pod(tmp_path: Path, shape: PodShape) -> dict[str, Any]:
    paths = write_pod(tmp_path / "s1", shape)
    out = cross_host([analyze_host(p, p.name.split(".")[0]) for p in paths])
    assert out is not None
    return out


def test_a_stretched_host_is_the_straggler_and_the_others_wait_for_it(tmp_path: Path) -> None:
    offsets = [0.0, 31.5, -12.25, 7.0]
    pod = _pod(tmp_path, PodShape(stretch={2: 1.5}, clock_offset_ms=offsets))
    [s] = pod["stragglers"]
    assert s["host"] == "host2" and s["cause"] == "device compute"
    assert s["lateness_ms_per_step"] == pytest.approx(4.0, abs=0.2)
    assert s["others_wait_ms_per_step"] == pytest.approx(4.0, abs=0.2)
    assert s["excess_ms_per_step"]["device compute"] == pytest.approx(4.0, abs=0.2)
    # The clocks: each host's offset from host0, found from the collectives' common end.
    for h, want in zip(("host1", "host2", "host3"), offsets[1:], strict=True):
        assert pod["clock_offsets_ms"][h] == pytest.approx(want - offsets[0], abs=0.05)
    split = pod["collective_split"]
    assert split["transfer_ms_per_step"] == pytest.approx(1.0, abs=0.1)
    assert split["wait_percent"] > 60
    [op] = split["ops"]
    assert op["op"] == "all-reduce-done.1", "an async pair's start is its issue, not a wait"
    assert op["wait_ms_by_host"]["host2"] == pytest.approx(0.0, abs=0.1)
    # Without the wait, a step is compute + transfer; with it, the straggler's compute.
    assert s["session_step_ms_if_median"] < s["session_step_ms"] - 3.5
    assert pod["per_host"][0]["host"] == "host2" and pod["per_host"][0]["straggler"]


def test_jitter_and_balance_name_no_straggler(tmp_path: Path) -> None:
    jitter = _pod(tmp_path / "j", PodShape(jitter_ms=4.0, steps=24))
    assert jitter["stragglers"] == [], jitter["straggler_test"]
    # Waiting is still most of the collectives: the communication rule says so.
    assert jitter["collective_split"]["wait_percent"] > 40
    balanced = _pod(tmp_path / "b", PodShape())
    assert balanced["stragglers"] == []
    assert all(abs(r["lateness_ms"]) < 0.2 for r in balanced["per_host"])


def test_a_host_that_stopped_early_is_aligned_on_the_common_steps(tmp_path: Path) -> None:
    pod = _pod(tmp_path, PodShape(stretch={1: 1.4}, step_range={3: range(0, 10)}))
    assert pod["common_steps"] == 10 and pod["steps_matched_by"] == "step number"
    assert pod["hosts_with_other_steps"] == ["host3"]
    assert [s["host"] for s in pod["stragglers"]] == ["host1"]


def test_one_host_is_not_a_pod(tmp_path: Path) -> None:
    [path] = write_pod(tmp_path, PodShape(hosts=1))
    assert cross_host([analyze_host(path, "host0")]) is None


def test_a_large_pod_keeps_its_views_bounded(tmp_path: Path) -> None:
    pod = _pod(tmp_path, PodShape(hosts=40, devices=1, steps=80, stretch={33: 1.5}))
    assert [s["host"] for s in pod["stragglers"]] == ["host33"]
    heat = pod["heat_map"]
    assert heat["hosts_shown"] == SHOWN_HOSTS and heat["hosts_summarised"] == 40 - SHOWN_HOSTS
    assert heat["rows"][0]["host"] == "host33", "worst first"
    assert heat["rows"][-1]["summary_of"] == 40 - SHOWN_HOSTS
    assert len(heat["steps"]) == 64 and all(len(r["lateness_ms"]) == 64 for r in heat["rows"])


def test_the_hosts_beyond_the_shown_ones_are_one_row_of_medians(tmp_path: Path) -> None:
    pod = _pod(tmp_path, PodShape(hosts=20, devices=1, steps=12, stretch={5: 1.5}))
    rest = pod["per_host_rest"]
    beyond = pod["per_host"][SHOWN_HOSTS:]
    assert rest["hosts"] == len(beyond) == 4 and rest["stragglers"] == 0
    import statistics
    assert rest["step_ms"] == pytest.approx(statistics.median(r["step_ms"] for r in beyond),
                                            abs=1e-3)


def test_without_step_annotations_the_hosts_are_compared_round_by_round(
        tmp_path: Path) -> None:
    pod = _pod(tmp_path, PodShape(stretch={3: 1.5}, annotated=False, steps=16,
                                  clock_offset_ms=[0.0, 5.0, -3.0, 11.0]))
    assert pod["unit"] == "round" and pod["marker"] == "all-reduce-done.1"
    assert pod["common_steps"] == 15, "round k ends with the k-th all-reduce"
    [s] = pod["stragglers"]
    assert s["host"] == "host3" and s["cause"] == "device compute"
    assert s["lateness_ms_per_step"] == pytest.approx(4.0, abs=0.2)
    assert pod["clock_offsets_ms"]["host3"] == pytest.approx(11.0, abs=0.05)
    balanced = _pod(tmp_path / "b", PodShape(annotated=False))
    assert balanced["stragglers"] == []


def test_the_fast_statistics_equal_the_plain_ones() -> None:
    """The median of the others and the sign test are computed in O(n log n) and log space;
    they must equal the plain definitions."""
    import math

    import numpy as np

    from mldiag.analysis.collection.hosts.pod import _median_of_others, _sign_test

    rng = np.random.default_rng(1)
    for n in (2, 3, 4, 5, 8, 17):
        a = rng.normal(size=(30, n))
        want = np.stack([np.median(np.delete(a, j, axis=1), axis=1) for j in range(n)], axis=1)
        assert np.allclose(_median_of_others(a), want), n
    for late, steps in ((12, 12), (10, 12), (3, 20), (0, 5), (700, 1000)):
        exact = sum(math.comb(steps, k) for k in range(late, steps + 1)) / 2**steps
        assert _sign_test(late, steps) == pytest.approx(exact, rel=1e-9, abs=1e-300)


def test_rounds_of_different_lengths_keep_each_hosts_figures_within_its_round(
        tmp_path: Path) -> None:
    """Compute and host wait in a round are the capture's shares of that round's length: a
    long step every few steps (an evaluation) makes a few rounds long, and no host's compute
    may then exceed its round."""
    pod = _pod(tmp_path, PodShape(annotated=False, steps=24, long_every=4, long_ms=200.0))
    for row in pod["per_host"]:
        assert row["compute_ms"] + row["host_wait_ms"] <= row["step_ms"] + 1e-6, row
        assert row["compute_ms"] <= row["step_ms"], row


def test_a_host_with_neither_steps_nor_collectives_is_named_and_left_out(
        tmp_path: Path) -> None:
    paths = write_pod(tmp_path / "s1", PodShape(hosts=3, annotated=False, stretch={1: 1.5}))
    hosts = [analyze_host(p, p.name.split(".")[0]) for p in paths]
    idle = analyze_host(paths[0], "host9")
    idle.collective_instances = type(idle.collective_instances).empty()
    pod = cross_host([*hosts, idle])
    assert pod is not None and pod["hosts"] == 3
    assert pod["failed_hosts"] == ["host9: no step annotations and no collective in its capture"]
    assert [s["host"] for s in pod["stragglers"]] == ["host1"]


def test_xla_cpu_collectives_on_several_pool_threads_are_one_sequence(tmp_path: Path) -> None:
    """XLA:CPU runs a step's ops on whichever pool thread is free: one host's all-reduces can
    sit on two `tf_XLAExecute` lines. They are still that host's one sequence (CI once saw 6
    of 11 rounds matched when each line was counted on its own)."""
    pod = _pod(tmp_path, PodShape(annotated=False, steps=12, cpu_threads=2, stretch={1: 1.5}))
    assert pod["unit"] == "round" and pod["common_steps"] == 11
    assert [s["host"] for s in pod["stragglers"]] == ["host1"]
    stepped = _pod(tmp_path / "s", PodShape(steps=12, cpu_threads=3, stretch={2: 1.5}))
    assert stepped["common_steps"] == 12 and stepped["collectives_matched"] == 12
