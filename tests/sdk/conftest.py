"""Fixtures for the SDK tests: a local mldiag home the SDK registers its runs in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mldiag.adapters.local.state import SqliteStateStore
from mldiag.settings import Settings

# Variables the SDK reads (upstream's and mldiag's): a test sets the ones it is about.
SDK_ENV = ("MLDIAG_HOST_NAME", "HOSTNAME", "RUN_WORKLOAD_ID", "GKE_DIAGON_IDENTIFIER",
           "GKE_DIAGON_METADATA", "SLURM_JOB_ID", "SLURM_CLUSTER_NAME", "SLURM_NODELIST",
           "SLURM_JOB_START_TIME", "SLURM_JOB_NAME", "DIAGON_BASE_URL", "DIAGON_WORKLOAD_ID",
           "DIAGON_CLUSTER_ID", "WORKLOAD_ID", "POD_NAMESPACE", "MLDIAG_BACKEND",
           "MLDIAG_CONTROL_PORT", "MLDIAG_TARGET_ADDRESS")


@pytest.fixture
def sdk_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """MLDIAG_HOME for the SDK (the embedded state and bucket); every run is closed after."""
    from mldiag.sdk.run import current_run

    home = tmp_path / "home"
    for key in SDK_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MLDIAG_HOME", str(home))
    monkeypatch.setenv("MLDIAG_HOST_NAME", "h0")
    yield home
    run = current_run()
    if run is not None:
        run.close()


@pytest.fixture
def sdk_state(sdk_home: Path) -> SqliteStateStore:
    """The state store the SDK writes (what `mldiag up`, the CLI and the console read)."""
    return SqliteStateStore(Settings(home=sdk_home).state_db)
