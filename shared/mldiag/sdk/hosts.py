"""Which host name this process takes: every process of a job is its own target.

A session holds one `<host>.xplane.pb` per host, so two processes under one name overwrite
each other's trace. The name is the machine's (`workload.hostname()`) plus a suffix when the
machine is shared:

- in a multi-process JAX job (`jax.process_count() > 1`), `-<process index>`: stable across
  restarts, and the same on every machine of the job;
- otherwise, when another process of the same run already holds the name on this machine
  (several independent processes, all process index 0), `-<slot>`, the lowest slot free.

A slot is held with a lock file under the temporary directory (released by the kernel when
the process dies, so a crashed process frees its name) and, for machines whose processes do
not share that directory (containers of one pod share the host name, not /tmp), with the
run's live targets: a name a live process elsewhere registered is not taken again.
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# More processes than this under one name on one machine is a bug, not a job.
MAX_SLOTS = 1024
# Ports tried for the profiler server after the default one.
MAX_PORTS = 64


@dataclass
class HostSlot:
    """This process's host name and the lock files that reserve it (and its profiler port)
    on this machine."""

    name: str
    _fd: int | None = None
    _port_fd: int | None = None

    def release(self) -> None:
        """Give the name and port back (the run closed). Idempotent."""
        for attr in ("_fd", "_port_fd"):
            fd = getattr(self, attr)
            setattr(self, attr, None)
            if fd is not None:
                os.close(fd)

    def claim_port(self, first: int, listening: Callable[[int], bool],
                   lock_dir: Path | None = None) -> int:
        """The first port from `first` that no other mldiag process on this machine reserved
        and nothing listens on, reserved for this run's profiler server.

        jax's profiler server binds with SO_REUSEPORT: a second server on a taken port starts
        without an error and the two processes then share the connections, so a push capture
        would trace whichever answered. Hence the check, not the bind, decides.
        """
        directory = _lock_dir() if lock_dir is None else lock_dir
        for port in range(first, min(first + MAX_PORTS, 65536)):
            fd = _try_lock(directory / f"port.{port}.lock")
            if fd is None:
                continue
            if listening(port):
                os.close(fd)
                continue
            if port != first:
                log.warning("mldiag: port %d is taken on this machine; the profiler server of "
                            "%s listens on %d", first, self.name, port)
            self._port_fd = fd
            return port
        raise RuntimeError(f"no free profiler port in {first}..{first + MAX_PORTS - 1}")


def _lock_dir() -> Path:
    path = Path(tempfile.gettempdir()) / f"mldiag-hosts-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def claim(run: str, base: str, *, process_index: int, process_count: int,
          taken: Callable[[], Collection[str]] = frozenset, lock_dir: Path | None = None
          ) -> HostSlot:
    """Reserve this process's host name in `run`, from the machine's name `base`.

    `taken` gives the names that live processes of the run registered (checked only for a
    name this machine's lock files leave free). The caller releases the slot when the run
    closes.
    """
    directory = _lock_dir() if lock_dir is None else lock_dir
    if process_count > 1:
        # The job numbers its processes: that index is this process's, on any machine.
        name = f"{base}-{process_index}"
        return HostSlot(name, _try_lock(directory / f"{run}.{name}.lock"))
    in_use: Collection[str] | None = None
    for slot in range(MAX_SLOTS):
        name = base if slot == 0 else f"{base}-{slot}"
        fd = _try_lock(directory / f"{run}.{name}.lock")
        if fd is None:
            continue
        if in_use is None:
            in_use = set(taken())
        if name in in_use:
            os.close(fd)
            continue
        if slot:
            log.warning("mldiag: host name %s is taken by another process of run %s on this "
                        "machine; this process is %s", base, run, name)
        return HostSlot(name, fd)
    raise RuntimeError(f"{MAX_SLOTS} processes of run {run} already use host name {base} here")
