"""Where a session's XProf viewer caches live in the bucket, and what building or opening
them needs: the names the pipeline's prebuild (`viewer_prebuild`), the console's viewer
(`viewer`) and the stages share.

The caches are kept under one prefix of their own, `xprof-cache/<session dir>/analysis/<key>/`
(`cache_prefix`), so that the bucket's lifecycle can expire them apart from the profiles and
the reports (terraform `viewer_cache_retention_days`): an expired cache is rebuilt on demand
(the console asks for it, `rebuild_message`). Inside, a manifest is written last, or
`skipped.json` says why they were not built. The key covers the hosts' generations and the
xprof version, so a new host or a new xprof never reads a stale cache. The xplanes of the
cache (a windowed host's windows and stubs, as large as the host together) are stored gzipped
(`put`, `fetch`): 2.6 times smaller, and never named like a profile.

xprof's viewer conversions read a whole host in memory (`PREBUILD_RSS_PER_BYTE`):
`prebuild_memory_bytes` is what a prebuild needs, and `unviewable` why a console cannot open
a session that was not prebuilt.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import secrets
import shutil
import zlib
from collections.abc import Mapping
from pathlib import Path

from mldiag.adapters.local.private import FILE_MODE, create_private
from mldiag.errors import MldiagError
from mldiag.limits import MAX_HOST_BYTES, size_text
from mldiag.messages import PrebuildViewer
from mldiag.model import REPORTED, SessionRecord
from mldiag.ports import Storage

MANIFEST = "manifest.json"


def window_host(host: str, k: int) -> str:
    """The name a large host's time window `k` is viewed under (its file's stem)."""
    return f"{host}.window{k:02d}"


def xprof_version() -> str:
    from xprof import version

    return str(version.__version__)


def session_dir(session: SessionRecord) -> str:
    """The bucket prefix of a session's objects (`<run>/plugins/profile/<session>`)."""
    any_host = next(iter(session.hosts.values()))
    return any_host.object_name.rsplit("/", 1)[0]


def arrived_hosts(session: SessionRecord) -> dict[str, str]:
    """host -> object name, for the hosts whose profile arrived."""
    return {h: r.object_name for h, r in sorted(session.hosts.items())
            if r.status == "ARRIVED"}


