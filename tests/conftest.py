"""Shared test fixtures: the team's real xplane traces, copied before use."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.fixtures import GPU, REPO, TPU, TPU_XPLANE, copy_fixture, team_fixture


@pytest.fixture(scope="session")
def tpu_logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_fixture(tmp_path_factory, TPU)


@pytest.fixture(scope="session")
def gpu_logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_fixture(tmp_path_factory, GPU)


# The browser the browser tests ran on (tests/browser/conftest.py records it): a test that
# passed on one chromium build says nothing of the next, so every run says which it was.
BROWSER_VERSION = pytest.StashKey[str]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    version = terminalreporter.config.stash.get(BROWSER_VERSION, None)
    if version:
        terminalreporter.write_line(f"browser tests ran on {version}")


@pytest.fixture(scope="session")
def tpu_eight_copies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The TPU fixture repeated 8 times in time (bench/tpu_shape.py): its op_stats build
    takes longer than the scheduler's first look at it (a warm worker builds the fixture's
    own in under 50 ms, which a 0 s deadline then never sees)."""
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    from tpu_shape import generate

    source = team_fixture(TPU_XPLANE)
    logdir = tmp_path_factory.mktemp("tpu8")
    generate(logdir, 8 * source.stat().st_size / 1024**2)
    return logdir
