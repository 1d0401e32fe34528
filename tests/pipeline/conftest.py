"""Fixtures for the pipeline tests: a real TPU xplane and runtimes built through bootstrap."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mldiag.bootstrap import LocalRuntime, bootstrap
from mldiag.settings import Settings
from tests.conftest import SHARED_FIXTURES
from tests.pipeline.helpers import MakeRuntime

TPU_XPLANE = SHARED_FIXTURES / "tpu_inference_2/plugins/profile/run1/tpu_inference_2.xplane.pb"

# Short windows so each scenario takes about a second; correctness never depends on them.
FAST = {"settle_s": 0.3, "stability_s": 0.1, "poll_s": 0.02, "retry_backoff_s": 0.05,
        "max_attempts": 3}


@pytest.fixture(scope="session")
def xplane_bytes() -> bytes:
    """The real TPU trace of the shared fixtures (4 TPU planes, 862,707 bytes)."""
    if not TPU_XPLANE.is_file():
        pytest.skip(f"real profile fixture {TPU_XPLANE} is absent (clone ../shared beside "
                    "the repo)")
    return TPU_XPLANE.read_bytes()


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
