"""The team's real profiles in ../shared/fixtures, and what a test does when one is absent.

A test reaches a fixture through `team_fixture` (or `copy_fixture`): without the fixture it
skips, naming the missing path; with MLDIAG_REQUIRE_FIXTURES=1 (set by .ci/run) it fails
instead, so CI never reads a skipped suite as a passed one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"
TPU = "tpu_inference_2"
GPU = "gpu_multi_worker"
TPU_XPLANE = SHARED_FIXTURES / TPU / "plugins/profile/run1/tpu_inference_2.xplane.pb"
GPU_XPLANE = SHARED_FIXTURES / GPU / "plugins/profile/run1/34.83.195.179_6003.xplane.pb"
REQUIRE_FIXTURES = "MLDIAG_REQUIRE_FIXTURES"


def fixtures_required() -> bool:
    """Whether a missing fixture fails the test (MLDIAG_REQUIRE_FIXTURES=1) rather than
    skipping it."""
    return os.environ.get(REQUIRE_FIXTURES, "") not in ("", "0")


def fixture_absent(path: Path) -> NoReturn:
    """Skip the test for want of the fixture at `path`, or fail it when fixtures are
    required."""
    why = f"real profile fixture {path} is absent (clone ../shared beside the repo)"
    if fixtures_required():
        pytest.fail(f"{why}; {REQUIRE_FIXTURES}=1 makes that a failure", pytrace=False)
    pytest.skip(why)


def team_fixture(path: Path) -> Path:
    """`path` (a file or directory under SHARED_FIXTURES), when it exists."""
    if not path.exists():
        fixture_absent(path)
    return path


def team_xplanes() -> list[Path]:
    """Every xplane of the team's fixtures, to parametrize over. Without the fixtures, the
    two expected ones: their tests still run, and `team_fixture` skips or fails each."""
    found = sorted(SHARED_FIXTURES.glob("*/plugins/profile/*/*.xplane.pb"))
    return found or [TPU_XPLANE, GPU_XPLANE]


def fixture_id(xplane: Path) -> str:
    """The fixture an xplane belongs to, as a test id."""
    return xplane.relative_to(SHARED_FIXTURES).parts[0]


def copy_fixture(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A writable copy of the fixture directory `name` (xprof writes cache files next to
    traces, and the team's copy is read-only)."""
    src = team_fixture(SHARED_FIXTURES / name)
    dst = tmp_path_factory.mktemp("fixture") / name
    shutil.copytree(src, dst)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst
