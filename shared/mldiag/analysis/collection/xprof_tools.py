"""In-process access to the pinned xprof package's own tool implementations.

xprof 2.24.2 keeps process-global state that we must tame:
- a disk cache and op_stats "owner" fingerprints under `$TMPDIR/xprof_cli_cache_<user>`;
- `*op_stats*.pb` files written next to the traces, and whichever op-stats tool runs first
  decides the step set that every later tool sees;
- `<module>.hlo_proto.pb` files written next to the traces by whichever HLO tool runs first.

`XprofWorkspace` therefore gives every analysis a private directory: the session's xplanes are
symlinked into a private run directory, xprof's cache is pointed at a private cache directory,
and op_stats and HLO protos are built once, before any parallel work starts.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mldiag.analysis.collection.profile_input import ProfileSession
from mldiag.errors import MldiagError

XPROF_VERSION = "2.24.2"
# Where xprof's converters save op_stats in a run directory, and read them back from
# (`ConvertMultiXSpaceToCombinedOpStatsWithCache`: "ALL_HOSTS", the OP_STATS suffix).
OP_STATS_FILE = "ALL_HOSTS.op_stats_v2.pb"
# The plane of XLA modules (their HLO protos) in every XSpace.
METADATA_PLANE = "/host:metadata"

log = logging.getLogger(__name__)

# xprof's cache location and client are process globals; one workspace owns them at a time.
_XPROF_GLOBALS = threading.Lock()

_NO_DATA_PATTERNS = re.compile(
    r"no data|NO_DATA|DATA_ABSENT|not found in profile|no .{0,40} found|has no rows|"
    r"needs exactly one trace|no hardware performance counter|no memory viewer data",
    re.IGNORECASE,
)


GLOBALS_WAIT_S = 600.0


class XprofBusy(MldiagError, RuntimeError):
    """xprof's process-global state is held by a tool that has not finished.

    Transient: the tool can run once the other one ends (a fresh worker process)."""


class NoData(MldiagError):
    """A tool ran correctly and found nothing to report (normal on CPU profiles).

    Permanent for this profile: recorded as the tool's NO_DATA result, not retried."""


def xprof_installed_version() -> str:
    from importlib import metadata

    return metadata.version("xprof")


_ROOT_PREFIX = "mldiag-xprof-"
STALE_UNOWNED_S = 6 * 3600.0


