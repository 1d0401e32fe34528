"""xprof's own op_stats of a session, to hold mldiag's combined ones against."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mldiag.analysis.collection.hosts import op_stats_shards as shards
from mldiag.analysis.collection.profile_input import resolve_session
from mldiag.analysis.collection.xprof_tools import OP_STATS_FILE, XprofWorkspace


def xprof_op_stats(run_dir: Path) -> Any:
    """The op_stats xprof builds for the session in `run_dir` (every host of it)."""
    with XprofWorkspace(resolve_session(run_dir)) as ws:
        ws.precompute_op_stats()
        return shards.read(ws.run_dir / OP_STATS_FILE)
