"""GcsStorage: the profile bucket on Google Cloud Storage.

Large xplanes (up to the 2 GiB per-host cap) are never held in memory: `local_files` downloads
each object in byte ranges, in parallel threads, straight into a local temp file, every range
pinned to the generation first seen, then checks the whole file against the object's CRC32C.
Create-only writes use the `ifGenerationMatch=0` precondition. Object names are validated
before any request, so a name with path tricks never reaches the bucket (or the temp dir).
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import google_crc32c
from google.api_core import exceptions as gexc
from google.api_core.retry import Retry
from google.cloud.storage import Bucket, Client
from google.cloud.storage.retry import DEFAULT_RETRY

from mldiag.errors import MldiagError, ProfileUnreadable
from mldiag.ports import ObjectInfo

log = logging.getLogger(__name__)

MIB = 1024**2
# GCS limits an object name to 1024 bytes of UTF-8.
MAX_NAME_BYTES = 1024


class ObjectChanged(MldiagError, RuntimeError):
    """An object was rewritten while it was being downloaded.

    Transient: read it again.
    """


def validate_object_name(name: str) -> str:
    """Return `name` if it is a plain relative object name; raise ValueError otherwise.

    Rejected: empty names, a leading "/", empty, "." or ".." segments, control characters and
    names over GCS's 1024-byte limit. GCS itself would accept most of these, but they turn
    into path traversal once a name becomes a local path (xprof reads local files).
    """
    if not name:
        raise ValueError("unsafe object name '': empty")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ValueError(f"unsafe object name {name!r}: control character")
    if name.startswith("/"):
        raise ValueError(f"unsafe object name {name!r}: leading '/'")
    if any(p in ("", ".", "..") for p in name.split("/")):
        raise ValueError(f"unsafe object name {name!r}: empty, '.' or '..' segment")
    if len(name.encode()) > MAX_NAME_BYTES:
        raise ValueError(f"unsafe object name {name[:64]!r}...: over {MAX_NAME_BYTES} bytes")
    return name


def _validate_prefix(prefix: str) -> str:
    # A listing prefix may be empty or end with "/", but must not climb or carry controls.
    if prefix:
        validate_object_name(prefix.rstrip("/") or "x/")
    return prefix


def _info(blob: Any) -> ObjectInfo:
    return ObjectInfo(name=blob.name, size=int(blob.size or 0), generation=str(blob.generation),
                      updated=blob.updated.timestamp() if blob.updated else 0.0)


class GcsStorage:
    """The storage port over one GCS bucket.

    `client` is a `google.cloud.storage.Client` (built from `project` when omitted, which uses
    the ambient credentials). `chunk_size` and `workers` shape the ranged downloads of
    `local_files`; `tmp_dir` is where they land (the system temp dir by default).
    """

    def __init__(
        self,
        bucket: str,
        *,
        client: Client | None = None,
        project: str | None = None,
        chunk_size: int = 64 * MIB,
        workers: int = 8,
        tmp_dir: Path | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        if not bucket:
            raise ValueError("GcsStorage needs a bucket name (MLDIAG_BUCKET)")
        if chunk_size <= 0 or workers <= 0:
            raise ValueError("chunk_size and workers must be positive")
        self.bucket = bucket
        self._client = client
        self._project = project
        self.chunk_size = chunk_size
        self.workers = workers
        self.tmp_dir = tmp_dir
        self.timeout_s = timeout_s
        # How many ranged reads local_files made: a 2 GiB object must never be one read.
        self.ranged_reads = 0
        self._lock = threading.Lock()

    @property
    def client(self) -> Client:
        # Built on first use, not in the constructor: nothing connects at bootstrap.
        with self._lock:
            if self._client is None:
                self._client = Client(project=self._project or None)
            return self._client

    def _bucket(self) -> Bucket:
        return self.client.bucket(self.bucket)

    def stat(self, name: str) -> ObjectInfo | None:
        blob = self._bucket().get_blob(validate_object_name(name), timeout=self.timeout_s)
        return None if blob is None else _info(blob)

    def content_hash(self, info: ObjectInfo) -> str:
        """GCS's own hash of that generation, from its metadata (finalize events carry it,
        so intake rarely asks)."""
        generation = int(info.generation) if info.generation.isdigit() else None
        blob = self._bucket().get_blob(validate_object_name(info.name), generation=generation,
                                       timeout=self.timeout_s)
        if blob is None or str(blob.generation) != info.generation:
            return ""
        return f"md5:{blob.md5_hash}" if blob.md5_hash else (
            f"crc32c:{blob.crc32c}" if blob.crc32c else "")

    def read_bytes(self, name: str) -> bytes:
        blob = self._bucket().blob(validate_object_name(name))
        try:
            return bytes(blob.download_as_bytes(timeout=self.timeout_s))
        except gexc.NotFound as e:
            raise FileNotFoundError(f"{self.uri(name)} does not exist") from e

    def write_bytes(
        self, name: str, data: bytes, *, content_type: str = "application/octet-stream",
        if_absent: bool = False,
    ) -> ObjectInfo:
        """Write an object (the bucket emits its finalize event).

        With `if_absent`, the write only creates: it raises FileExistsError when the object
        exists, atomically (GCS's `ifGenerationMatch=0` precondition).
        """
        blob = self._bucket().blob(validate_object_name(name))
        # An unconditional upload is not retried by default; rewriting an artifact with the
        # same content is harmless, so retry it like any idempotent call.
        retry: Retry = DEFAULT_RETRY
        try:
            blob.upload_from_string(data, content_type=content_type,
                                    if_generation_match=0 if if_absent else None,
                                    retry=retry, timeout=self.timeout_s)
        except gexc.PreconditionFailed as e:
            raise FileExistsError(f"{self.uri(name)} already exists") from e
        return _info(blob)

    def fetch_to(self, name: str, path: Path) -> None:
        validate_object_name(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._download(name, path)

    def put_file(self, name: str, path: Path, *,
                 content_type: str = "application/octet-stream") -> ObjectInfo:
        blob = self._bucket().blob(validate_object_name(name))
        blob.upload_from_filename(str(path), content_type=content_type,
                                  retry=DEFAULT_RETRY, timeout=self.timeout_s)
        return _info(blob)

    def create_bytes(self, name: str, data: bytes, *,
                     content_type: str = "application/octet-stream") -> ObjectInfo:
        """Create an object that must not exist yet (FileExistsError if it does)."""
        return self.write_bytes(name, data, content_type=content_type, if_absent=True)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        blobs = self.client.list_blobs(self.bucket, prefix=_validate_prefix(prefix) or None,
                                       timeout=self.timeout_s)
        return sorted((_info(b) for b in blobs), key=lambda o: o.name)

    def uri(self, name: str) -> str:
        return f"gs://{self.bucket}/{name}"

    def supersede(self, name: str, at: float) -> None:
        blob = self._bucket().get_blob(validate_object_name(name), timeout=self.timeout_s)
        if blob is None or blob.custom_time is not None:
            return  # gone, or marked already (GCS refuses to move a customTime back)
        blob.custom_time = datetime.fromtimestamp(at, UTC)
        try:
            blob.patch(if_metageneration_match=blob.metageneration, retry=DEFAULT_RETRY,
                       timeout=self.timeout_s)
        except (gexc.NotFound, gexc.PreconditionFailed):
            return  # deleted or marked meanwhile

    @contextmanager
    def local_files(self, names: Sequence[str], *,
                    generations: Mapping[str, str] | None = None,
                    max_bytes: int | None = None) -> Iterator[Path]:
        """Download the objects into one temp directory under their base names.

        Each object is fetched in `chunk_size` ranges by `workers` threads into a file of its
        final size; no object is ever held in memory whole. The directory is removed on exit.
        """
        for n in names:
            validate_object_name(n)
        if len({n.rsplit("/", 1)[0] for n in names}) > 1:
            raise ValueError("local_files needs objects of one directory")
        local = Path(tempfile.mkdtemp(prefix="mldiag-gcs-", dir=self.tmp_dir))
        try:
            for n in names:
                self._download(n, local / n.rsplit("/", 1)[-1],
                               generation=(generations or {}).get(n), max_bytes=max_bytes)
            yield local
        finally:
            shutil.rmtree(local, ignore_errors=True)

    def _download(self, name: str, path: Path, *, generation: str | None = None,
                  max_bytes: int | None = None) -> None:
        # Exactly the generation that was registered (and size-checked), not whatever the
        # object holds now: a rewrite in between is analysed as its own version.
        blob = self._bucket().get_blob(
            name, generation=int(generation) if generation and generation.isdigit() else None,
            timeout=self.timeout_s)
        if blob is None:
            if generation:
                raise ProfileUnreadable(
                    f"{name.rsplit('/', 1)[-1]}: rewritten since it was registered (generation "
                    f"{generation} is gone); the new generation is analysed as the next version")
            raise FileNotFoundError(f"{self.uri(name)} does not exist")
        if max_bytes is not None and int(blob.size or 0) > max_bytes:
            raise ProfileUnreadable(
                f"{name.rsplit('/', 1)[-1]}: {int(blob.size) / 1024**3:.2f} GiB is over the "
                f"per-host cap of {max_bytes / 1024**3:.2f} GiB (nothing was downloaded)")
        if (blob.content_encoding or "").lower() == "gzip":
            # Ranged reads of a gzip-encoded object return decompressed bytes of the whole:
            # it cannot be fetched in parts, and xprof wants the raw xplane anyway.
            raise ProfileUnreadable(
                f"{self.uri(name)} is stored gzip-encoded (Content-Encoding: gzip, as "
                "`gcloud storage cp -Z` uploads): upload the .xplane.pb without compression")
        size, pinned = int(blob.size or 0), int(blob.generation)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # a local copy of a profile is its reader's alone
        with os.fdopen(fd, "wb") as f:
            # The file gets its final size first; each range then writes in place.
            f.truncate(size)
        ranges = [(start, min(start + self.chunk_size, size) - 1)
                  for start in range(0, size, self.chunk_size)]

        def fetch(span: tuple[int, int]) -> None:
            start, end = span
            part = self._bucket().blob(name, generation=pinned if generation else None)
            with path.open("r+b") as f:
                f.seek(start)
                try:
                    # Every range from the generation stat saw: a rewrite in between would
                    # otherwise splice two versions of the file into one.
                    part.download_to_file(f, start=start, end=end, if_generation_match=pinned,
                                          checksum=None, timeout=self.timeout_s)
                except gexc.PreconditionFailed as e:
                    raise ObjectChanged(f"{self.uri(name)} changed while downloading") from e
                if f.tell() != end + 1:
                    raise ObjectChanged(f"{self.uri(name)}: short read of bytes {start}-{end}")
            with self._lock:
                self.ranged_reads += 1

        with ThreadPoolExecutor(max_workers=max(1, min(self.workers, len(ranges))),
                                thread_name_prefix="mldiag-gcs") as pool:
            futures = [pool.submit(fetch, span) for span in ranges]
            try:
                for fut in futures:
                    fut.result()
            except BaseException:
                for fut in futures:
                    fut.cancel()
                raise
        if blob.crc32c:
            self._verify_crc32c(name, path, blob.crc32c)

    def _verify_crc32c(self, name: str, path: Path, expected: str) -> None:
        # Ranged reads carry no whole-object checksum, so check the assembled file, streaming.
        crc = google_crc32c.Checksum()
        with path.open("rb") as f:
            while chunk := f.read(MIB):
                crc.update(chunk)
        actual = base64.b64encode(crc.digest()).decode()
        if actual != expected:
            raise ObjectChanged(f"{self.uri(name)}: CRC32C {actual} of the download differs from "
                                f"the object's {expected} (corrupted or rewritten in transit)")
