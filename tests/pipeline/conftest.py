"""Fixtures for the pipeline tests: a real TPU xplane and runtimes built through bootstrap."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mldiag.bootstrap import LocalRuntime, bootstrap
from mldiag.settings import Settings
from tests.helpers.fixtures import TPU_XPLANE, team_fixture
from tests.helpers.pipeline import FAST, MakeRuntime


@pytest.fixture(scope="session")
def xplane_bytes() -> bytes:
    """The real TPU trace of the shared fixtures (4 TPU planes, 862,707 bytes)."""
    return team_fixture(TPU_XPLANE).read_bytes()


@pytest.fixture
def make_runtime(tmp_path: Path) -> Iterator[MakeRuntime]:
    """Factory: a runtime on `tmp_path/home` with FAST settings plus overrides (not started).

    Every runtime it made is stopped at teardown.
    """
    made: list[LocalRuntime] = []

    def make(*, investigator: Any = None, clock: Callable[[], float] = time.time,
             **overrides: Any) -> LocalRuntime:
        settings = Settings(home=tmp_path / "home", **{**FAST, **overrides})
        runtime = bootstrap(settings, investigator=investigator, clock=clock)
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime.stop()
