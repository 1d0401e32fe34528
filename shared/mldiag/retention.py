"""What a session keeps, and for how long.

Three kinds of objects expire apart, each selected the way a GCS lifecycle rule can select
(terraform `storage.tf`):
- the viewer caches, by their prefix (`viewer_cache.CACHE_ROOT`), `cache_days` after they
  were built; an expired cache is rebuilt on demand (`viewer_cache.expired`);
- superseded objects, by their mark (`Storage.supersede`: a customTime on GCS),
  `superseded_days` after the mark: a session's older analysis versions
  (`analysis/v<k>/`, k below the version reported) and the reported version's collect
  windows (`analysis/v<n>/windows/`, combined into its op_stats), marked when the version
  is reported (`mark_superseded`);
- the raw profiles, by their suffix (`model.XPLANE_SUFFIXES`), `profile_days` after upload.

On GCS the bucket's lifecycle deletes them; locally `mldiag gc` does (`collect_garbage`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mldiag.model import XPLANE_SUFFIXES, SessionRecord
from mldiag.ports import Storage
from mldiag.viewer_cache import CACHE_ROOT

if TYPE_CHECKING:  # gc is local only; the stages on GCP never load the local adapter
    from mldiag.adapters.local.storage import LocalDirStorage

log = logging.getLogger(__name__)

DAY = 86400.0
_VERSION = re.compile(r"^v([0-9]{1,9})$")


def superseded_names(storage: Storage, analysis_dir: str, version: int) -> list[str]:
    """The objects under a session's `analysis_dir` that nothing reads once `version` is
    reported: every older version's (`v<k>/`, k < version) and this version's collect
    windows (`v<version>/windows/`)."""
    out = []
    for info in storage.list(f"{analysis_dir}/v"):
        parts = info.name[len(analysis_dir) + 1:].split("/")
        m = _VERSION.match(parts[0])
        if m is None or len(parts) < 2:
            continue
        k = int(m.group(1))
        if k < version or (k == version and parts[1] == "windows"):
            out.append(info.name)
    return out


def mark_superseded(storage: Storage, analysis_dir: str, s: SessionRecord,
                    now: float) -> int:
    """Mark what `s`'s version supersedes (`superseded_names`); returns how many."""
    names = superseded_names(storage, analysis_dir, s.version)
    for name in names:
        storage.supersede(name, now)
    if names:
        log.info("%s/%s v%d: %d superseded objects marked", s.run, s.session, s.version,
                 len(names))
    return len(names)


@dataclass(frozen=True)
class Retention:
    """Days each kind is kept (0: forever), as terraform's variables of the same names."""

    cache_days: float = 14.0
    superseded_days: float = 7.0
    profile_days: float = 0.0


@dataclass
class Removed:
    caches: list[str] = field(default_factory=list)
    superseded: list[str] = field(default_factory=list)
    profiles: list[str] = field(default_factory=list)

    def bytes_of(self, sizes: dict[str, int]) -> int:
        return sum(sizes.get(n, 0) for n in (*self.caches, *self.superseded, *self.profiles))


def collect_garbage(storage: LocalDirStorage, retention: Retention, now: float, *,
                    dry_run: bool = False) -> tuple[Removed, int]:
    """Delete from a local bucket what `retention` no longer keeps, as the GCS lifecycle
    would; returns what went (or would go, with `dry_run`) and its bytes."""
    removed = Removed()
    objects = storage.list("")
    sizes = {o.name: o.size for o in objects}
    marks = storage.superseded()
    for o in objects:
        age = now - o.updated
        if o.name.startswith(f"{CACHE_ROOT}/"):
            if retention.cache_days and age >= retention.cache_days * DAY:
                removed.caches.append(o.name)
        elif o.name in marks:
            if retention.superseded_days and now - marks[o.name] >= (
                    retention.superseded_days * DAY):
                removed.superseded.append(o.name)
        elif o.name.endswith(XPLANE_SUFFIXES):
            if retention.profile_days and age >= retention.profile_days * DAY:
                removed.profiles.append(o.name)
    if not dry_run:
        for name in (*removed.caches, *removed.superseded, *removed.profiles):
            storage.delete(name)
    return removed, removed.bytes_of(sizes)
