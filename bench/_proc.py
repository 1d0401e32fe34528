"""Process-tree accounting for the benches: CPU seconds and resident memory of a process and
all its descendants (collection runs in worker processes, which getrusage does not see until
they are reaped)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from mldiag.analysis.collection.workers import rss_bytes as _rss

_TICK = os.sysconf("SC_CLK_TCK")


def tree_pids(root: int) -> list[int]:
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return pids


def _cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime
    except (OSError, IndexError, ValueError):
        return 0.0


def tree_cpu_s(root: int | None = None) -> float:
    """CPU seconds used so far by the live processes of the tree (self by default)."""
    return sum(_cpu(p) for p in tree_pids(root or os.getpid()))


class PeakTreeRss:
    """Samples the summed RSS of a process tree every `interval` s until stopped."""

    def __init__(self, root: int | None = None, interval: float = 0.05) -> None:
        self.root = root or os.getpid()
        self.interval = interval
        self.peak = 0
        self.peak_single = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakTreeRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            sizes = [_rss(p) for p in tree_pids(self.root)]
            self.peak = max(self.peak, sum(sizes))
            self.peak_single = max([self.peak_single, *sizes])
            time.sleep(self.interval)


def write_results(path: str | None, rows: list[dict[str, Any]]) -> None:
    """Write a bench's rows as JSON with the machine they ran on (nothing without a path)."""
    if path:
        Path(path).write_text(json.dumps({"machine": os.uname().nodename,
                                          "cores": os.cpu_count(), "rows": rows}, indent=2))