def _new_root() -> Path:
    """A workspace directory named after this process, after removing the ones that
    processes killed before they could clean up (kill -9, OOM) left behind."""
    sweep_stale_roots()
    return Path(tempfile.mkdtemp(prefix=f"{_ROOT_PREFIX}{os.getpid()}-"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_roots(tmp: Path | None = None, now: float | None = None) -> list[Path]:
    """Remove workspace directories whose creating process is gone (or, for ones named
    without a pid, that are over 6 h old); returns what was removed."""
    base = Path(tmp or tempfile.gettempdir())
    now = time.time() if now is None else now
    removed = []
    for path in base.glob(f"{_ROOT_PREFIX}*"):
        rest = path.name[len(_ROOT_PREFIX):]
        pid_text = rest.split("-", 1)[0]
        try:
            stale = (not _alive(int(pid_text))) if pid_text.isdigit() and "-" in rest else (
                now - path.stat().st_mtime > STALE_UNOWNED_S)
        except OSError:
            continue
        if stale and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class XprofWorkspace:
    """A private, isolated view of one session for xprof's tools.

    Use as a context manager; tool calls are thread-safe inside it.
    """

    def __init__(self, session: ProfileSession, keep: bool = False) -> None:
        self.session = session
        self._keep = keep
        self._root: Path | None = None
        self._tools: dict[str, Callable[..., Any]] = {}
        self._lock_held = False
        self._saved_globals: tuple[Any, Any] | None = None

    @property
    def run_dir(self) -> Path:
        if self._root is None:
            raise RuntimeError("XprofWorkspace used outside its context")
        return self._root / "plugins" / "profile" / self.session.name

    def __enter__(self) -> XprofWorkspace:
        self._root = _new_root()
        self.run_dir.mkdir(parents=True)
        for xplane in self.session.xplanes:
            (self.run_dir / xplane.name).symlink_to(xplane.resolve())
        # A tool thread that outlived its timeout still holds xprof's globals; waiting for it
        # forever would hang this analysis too, so give up with a (transient) error.
        if not _XPROF_GLOBALS.acquire(timeout=GLOBALS_WAIT_S):
            shutil.rmtree(self._root, ignore_errors=True)
            raise XprofBusy(f"xprof is still busy with a timed-out tool after "
                            f"{GLOBALS_WAIT_S:g} s; retry later")
        self._lock_held = True
        from xprof.cli.internal import decorators

        cache_dir = self._root / "xprof_cache"
        cache_dir.mkdir()
        self._saved_globals = (decorators.get_cache_dir, decorators._GLOBAL_CACHE)
        decorators.get_cache_dir = lambda: cache_dir
        decorators._GLOBAL_CACHE = decorators.Cache(cache_dir)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def attach(cls, root: Path, session: ProfileSession, cache_name: str) -> XprofWorkspace:
        """Join a workspace that another process created with `create_root`, in a worker
        process that holds no other workspace: xprof's globals are this process's own, so no
        lock is taken. Each worker keeps its own result cache (`cache_name`), since xprof's
        SQLite cache is not safe for concurrent writers; op_stats ownership is shared."""
        ws = cls(session, keep=True)
        ws._root = root
        from xprof.cli.internal import decorators

        cache_dir = root / "xprof_cache"
        decorators.get_cache_dir = lambda: cache_dir
        decorators._GLOBAL_CACHE = decorators.Cache(cache_dir / f"results-{cache_name}")
        return ws

    @staticmethod
    def create_root(session: ProfileSession) -> Path:
        """A private workspace directory for `session`, for workers to `attach` to."""
        root = _new_root()
        run_dir = root / "plugins" / "profile" / session.name
        run_dir.mkdir(parents=True)
        for xplane in session.xplanes:
            (run_dir / xplane.name).symlink_to(xplane.resolve())
        (root / "xprof_cache").mkdir()
        return root

    def close(self) -> None:
        if self._lock_held:
            from xprof.cli.internal import decorators

            assert self._saved_globals is not None
            cache = decorators._GLOBAL_CACHE
            decorators.get_cache_dir, decorators._GLOBAL_CACHE = self._saved_globals
            if cache is not None:
                cache.close()
            self._lock_held = False
            _XPROF_GLOBALS.release()
        if self._root is not None and not self._keep:
            shutil.rmtree(self._root, ignore_errors=True)
        self._root = None

    def _tool(self, name: str) -> Callable[..., Any]:
        fn = self._tools.get(name)
        if fn is None:
            from xprof.cli.xprof_cli import _wrap_with_logdir, cli_main

            fn = _wrap_with_logdir(cli_main()[name])
            self._tools[name] = fn
        return fn

    def call(self, name: str, *, only_host: str | None = None, run_dir: Path | None = None,
             **kwargs: Any) -> dict[str, Any]:
        """Run xprof CLI tool `name` in-process on this session and return its parsed JSON.

        `only_host` restricts the tool to that host's trace (for single-host tools); `run_dir`
        reads another run directory of this workspace (`side_run_dir`) instead of the main one.
        Raises NoData when the tool reports that the profile has nothing for it.
        """
        target = base = run_dir or self.run_dir
        if only_host is not None:
            target = base / next(
                p.name for p in self.session.xplanes if p.name.startswith(f"{only_host}."))
        try:
            raw = self._tool(name)(str(target), **kwargs)
        except (FileNotFoundError, ValueError) as e:
            message = self.scrub(str(e))
            if _NO_DATA_PATTERNS.search(message):
                raise NoData(message.splitlines()[0]) from e
            raise
        except NoData as e:
            raise NoData(self.scrub(str(e))) from e
        data = self.scrub(_parse(raw))
        if run_dir is not None:
            data = _replace_path(data, str(run_dir), str(self.session.path))
        data.pop("capture", None)
        data.pop("__cache_age_s__", None)
        data.pop("__cached__", None)
        if data.get("status") == "NO_DATA":
            raise NoData(str(data.get("message") or "no data"))
        return data

    def fetch_tool_data(self, tb_tool: str, run_dir: Path | None = None,
                        only_host: str | None = None) -> dict[str, Any]:
        """Raw converter output for a TensorBoard-plugin tool such as `smart_suggestion`,
        converted in this workspace's run directory or in `run_dir` (see `side_run_dir`);
        `only_host` converts that host's trace alone (as `call` does)."""
        from xprof.cli.internal.oss import xprof_client

        where = run_dir or self.run_dir
        if only_host is not None:
            where = where / next(
                p.name for p in self.session.xplanes if p.name.startswith(f"{only_host}."))
        _, raw = xprof_client.get_client().fetch(tb_tool, str(where))
        data = self.scrub(_parse(raw))
        if run_dir is not None:
            data = _replace_path(data, str(run_dir), str(self.session.path))
        return data

    def side_run_dir_path(self, name: str) -> Path:
        """Where `side_run_dir(name)` is, without making it."""
        if self._root is None:
            raise RuntimeError("XprofWorkspace used outside its context")
        return self._root / name / "plugins" / "profile" / self.session.name

    def side_run_dir(self, name: str) -> Path:
        """A second run directory of this workspace, with links to the xplanes of the first
        (the reduced copies where the collection made them), for a converter that must not
        share the first's saved results: xprof clears a run directory's saved `*.pb` before
        a fresh conversion, which would delete op_stats being built beside it."""
        if self._root is None:
            raise RuntimeError("XprofWorkspace used outside its context")
        run_dir = self._root / name / "plugins" / "profile" / self.session.name
        run_dir.mkdir(parents=True, exist_ok=True)
        for xplane in self.session.xplanes:
            link = run_dir / xplane.name
            # A file written there already (a reduced copy) stays.
            if not link.is_symlink() and not link.exists():
                link.symlink_to((self.run_dir / xplane.name).resolve())
        return run_dir

    def adopt_op_stats(self, data: bytes, run_dir: Path | None = None) -> Path:
        """Make `data` (a serialized OpStats) the op_stats that xprof's tools read in `run_dir`
        (default: this workspace's), instead of converting the traces there.

        xprof's client reuses a run directory's saved `ALL_HOSTS.op_stats_v2.pb` only when its
        owner record names that directory's traces and that file; any other file is deleted
        before a fresh conversion. So the file is written with the records its own conversion
        would leave (xprof 2.24.2's `_compute_op_stats_scope` and `_op_stats_signature`).
        """
        from xprof.cli.internal.oss import xprof_client as xc

        where = run_dir or self.run_dir
        scope = xc._compute_op_stats_scope(where, xc.get_client().select_paths(str(where)))
        target = where / OP_STATS_FILE
        with xc._lock_run_dir(scope.owner_dir, scope.run_dir_hash):
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_bytes(data)
            tmp.replace(target)
            xc._atomic_write_text(scope.fp_dir, scope.fp_file, scope.current_fp)
            xc._atomic_write_text(
                scope.owner_dir, scope.owner_file,
                f"{scope.scope_hash}:{scope.current_fp}:{xc._op_stats_signature(where)}")
        return target

    def scrub(self, value: Any) -> Any:
        """Replace the private workspace path with the session's real path, so results do
        not depend on where this analysis happened to run."""
        return _replace_path(value, str(self.run_dir), str(self.session.path))

    def ensure_hlo_protos(self) -> None:
        """Write the session's `<module>.hlo_proto.pb` files in its run directory, from a copy
        of each trace holding only its metadata plane (where XLA's modules are), not from the
        whole trace: xprof loads every event of the XSpaces it is given to write them (5.6 GB
        for the first follow-up on a 947 MB TPU-shaped host). xprof skips the step when any
        exists."""
        from xprof.cli.internal.oss import hlo_tools

        from mldiag.analysis.collection.xspace.scan import XSpaceScan
        from mldiag.analysis.collection.xspace.write import write_planes

        if any(self.run_dir.glob("*.hlo_proto.pb")):
            return
        side = self.side_run_dir("hlo")
        for xplane in self.session.xplanes:
            copy = side / xplane.name
            copy.unlink(missing_ok=True)
            with XSpaceScan(xplane) as scan:
                write_planes(scan, copy, lambda plane: plane.name == METADATA_PLANE)
        hlo_tools.generate_hlo_protos(str(side))
        for proto in side.glob("*.hlo_proto.pb"):
            shutil.copyfile(proto, self.run_dir / proto.name)

    def build_op_stats(self) -> None:
        """Have xprof build and save the session's op_stats in the run directory, through
        the roofline converter: the overview's also loads every XSpace again for inference
        statistics (1 s of 4.8 at 94 MB TPU-shaped)."""
        from xprof.cli.internal.oss import xprof_client

        xprof_client.get_client().fetch("roofline_model", str(self.run_dir))

    def precompute_op_stats(self) -> dict[str, Any]:
        """Build the shared inputs once, before tools run in parallel; returns the overview.

        op_stats: so every later tool sees the same steps. HLO protos: xprof writes one
        `<module>.hlo_proto.pb` per module on first use and skips the step when any exists, so
        concurrent first uses read half-written sets (seen as a module with 0 MiB of buffers).
        """
        overview = self.call("get_overview")
        self.ensure_hlo_protos()
        return overview


def _replace_path(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, dict):
        return {k: _replace_path(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_path(v, old, new) for v in value]
    return value


def _parse(raw: Any) -> dict[str, Any]:
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            parsed = json.loads(raw)
        except ValueError:
            # Some tools (get_hlo_neighborhood in text form) answer in plain text.
            text = raw.strip()
            if re.search(r"not found", text.splitlines()[0], re.IGNORECASE):
                raise NoData(text.splitlines()[0]) from None
            return {"text": text}
    else:
        parsed = raw
    if isinstance(parsed, list):
        return {"rows": parsed}
    if not isinstance(parsed, dict):
        return {"value": parsed}
    return parsed


@contextmanager
def workspace(session: ProfileSession) -> Iterator[XprofWorkspace]:
    with XprofWorkspace(session) as ws:
        yield ws
