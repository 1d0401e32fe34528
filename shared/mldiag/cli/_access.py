"""What the access commands (`tokens`, `roles`, `share`) share."""

from __future__ import annotations

import time

from mldiag.access import AccessStore
from mldiag.errors import MldiagError
from mldiag.settings import Settings


def open_store(home: str | None) -> tuple[AccessStore, Settings]:
    """The access store of the settings' backend (SQLite in MLDIAG_HOME, or Firestore)."""
    from mldiag.console.context import open_access

    settings = Settings.from_env(home=home)
    if settings.backend == "local" and not settings.state_db.is_file():
        raise MldiagError(f"no mldiag state in {settings.home} (start `mldiag up` there, or "
                          "set MLDIAG_HOME / --home)")
    return open_access(settings), settings


def when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else ""
