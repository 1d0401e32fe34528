"""Shared test fixtures: the team's real xplane traces, copied before use."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"


def _fixture_copy(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    src = SHARED_FIXTURES / name
    if not src.is_dir():
        pytest.skip(f"real profile fixture {src} is absent (clone ../shared beside the repo)")
    dst = tmp_path_factory.mktemp("fixture") / name
    # xprof writes cache files next to traces, and the team's copy is read-only.
    shutil.copytree(src, dst)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


@pytest.fixture(scope="session")
def tpu_logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _fixture_copy(tmp_path_factory, "tpu_inference_2")


@pytest.fixture(scope="session")
def gpu_logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _fixture_copy(tmp_path_factory, "gpu_multi_worker")


# The browser the browser tests ran on (tests/browser/conftest.py records it): a test that
# passed on one chromium build says nothing of the next, so every run says which it was.
BROWSER_VERSION = pytest.StashKey[str]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    version = terminalreporter.config.stash.get(BROWSER_VERSION, None)
    if version:
        terminalreporter.write_line(f"browser tests ran on {version}")