def cache_key(session: SessionRecord) -> str:
    """Changes with any host's generation and with the xprof version."""
    parts = [session.run, session.session, xprof_version()] + [
        f"{h}={r.object_name}#{r.generation}" for h, r in sorted(session.hosts.items())
        if r.status == "ARRIVED"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


# Every viewer cache lies under this prefix of the bucket, which a lifecycle rule selects
# (GCS conditions select by prefix or suffix only, and sessions lie at any depth).
CACHE_ROOT = "xprof-cache"


def cache_prefix(session: SessionRecord) -> str:
    """`xprof-cache/<session dir>/analysis/<key>`. The `analysis` segment is what keeps any
    object here from passing for an upload (`model.parse_object_name` never takes what lies
    under a session's `analysis/`), whatever its name."""
    return f"{CACHE_ROOT}/{session_dir(session)}/analysis/{cache_key(session)}"


# The cache's xplanes are kept gzipped: objects `<rel>.gz`, files `<rel>` in a workspace.
XPLANE = ".xplane.pb"
GZ = ".gz"
# gzip's fastest level: a window of 125 MB in about 1.6 s, to 39% of its size (a 92 MB
# TPU-shaped host: 35.5 MB).
GZ_LEVEL = 1


class CacheExpired(MldiagError):
    """A file the cache's manifest lists is gone (the bucket's lifecycle deletes a cache's
    objects one by one). Transient: the cache is rebuilt on demand."""


def object_name(prefix: str, rel: str) -> str:
    """The bucket object of the cache file `rel` (a workspace path) under `prefix`."""
    return f"{prefix}/{rel}{GZ if rel.endswith(XPLANE) else ''}"


def put(storage: Storage, prefix: str, rel: str, path: Path) -> None:
    """Store the workspace file `path` as the cache's `rel`; an xplane gzipped."""
    if not rel.endswith(XPLANE):
        storage.put_file(object_name(prefix, rel), path)
        return
    packed = path.with_name(f".{path.name}{GZ}")
    try:
        with path.open("rb") as src, gzip.open(packed, "wb", compresslevel=GZ_LEVEL) as dst:
            shutil.copyfileobj(src, dst, 1024**2)
        storage.put_file(object_name(prefix, rel), packed, content_type="application/gzip")
    finally:
        packed.unlink(missing_ok=True)


def fetch(storage: Storage, prefix: str, rel: str, dest: Path, *,
          max_bytes: int = MAX_HOST_BYTES) -> None:
    """Fetch the cache's `rel` to `dest`, an xplane unzipped. The object is untrusted: one
    that unzips past `max_bytes` (no host is larger) or is not gzip is refused, and nothing is
    left at `dest`. CacheExpired when the object is gone.

    `dest` is replaced, never written into: a window not fetched yet is a hard link to its
    host's stub, shared by the host's other windows."""
    name = object_name(prefix, rel)
    part = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    try:
        try:
            storage.fetch_to(name, part)  # another OSError (the bucket unreachable) is not ours
        except FileNotFoundError as e:
            raise CacheExpired(f"the viewer cache lacks {rel}") from e
        if part.stat().st_nlink == 1:
            os.chmod(part, FILE_MODE)  # a download (a hard link keeps the bucket's mode)
        if rel.endswith(XPLANE):
            _unzip(part, dest, rel, max_bytes)
        else:
            part.replace(dest)
    finally:
        part.unlink(missing_ok=True)


def _unzip(packed: Path, dest: Path, rel: str, max_bytes: int) -> None:
    out = dest.with_name(f".{dest.name}.{os.getpid()}.unzipped")
    try:
        written = 0
        out.unlink(missing_ok=True)
        with gzip.open(packed, "rb") as src, os.fdopen(create_private(out), "wb") as dst:
            while chunk := src.read(1024**2):
                written += len(chunk)
                if written > max_bytes:
                    raise ValueError(f"{rel} unzips past {size_text(max_bytes)}")
                dst.write(chunk)
        out.replace(dest)
    except (OSError, EOFError, ValueError, zlib.error) as e:
        raise CacheExpired(f"the viewer cache's {rel} cannot be read: {e}") from e
    finally:
        out.unlink(missing_ok=True)


# Why a session's caches were not prebuilt (JSON), beside where the manifest would be.
SKIPPED = "skipped.json"
# The prebuild's peak resident memory per byte of the largest host, over a base: xprof's
# converters read the whole trace (a 468 MB TPU-shaped host: the overview 6.8 GB, the trace
# viewer 8.1 GB, in 64 s; BENCHMARKS.md, "XProf viewer"). The hosts' files count too: /tmp
# is memory on Cloud Functions.
PREBUILD_RSS_PER_BYTE = 17.5
PREBUILD_BASE_BYTES = 300 * 1024**2


def over_budget(sizes: Mapping[str, int], budget: int | None) -> str | None:
    """Why converting the largest of these hosts, viewed whole, would not fit `budget` (a
    console's memory), or None."""
    if budget is None or not sizes:
        return None
    host, size = max(sizes.items(), key=lambda kv: kv[1])
    need = PREBUILD_BASE_BYTES + PREBUILD_RSS_PER_BYTE * size
    if need <= budget:
        return None
    return (f"host {host} is {size / 1024**2:,.1f} MB: xprof's viewer conversions need "
            f"about {size_text(need)}, over this console's {size_text(budget)}")


def unviewable(session: SessionRecord, storage: Storage,
               memory_budget: int | None) -> str | None:
    """Why a console with `memory_budget` cannot open `session`'s viewer now, or None.

    A session without prebuilt caches is converted on demand, which needs its hosts' files
    here and memory for the largest host viewed whole. When that is over the budget, opening
    it would only fetch gigabytes (a 2 GB host, or dozens) and then refuse every tool: it is
    refused before anything is fetched, saying why and whether the prebuild is still to come
    (its `skipped.json` says why it never will). A prebuilt session always opens: its large
    hosts are viewed in windows that each fit."""
    sizes = {h: r.size for h, r in session.hosts.items() if r.status == "ARRIVED"}
    why = over_budget(sizes, memory_budget)
    if why is None:
        return None
    prefix = cache_prefix(session)
    if storage.stat(f"{prefix}/{MANIFEST}") is not None:
        return None
    if storage.stat(f"{prefix}/{SKIPPED}") is not None:
        try:
            skipped = json.loads(storage.read_bytes(f"{prefix}/{SKIPPED}"))
            reason = str(skipped["reason"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            reason = "not prebuilt (its note cannot be read)"
        return f"the viewer's caches were {reason}; and {why}"
    if session.state != REPORTED:
        return (f"{why}; the viewer's caches are prebuilt once the session is reported "
                f"(it is {session.state})")
    return f"{why}; the viewer's caches are being prebuilt: try again in a few minutes"


def prebuild_memory_bytes(session: SessionRecord) -> int:
    """About how much memory `prebuild` needs for `session`."""
    sizes = [r.size for r in session.hosts.values() if r.status == "ARRIVED"]
    if not sizes:
        return 0
    return int(PREBUILD_BASE_BYTES + PREBUILD_RSS_PER_BYTE * max(sizes) + sum(sizes))


# A REPORTED session's cache can be missing this long after the report only because it
# expired (or was deleted): its prebuild ends within the collect job's hour.
EXPIRED_AFTER_S = 2 * 3600.0
REBUILDING = "rebuilding the viewer cache (expired)…"


def expired(session: SessionRecord, storage: Storage, now: float) -> bool:
    """Whether `session`'s viewer cache was built and is gone: the session was reported over
    EXPIRED_AFTER_S ago, and neither its manifest nor its `skipped.json` is there."""
    if session.state != REPORTED or not arrived_hosts(session):
        return False
    reported = session.timings.get(REPORTED, session.updated_at)
    if now - reported < EXPIRED_AFTER_S:
        return False
    prefix = cache_prefix(session)
    return all(storage.stat(f"{prefix}/{name}") is None for name in (MANIFEST, SKIPPED))


def lacks_files(storage: Storage, prefix: str) -> bool:
    """Whether a file the manifest under `prefix` lists is gone (the lifecycle deletes a
    cache's objects one by one), or the manifest cannot be read."""
    try:
        files = json.loads(storage.read_bytes(f"{prefix}/{MANIFEST}"))["files"]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return True
    return any(storage.stat(object_name(prefix, str(rel))) is None for rel in files)


def rebuild_message(session: SessionRecord, now: float) -> PrebuildViewer:
    """The pipeline's order to rebuild `session`'s expired cache, found gone at `now` (a
    console asks once every `viewer.REBUILD_ASK_S` at most; a rebuild finding the cache whole
    again does nothing). Each order is its own (its claim's key): two within a second, the
    second after the first rebuilt, must not be taken for one redelivered."""
    return PrebuildViewer(run=session.run, session=session.session, version=session.version,
                          rebuild=f"{now:.0f}-{secrets.token_hex(4)}")
