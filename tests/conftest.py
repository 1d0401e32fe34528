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


@pytest.fixture(scope="session")
def tpu_eight_copies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The TPU fixture repeated 8 times in time (bench/tpu_shape.py): its op_stats build
    takes longer than the scheduler's first look at it (a warm worker builds the fixture's
    own in under 50 ms, which a 0 s deadline then never sees)."""
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    from tpu_shape import generate

    source = SHARED_FIXTURES / "tpu_inference_2/plugins/profile/run1/tpu_inference_2.xplane.pb"
    logdir = tmp_path_factory.mktemp("tpu8")
    generate(logdir, 8 * source.stat().st_size / 1024**2)
    return logdir
