"""`mldiag add LOGDIR --run R [--session S]`: copy a logdir's profiles into the bucket, in
the layout the pipeline reads (`<run>/plugins/profile/<session>/<host>.xplane.pb`).

LOGDIR is what `jax.profiler.trace(LOGDIR)` wrote (`LOGDIR/plugins/profile/<session>/`), its
`plugins` folder, one session directory, or one `.xplane.pb` file. Each file is written as
one object (streamed, renamed into place once whole), so the pipeline registers each host
once and analyses the session when its hosts are in.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mldiag.cli import _control
from mldiag.cli._home import add_home
from mldiag.errors import MldiagError
from mldiag.model import check_name, session_dir

SUFFIX = ".xplane.pb"


def register(sub: Any) -> None:
    p = sub.add_parser("add", help="copy a logdir's xplanes into the bucket as sessions of a run",
                       description=__doc__)
    p.add_argument("logdir", metavar="LOGDIR", help="a logdir (LOGDIR/plugins/profile/"
                   "<session>/), its plugins/ folder, a session directory or one .xplane.pb")
    p.add_argument("--run", "--machine-learning-run", dest="run", required=True, metavar="RUN",
                   help="the run the sessions belong to (created when it does not exist)")
    p.add_argument("--session", default=None, help="the session's name in the bucket (default: "
                   "its directory's name); in a logdir of several sessions, the one to add")
    add_home(p)


def sessions_in(logdir: Path) -> dict[str, list[Path]]:
    """The `.xplane.pb` files under `logdir`, by session directory name."""
    if logdir.is_file():
        if not logdir.name.endswith(SUFFIX):
            raise MldiagError(f"{logdir} is not an {SUFFIX} file")
        return {logdir.parent.resolve().name: [logdir]}
    if not logdir.is_dir():
        raise MldiagError(f"no such file or directory: {logdir}")
    for root in (logdir / "plugins" / "profile", logdir / "profile"):
        if root.is_dir():
            found = {d.name: sorted(d.glob(f"*{SUFFIX}")) for d in sorted(root.iterdir())
                     if d.is_dir()}
            found = {name: files for name, files in found.items() if files}
            if found:
                return found
    here = sorted(logdir.glob(f"*{SUFFIX}"))
    return {logdir.resolve().name: here} if here else {}


def choose(found: dict[str, list[Path]], session: str | None) -> dict[str, list[Path]]:
    """The sessions to add, under their names in the bucket."""
    if session is None:
        return found
    if session in found:
        return {session: found[session]}
    if len(found) == 1:
        return {session: next(iter(found.values()))}
    raise MldiagError(f"the logdir holds {len(found)} sessions ({', '.join(sorted(found))}): "
                      f"--session names one of them, not {session!r}")


def run(args: argparse.Namespace) -> int:
    logdir = Path(args.logdir)
    try:
        check_name("run", args.run)
        if args.session is not None:
            check_name("session", args.session)
    except ValueError as e:
        raise MldiagError(str(e)) from e
    found = sessions_in(logdir)
    if not found:
        raise MldiagError(
            f"no {SUFFIX} in {logdir}: expected LOGDIR/plugins/profile/<session>/<host>{SUFFIX} "
            f"(what jax.profiler.trace(LOGDIR) writes), a session directory or one {SUFFIX} "
            "file; a profile still being written appears when its trace ends")
    chosen = choose(found, args.session)
    settings = _control.settings_of(args)
    from mldiag.bootstrap import control_plane

    plane = control_plane(settings)
    record = plane.state.get_run(args.run)
    prefix = record.storage_prefix if record is not None else ""
    planned: list[tuple[str, Path]] = []
    for session, files in sorted(chosen.items()):
        try:
            check_name("session", session)
            hosts = [check_name("host", f.name[: -len(SUFFIX)]) for f in files]
        except ValueError as e:
            raise MldiagError(f"{e}; pass --session NAME to name the session") from e
        base = session_dir(prefix, args.run, session)
        existing = [i.name for i in plane.storage.list(base + "/")
                    if i.name.endswith(SUFFIX) and "/analysis/" not in i.name]
        if existing:
            raise MldiagError(f"session {args.run}/{session} is in the bucket already "
                              f"({len(existing)} host(s) at {plane.storage.uri(base)}): pass "
                              "--session NEW to add these files as another session")
        planned.extend((f"{base}/{host}{SUFFIX}", f)
                       for host, f in zip(hosts, files, strict=True))
    for name, path in planned:
        plane.storage.put_file(name, path)
        print(f"added {path} -> {plane.storage.uri(name)}")
    print(f"{len(planned)} file(s), {len(chosen)} session(s) of run {args.run}: "
          f"mldiag sessions list --run {args.run}")
    if settings.backend == "local" and not _control.runtime_running(settings):
        print(f"note: no `mldiag up` is running on {settings.home}; the sessions are analysed "
              "when it starts")
    return 0
