"""Fixtures for the GCP suite: the shared emulators (see tests/emulators.py)."""

from __future__ import annotations

import pytest

from tests.emulators import emu, stop_shared_emulators

__all__ = ["emu"]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    stop_shared_emulators()
