"""Real JAX workloads, each profiled once per test session on XLA:CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = REPO / "scripts" / "workloads"


@pytest.fixture(scope="session")
def workload_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Factory: workload name -> its profile's session directory (profiled on first use)."""
    cache: dict[str, Path] = {}

    def run(workload: str) -> Path:
        if workload not in cache:
            logdir = tmp_path_factory.mktemp(workload)
            env = {**os.environ, "JAX_PLATFORMS": "cpu"}
            subprocess.run(
                [sys.executable, str(WORKLOADS / f"{workload}.py"), "--logdir", str(logdir)],
                check=True, env=env, timeout=300, capture_output=True,
            )
            (run_dir,) = (logdir / "plugins" / "profile").iterdir()
            assert list(run_dir.glob("*.xplane.pb")), f"{workload} wrote no xplane"
            cache[workload] = run_dir
        return cache[workload]

    return run
