"""Task 0's view of the windows other tasks of the collect job convert (RemoteWindows):
what it claims, when it cuts the host itself, and what arrives from the others."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mldiag.analysis.collection.hosts.window_tasks import RemoteWindows, task_windows


class _Exchange:
    """An in-memory WindowExchange: `others` holds the claims of live tasks."""

    def __init__(self, others: set[int]) -> None:
        self.task = 0
        self.others = others
        self.mine: set[int] = set()
        self.metas: dict[int, dict[str, Any]] = {}

    def take(self, window: int) -> bool:
        if window in self.others or window in self.mine or window in self.metas:
            return False
        self.mine.add(window)
        return True

    def give_up(self, window: int) -> None:
        self.mine.discard(window)

    def publish(self, window: int, meta: Any, op_stats: Path | None) -> None:
        self.metas[window] = dict(meta)

    def published(self) -> dict[int, dict[str, Any]]:
        return dict(self.metas)

    def fetch(self, window: int, dest: Path) -> None:
        dest.write_bytes(b"op_stats %d" % window)


SEAMS = {"idle_between_ps": 5, "host_time_ps": 9, "host_inexact": ""}


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _meta(k: int, task: int) -> dict[str, Any]:
    return {"window": k, "windows": 3, "cuts": [10, 20], "seams": SEAMS,
            "status": "DATA", "elapsed_ms": 7.0, "task": task}


def test_task_0_waits_for_the_others_and_never_cuts_what_they_hold(tmp_path: Path) -> None:
    exchange, clock = _Exchange(others={0, 1, 2}), _Clock()
    remote = RemoteWindows(exchange, 3, tmp_path, clock=clock)
    clock.now = 60.0
    assert not remote.take("split_windows") and not remote.take("op_stats_window1")
    assert remote.poll() == []  # nothing published yet
    exchange.metas[1] = _meta(1, task=2)
    clock.now += 5
    split, window = remote.poll()
    # The cut is the published windows' (nothing cut here), then the window itself.
    assert split.name == "split_windows" and split.value["cuts"] == [10, 20]
    assert split.value["seams"] == SEAMS and remote.arrived("split_windows")
    assert window.name == "op_stats_window1" and remote.arrived("op_stats_window1")
    assert Path(window.value["op_stats"]).read_bytes() == b"op_stats 1"
    assert remote.by_task == {1: 2}
    clock.now += 5
    assert remote.poll() == []  # each window once


def test_a_window_nobody_holds_is_claimed_and_cut_here_only_after_the_grace(
        tmp_path: Path) -> None:
    exchange, clock = _Exchange(others={0, 2}), _Clock()
    remote = RemoteWindows(exchange, 3, tmp_path, clock=clock, grace_s=10.0)
    clock.now = 5.0
    assert not remote.take("split_windows")  # the others may not have claimed yet
    clock.now = 11.0
    assert remote.take("split_windows") and exchange.mine == {1}
    assert remote.take("op_stats_window1")  # held since the cut was taken for it
    assert not remote.take("op_stats_window0")  # another task's
    remote.expect({"windows": 3, "cuts": [10, 20], "seams": SEAMS})
    from mldiag.analysis.collection.workers import Outcome

    built = Outcome("op_stats_window1", "DATA", {"op_stats": str(tmp_path / "w1.pb")}, 3.0)
    remote.built_here(built)
    assert exchange.metas[1]["task"] == 0 and exchange.metas[1]["cuts"] == [10, 20]
    assert remote.by_task == {1: 0}
    clock.now = 30.0
    assert remote.poll() == []  # its own window is not fetched back


def test_windows_cut_another_way_are_not_taken() -> None:
    exchange, clock = _Exchange(others=set()), _Clock()
    remote = RemoteWindows(exchange, 3, Path("/nonexistent"), clock=clock)
    remote.expect({"windows": 3, "cuts": [10, 21], "seams": SEAMS})
    exchange.metas[0] = _meta(0, task=1)
    clock.now = 10.0
    assert remote.poll() == []


def test_the_other_tasks_share_the_windows_and_task_0_has_none_of_its_own() -> None:
    assert task_windows(15, 0, 4) == []
    assert task_windows(15, 1, 4) == [0, 3, 6, 9, 12]
    assert sorted(k for t in range(1, 4) for k in task_windows(15, t, 4)) == list(range(15))
    assert task_windows(3, 0, 1) == [0, 1, 2]
