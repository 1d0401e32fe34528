"""LocalDirStorage: the profile bucket as a local directory, and its watcher.

Writes through the port are atomic (temp file + rename) and emit an object-finalize event.
Files dropped in from outside are turned into the same events by `DirectoryWatcher`, once
their size and mtime have held still for the stability window, so a file still being copied
is never analysed half-written.

A finalize event goes out before the file is hashed: hashing 2 GB takes seconds, and four
hosts dropped at once must register at once. Each profile is hashed afterwards on one
background thread (`hash_later`), and the hash is kept by (name, generation), so the
same-bytes check of a later rewrite (`content_hash`) finds it without reading the old bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from mldiag.adapters.local.periodic import Periodic
from mldiag.adapters.local.private import create_private, private_dir, write_private
from mldiag.errors import ProfileUnreadable
from mldiag.model import XPLANE_SUFFIXES
from mldiag.ports import ObjectInfo

FinalizeFn = Callable[[ObjectInfo], None]
# Generations of one object whose hashes are kept (see LocalDirStorage._hashes).
HASHES_KEPT = 2


class OutsideBucket(ProfileUnreadable):
    """An object whose path leads out of the bucket through a symlink: never read or written.

    Permanent: the session that names it fails with this reason."""


def _generation(st: os.stat_result) -> str:
    return f"{st.st_mtime_ns}-{st.st_size}"


def _copy_private(src: Path, dest: Path) -> None:
    """Copy `src` to a new owner-only file `dest`."""
    with open(src, "rb") as f, os.fdopen(create_private(dest), "wb") as out:
        shutil.copyfileobj(f, out, 8 * 1024**2)


def _is_temporary(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base.startswith(".") or base.endswith((".tmp", ".part", ".partial", ".crdownload"))


class LocalDirStorage:
    """The embedded storage adapter over `root` (`$MLDIAG_HOME/bucket`)."""

    def __init__(self, root: Path, on_finalize: FinalizeFn | None = None) -> None:
        self.root = root.resolve()
        self.bucket = "local"
        self.on_finalize = on_finalize
        private_dir(self.root)
        # Generations this process wrote or already reported, so the watcher skips them.
        self.reported: dict[str, str] = {}
        self._lock = threading.Lock()
        # name -> {generation: content hash} of the last HASHES_KEPT generations hashed: the
        # registered one's stays known while its rewrite is being hashed.
        self._hashes: dict[str, dict[str, str]] = {}
        self._to_hash: queue.SimpleQueue[ObjectInfo] = queue.SimpleQueue()
        self._hasher: threading.Thread | None = None

    def _path(self, name: str) -> Path:
        if not name or name.startswith("/") or any(p in ("", ".", "..") for p in name.split("/")):
            raise ValueError(f"unsafe object name {name!r}")
        if any(ord(c) < 32 or ord(c) == 127 for c in name):
            raise ValueError(f"unsafe object name {name!r}: control characters")
        # Segments were checked above, so the path stays inside the bucket lexically; a
        # symlink (of the file or of a directory on the way) must not lead out of it either.
        path = self.root / name
        try:
            real = path.resolve()
        except (OSError, RuntimeError) as e:  # a symlink loop
            raise OutsideBucket(f"{name}: cannot be resolved ({e})") from e
        if not real.is_relative_to(self.root):
            raise OutsideBucket(f"{name} is a symlink to {real}, outside the bucket "
                                f"{self.root}: refused (copy the file in instead)")
        return path

    def _info(self, name: str, st: os.stat_result) -> ObjectInfo:
        return ObjectInfo(name=name, size=st.st_size, generation=_generation(st),
                          updated=st.st_mtime)

    def stat(self, name: str) -> ObjectInfo | None:
        try:
            return self._info(name, self._path(name).stat())
        except FileNotFoundError:
            return None

    def read_bytes(self, name: str) -> bytes:
        return self._path(name).read_bytes()

    def write_bytes(
        self, name: str, data: bytes, *, content_type: str = "application/octet-stream",
        if_absent: bool = False,
    ) -> ObjectInfo:
        """Write atomically; with `if_absent`, FileExistsError if the object exists."""
        path = self._path(name)
        private_dir(path.parent)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.unlink(missing_ok=True)  # a crashed write's leftover
        write_private(tmp, data)
        if if_absent:
            try:
                # link() fails if the name exists: a create-only write, atomically.
                os.link(tmp, path)
            except FileExistsError:
                tmp.unlink()
                raise FileExistsError(f"object {name} already exists") from None
            tmp.unlink()
        else:
            tmp.replace(path)
        info = self._info(name, path.stat())
        self.emit(info)
        return info

    def fetch_to(self, name: str, path: Path) -> None:
        src = self._path(name)
        if not src.is_file():
            raise FileNotFoundError(f"no such object: {name}")
        private_dir(path.parent)
        path.unlink(missing_ok=True)
        try:
            os.link(src, path)  # objects are replaced, never written in place
        except OSError:
            _copy_private(src, path)

    def put_file(self, name: str, path: Path, *,
                 content_type: str = "application/octet-stream") -> ObjectInfo:
        dest = self._path(name)
        private_dir(dest.parent)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.unlink(missing_ok=True)
        _copy_private(path, tmp)
        tmp.replace(dest)
        info = self._info(name, dest.stat())
        self.emit(info)
        return info

    def known_hash(self, info: ObjectInfo) -> str:
        """The content hash of `info`'s generation if it was hashed already, else ""."""
        with self._lock:
            return self._hashes.get(info.name, {}).get(info.generation, "")

    # Where the objects' superseded marks are kept (a dot file: no object, never listed).
    SUPERSEDED = ".superseded.json"

    def supersede(self, name: str, at: float) -> None:
        if not self._path(name).is_file():
            return
        with self._lock:
            marks = self.superseded()
            if name in marks:
                return  # a mark is never moved later
            marks[name] = at
            tmp = self.root / f"{self.SUPERSEDED}.{os.getpid()}.{threading.get_ident()}.tmp"
            write_private(tmp, json.dumps(marks).encode())
            tmp.replace(self.root / self.SUPERSEDED)

    def superseded(self) -> dict[str, float]:
        """Object name -> when it was marked superseded (`supersede`), for `mldiag gc`."""
        try:
            marks = json.loads((self.root / self.SUPERSEDED).read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return {str(k): float(v) for k, v in marks.items()
                if isinstance(v, (int, float))} if isinstance(marks, dict) else {}

    def delete(self, name: str) -> None:
        """Remove an object, and its superseded mark (`mldiag gc`); gone already is fine."""
        self._path(name).unlink(missing_ok=True)
        with self._lock:
            marks = self.superseded()
            if marks.pop(name, None) is not None:
                tmp = self.root / f"{self.SUPERSEDED}.{os.getpid()}.{threading.get_ident()}.tmp"
                write_private(tmp, json.dumps(marks).encode())
                tmp.replace(self.root / self.SUPERSEDED)

    def content_hash(self, info: ObjectInfo) -> str:
        """`md5:<base64>` of the object's bytes, as GCS reports it; "" when the object changed
        from `info`'s generation meanwhile (then its next event brings the right one). A
        generation hashed before (`hash_later`) is not read again."""
        known = self.known_hash(info)
        if known:
            return known
        digest = hashlib.md5(usedforsecurity=False)
        try:
            path = self._path(info.name)
            with open(path, "rb") as f:
                while chunk := f.read(8 * 1024**2):
                    digest.update(chunk)
            if _generation(path.stat()) != info.generation:
                return ""
        except (OSError, ProfileUnreadable):  # gone, unreadable, or out of the bucket
            return ""
        found = "md5:" + base64.b64encode(digest.digest()).decode()
        with self._lock:
            kept = self._hashes.setdefault(info.name, {})
            kept[info.generation] = found
            for old in list(kept)[:-HASHES_KEPT]:
                del kept[old]
        return found

    def hash_later(self, info: ObjectInfo) -> None:
        """Hash `info`'s generation on the background hasher (one thread, in arrival order),
        so that a later rewrite of the same bytes is known as such."""
        with self._lock:
            if self._hasher is None or not self._hasher.is_alive():
                self._hasher = threading.Thread(target=self._hash_queued,
                                                name="mldiag-hasher", daemon=True)
                self._hasher.start()
        self._to_hash.put(info)

    def _hash_queued(self) -> None:
        while True:
            info = self._to_hash.get()
            current = self.reported.get(info.name)
            if current is not None and current != info.generation:
                continue  # rewritten meanwhile: that generation's bytes are gone
            self.content_hash(info)

    def emit(self, info: ObjectInfo) -> None:
        """Report a finalized object once per generation."""
        with self._lock:
            if self.reported.get(info.name) == info.generation:
                return
            self.reported[info.name] = info.generation
        if self.on_finalize is not None:
            self.on_finalize(info)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        out = []
        # Walk only the directory that holds the prefix (the sweeper lists one session's).
        try:
            top = self._path(prefix.rsplit("/", 1)[0]) if "/" in prefix else self.root
        except (ValueError, ProfileUnreadable):
            return []
        for dirpath, _, files in os.walk(top):
            for f in files:
                path = Path(dirpath) / f
                name = path.relative_to(self.root).as_posix()
                if name.startswith(prefix) and not _is_temporary(name):
                    try:
                        out.append(self._info(name, path.stat()))
                    except OSError:
                        continue
        return sorted(out, key=lambda o: o.name)

    def uri(self, name: str) -> str:
        return (self.root / name).as_uri()

    @contextmanager
    def local_files(self, names: Sequence[str], *,
                    generations: Mapping[str, str] | None = None,
                    max_bytes: int | None = None) -> Iterator[Path]:
        paths = [self._path(n) for n in names]
        parents = {p.parent for p in paths}
        if len(parents) != 1:
            raise ValueError("local_files needs objects of one directory")
        missing = [n for n, p in zip(names, paths, strict=True) if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"no such object(s): {', '.join(missing)}")
        for name, path in zip(names, paths, strict=True):
            check_pinned(name, self._info(name, path.stat()), generations, max_bytes)
        yield parents.pop()


def check_pinned(name: str, info: ObjectInfo, generations: Mapping[str, str] | None,
                 max_bytes: int | None) -> None:
    """The object is the generation that was registered, and within the size cap."""
    wanted = (generations or {}).get(name)
    # A generation of another store (a GCS event replayed on a local bucket) cannot be
    # compared with ours (`<mtime_ns>-<size>`).
    if wanted and "-" in wanted and info.generation != wanted:
        raise ProfileUnreadable(f"{name.rsplit('/', 1)[-1]}: rewritten since it was registered "
                                f"(generation {info.generation}, not {wanted}); the new "
                                "generation is analysed as the next version")
    if max_bytes is not None and info.size > max_bytes:
        raise ProfileUnreadable(f"{name.rsplit('/', 1)[-1]}: {info.size / 1024**3:.2f} GiB is "
                                f"over the per-host cap of {max_bytes / 1024**3:.2f} GiB")


class DirectoryWatcher:
    """Polls the bucket directory and reports profile files once they stop changing."""

    def __init__(self, storage: LocalDirStorage, stability_s: float = 0.3,
                 poll_s: float = 0.1) -> None:
        self.storage = storage
        self.stability_s = stability_s
        self.poll_s = poll_s
        # name -> (generation, first time seen with that generation)
        self._candidates: dict[str, tuple[str, float]] = {}
        self._loop = Periodic("mldiag-watcher", self.scan, poll_s)

    def scan(self, now: float | None = None) -> int:
        """One pass: emit every profile file that has been stable long enough."""
        now = time.monotonic() if now is None else now
        emitted = 0
        seen: set[str] = set()
        for dirpath, _, files in os.walk(self.storage.root):
            for f in files:
                if not f.endswith(XPLANE_SUFFIXES) or _is_temporary(f):
                    continue
                path = Path(dirpath) / f
                name = path.relative_to(self.storage.root).as_posix()
                try:
                    st = path.stat()
                except OSError:
                    # A symlink loop, a name too long, no permission: skip this file, never
                    # the rest of the bucket.
                    continue
                seen.add(name)
                gen = _generation(st)
                if self.storage.reported.get(name) == gen:
                    continue
                prev = self._candidates.get(name)
                # Unchanged across polls for the window, or (first sighting) last written
                # longer ago than the window by its mtime: either way it has held still.
                settled_by_mtime = time.time() - st.st_mtime >= self.stability_s
                if (prev is None or prev[0] != gen) and not settled_by_mtime:
                    self._candidates[name] = (gen, now)
                    continue
                if settled_by_mtime or (prev is not None and now - prev[1] >= self.stability_s):
                    self.storage.emit(ObjectInfo(name=name, size=st.st_size, generation=gen,
                                                 updated=st.st_mtime))
                    emitted += 1
        for gone in set(self._candidates) - seen:
            del self._candidates[gone]
        return emitted

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()
