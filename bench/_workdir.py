"""Where a bench keeps its profiles and stores: a directory the user names (kept, and reused
by benches that say so), or else a temporary one that is removed when the bench exits. The
TPU-shaped and fan-out benches write gigabytes; a temp dir left behind fills the disk."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path


def workdir(given: str | Path | None, prefix: str) -> Path:
    """`given` as a Path, or a fresh temp dir (named by `prefix`) removed at exit."""
    if given:
        return Path(given)
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
