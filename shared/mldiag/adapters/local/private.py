"""Owner-only files for the embedded backend. The state database (tokens' hashes, share links,
sessions), the bucket (profiles) and the console's viewer cache are created 0700 (directories)
and 0600 (files), whatever the umask; directories that already exist are left as they are,
except a root made owner-only with `owner_only_dir`."""

from __future__ import annotations

import os
import threading
from pathlib import Path

DIR_MODE, FILE_MODE = 0o700, 0o600


def private_dir(path: Path) -> Path:
    """Make `path` and its missing parents, each new one owner-only."""
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile by another thread or process
        os.chmod(d, DIR_MODE)  # the umask may have taken bits of the mode away
    return path


def owner_only_dir(path: Path) -> Path:
    """`private_dir(path)`, and `path` made owner-only if it already was one of ours open to
    others (a cache made before it was private): what lies below it is then out of reach."""
    private_dir(path)
    st = path.stat()
    if st.st_uid == os.geteuid() and st.st_mode & 0o077:
        os.chmod(path, DIR_MODE)
    return path


def create_private(path: Path) -> int:
    """Create `path` (which must not exist) owner-only, open for writing: its descriptor."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return fd


def private_file(path: Path) -> None:
    """Create `path` empty and owner-only if it is absent; one of ours that is readable by
    others (made before files were owner-only) is made owner-only."""
    try:
        os.close(create_private(path))
    except FileExistsError:
        st = path.stat()
        if st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.chmod(path, FILE_MODE)


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to a new owner-only file `path`."""
    with os.fdopen(create_private(path), "wb") as f:
        f.write(data)


def replace_private(path: Path, data: bytes) -> None:
    """Replace `path` with a new owner-only file holding `data` (written aside, then renamed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.unlink(missing_ok=True)
    write_private(tmp, data)
    tmp.replace(path)


def open_private(path: Path) -> int:
    """Open `path` for reading and writing, created owner-only when absent: its descriptor."""
    return os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
