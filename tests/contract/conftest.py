"""One suite per port, run against every adapter: the embedded one and its Google Cloud
counterpart on an emulator (those cases are marked `emulator`).

A fixture yields a `Subject`: the adapter under test, plus the gaps it is known to have
against the contract. A gap turns that one assertion into an xfail naming it, so the suite
still runs every other assertion on that adapter, and passes as soon as the gap is closed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mldiag.adapters.local.state import SqliteStateStore
from tests.emulators import Emulators, emu, stop_shared_emulators

__all__ = ["emu"]  # the session fixture, shared with tests/gcp

_ids = itertools.count(1)


def unique(prefix: str) -> str:
    """A name no other test of this process uses (buckets, databases, topic prefixes)."""
    return f"{prefix}{next(_ids)}"


@dataclass
class Subject:
    """An adapter under contract, and the contract clauses it does not meet yet."""

    name: str
    adapter: Any
    gaps: dict[str, str] = field(default_factory=dict)
    # A second adapter on the same backing store: another process, or function instance.
    twin: Any = None

    @contextmanager
    def clause(self, gap: str) -> Iterator[None]:
        """Assert one clause: a failure inside is an xfail if the adapter has this gap."""
        try:
            yield
        # pytest.raises reports "did not raise" as pytest.fail's exception.
        except (AssertionError, TypeError, ValueError, OSError, pytest.fail.Exception) as e:
            if gap in self.gaps:
                pytest.xfail(f"{self.name}: {self.gaps[gap]} ({type(e).__name__}: {e})")
            raise


@pytest.fixture(params=["sqlite", pytest.param("firestore", marks=pytest.mark.emulator)])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    """The StateStore under contract: SQLite, and Firestore on the emulator."""
    if request.param == "sqlite":
        yield Subject("SqliteStateStore", SqliteStateStore(tmp_path / "state.db"),
                      twin=SqliteStateStore(tmp_path / "state.db"))
        return
    from mldiag.adapters.gcp.state import FirestoreStateStore

    emu: Emulators = request.getfixturevalue("emu")
    # A database per test: the emulator keeps each apart, so nothing needs clearing.
    database = unique("contract-")
    yield Subject("FirestoreStateStore",
                  FirestoreStateStore(client=emu.firestore_client(database)),
                  twin=FirestoreStateStore(client=emu.firestore_client(database)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    stop_shared_emulators()
