"""Where a session's XProf viewer caches live in the bucket, and what building or opening
them needs: the names the pipeline's prebuild (`viewer_prebuild`), the console's viewer
(`viewer`) and the stages share.

The caches are kept under the session (`<session dir>/analysis/xprof_cache/<key>/`), with a
manifest written last, or `skipped.json` saying why they were not built. The key covers the
hosts' generations and the xprof version, so a new host or a new xprof never reads a stale
cache. xprof's viewer conversions read a whole host in memory (`PREBUILD_RSS_PER_BYTE`):
`prebuild_memory_bytes` is what a prebuild needs, and `unviewable` why a console cannot open
a session that was not prebuilt.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from mldiag.limits import size_text
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


def cache_prefix(session: SessionRecord) -> str:
    return f"{session_dir(session)}/analysis/xprof_cache/{cache_key(session)}"


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
