"""Finding and validating the XProf session that a user points mldiag at.

Accepted inputs, as XProf lays them out (`<logdir>/plugins/profile/<session>/<host>.xplane.pb`):
a logdir (or run directory), a session directory, or a single `.xplane.pb` file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mldiag.errors import ProfileUnreadable

XPLANE_SUFFIXES = (".xplane.pb",)
DEFAULT_MAX_HOST_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class ProfileSession:
    """One profile capture: one xplane file per host, all in one session directory."""

    run: str
    name: str
    path: Path
    xplanes: tuple[Path, ...]

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(host_name(p) for p in self.xplanes)

    def describe(self) -> dict[str, object]:
        return {
            "run": self.run,
            "session": self.name,
            "path": str(self.path),
            "hosts": list(self.hosts),
        }


def host_name(xplane: Path) -> str:
    name = xplane.name
    for suffix in XPLANE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return xplane.stem


def _is_xplane(path: Path) -> bool:
    return path.is_file() and path.name.endswith(XPLANE_SUFFIXES)


def _session_from_dir(session_dir: Path) -> ProfileSession | None:
    xplanes = tuple(sorted(p for p in session_dir.iterdir() if _is_xplane(p)))
    if not xplanes:
        return None
    return ProfileSession(
        run=_run_name(session_dir), name=session_dir.name, path=session_dir, xplanes=xplanes
    )


def _run_name(session_dir: Path) -> str:
    # <run>/plugins/profile/<session>: the run is three levels up when the layout is standard.
    parts = session_dir.resolve().parts
    if len(parts) >= 4 and parts[-3:-1] == ("plugins", "profile"):
        return parts[-4]
    return session_dir.parent.name or session_dir.name


def find_sessions(path: str | os.PathLike[str]) -> list[ProfileSession]:
    """Return every session under `path`, oldest name first (XProf names sort by time)."""
    p = Path(path).expanduser().absolute()
    if not p.exists():
        raise ProfileUnreadable(f"{p}: no such file or directory")
    if p.is_file():
        if not p.name.endswith(XPLANE_SUFFIXES):
            raise ProfileUnreadable(f"{p}: not an .xplane.pb file")
        return [
            ProfileSession(run=_run_name(p.parent), name=p.parent.name, path=p.parent, xplanes=(p,))
        ]
    direct = _session_from_dir(p)
    if direct is not None:
        return [direct]
    sessions: list[ProfileSession] = []
    for profile_dir in sorted({x.parent.parent for x in p.glob("**/plugins/profile/*/")}):
        for session_dir in sorted(d for d in profile_dir.iterdir() if d.is_dir()):
            found = _session_from_dir(session_dir)
            if found is not None:
                sessions.append(found)
    if not sessions:
        # A directory of xplanes that does not follow the XProf layout.
        for session_dir in sorted({x.parent for x in p.glob("**/*.xplane.pb")}):
            found = _session_from_dir(session_dir)
            if found is not None:
                sessions.append(found)
    if not sessions:
        raise ProfileUnreadable(f"{p}: no .xplane.pb files found" + _what_else(p))
    return sorted(sessions, key=lambda s: (s.name, str(s.path)))


_EXPORTS = ("*.trace.json.gz", "*.trace.json", "*.json.gz", "*.perfetto-trace", "*.pftrace")


def _what_else(p: Path) -> str:
    """Name what the directory holds instead, and how to get an xplane."""
    found: list[Path] = []
    for pattern in _EXPORTS:
        found += [x for x in p.glob(f"**/{pattern}") if x not in found]
    if not found:
        return ""
    names = ", ".join(x.name for x in sorted(found)[:3]) + (
        f" and {len(found) - 3} more" if len(found) > 3 else "")
    return (f"; it holds {len(found)} trace-viewer export(s) ({names}), which are the trace "
            "viewer's JSON, not a profile: capture the XSpace itself with "
            "`jax.profiler.trace(LOGDIR)` (or `jax.profiler.start_trace`), which writes "
            "LOGDIR/plugins/profile/SESSION/HOST.xplane.pb")


def resolve_session(path: str | os.PathLike[str]) -> ProfileSession:
    """Return the session to analyse for `path`: the newest one when a logdir holds several."""
    return find_sessions(path)[-1]


def validate_xplane(path: Path, max_bytes: int = DEFAULT_MAX_HOST_BYTES) -> int:
    """Check that `path` is a readable, non-empty XSpace within the size cap.

    Returns the number of planes. Raises ProfileUnreadable with a one-line reason.
    """
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ProfileUnreadable(f"{path.name}: cannot stat: {e.strerror}") from e
    if size == 0:
        raise ProfileUnreadable(f"{path.name}: empty file (0 bytes)")
    if size > max_bytes:
        raise ProfileUnreadable(
            f"{path.name}: {size / 1024**3:.2f} GiB exceeds the per-host cap of "
            f"{max_bytes / 1024**3:.2f} GiB"
        )
    from mldiag.analysis.collection.xspace.scan import XSpaceScan

    # Only the planes, lines and metadata are parsed here (a fraction of a second even for
    # gigabyte files); each line's events are checked when a pass first decodes them.
    try:
        with XSpaceScan(path) as scan:
            planes = len(scan.planes)
            lines = sum(len(p.lines) for p in scan.planes)
    except ProfileUnreadable as e:
        raise ProfileUnreadable(f"{path.name}: not a readable XSpace ({e})") from e
    if planes == 0:
        raise ProfileUnreadable(f"{path.name}: not an XSpace (parsed, but holds no planes)")
    if lines == 0:
        raise ProfileUnreadable(
            f"{path.name}: an XSpace with no events ({planes} plane(s), no timeline lines): "
            "nothing was captured")
    return planes
