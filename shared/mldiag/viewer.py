"""The XProf viewer of one session: the official frontend's data routes, for that session alone.

Each session gets a workspace, a local directory laid out as xprof's logdir
(`plugins/profile/<name>/<host>.xplane.pb`), and the pinned xprof's own `ProfilePlugin` on it.
Requests reach the plugin only after `sanitise`: the run is always this session, and
`session_path`, `run_path` and names of hosts or modules the session does not have are
refused. So the plugin can never be pointed at another directory.

Caches, so that a first open is fast and several people can open at once:
- the plugin's own (trace-viewer SSTABLEs, op_stats, HLO protos) in the workspace;
- whole responses of the requests that do not depend on a view window (the tool list, the
  overview, op profile, ...), on disk by their sanitised query;
- both prebuilt by the pipeline when a session is REPORTED (`viewer_prebuild.prebuild`) and
  kept in the bucket under the session (`analysis/xprof_cache/<key>/`). The key covers the
  hosts' generations and the xprof version, so a new host or a new xprof never reads a stale
  cache. A host too large to convert whole is viewed window by window (the manifest's
  `view`): its time windows are the workspace's hosts, `<host>.window<k>`.

A conversion that would need more memory than the console has (`memory_budget`) is refused
with a 503 that says so, rather than taking the console, and everyone's sessions, down; a
session not prebuilt whose hosts would need that is refused before its hosts are fetched
(`unviewable`: a 2 GB host, or dozens, would only fill the console's disk, its memory on
Cloud Run), saying whether its prebuild is still to come or why it was skipped.

One build per workspace at a time: a request that would convert (a cache miss) holds the
workspace's lock, and those waiting behind it then find the cache warm. That is what the
official server lacks: two first opens of one session race on its cache files.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from mldiag import viewer_cache
from mldiag.adapters.local.private import (
    open_private,
    owner_only_dir,
    private_dir,
    replace_private,
    write_private,
)
from mldiag.errors import MldiagError
from mldiag.model import SessionRecord
from mldiag.ports import Storage
from mldiag.viewer_cache import (
    MANIFEST,
    REBUILDING,
    CacheExpired,
    arrived_hosts,
    cache_key,
    cache_prefix,
    expired,
    lacks_files,
    over_budget,
    unviewable,
    window_host,
)

log = logging.getLogger(__name__)

ALL_HOSTS = "ALL_HOSTS"
# Query parameters that point the plugin at another directory, or start work that is not a
# read: never passed on.
REFUSED_PARAMS = frozenset({"session_path", "run_path"})
# The parameters that change a tool's answer, as xprof 2.24.2's plugin reads them
# (`ProfilePlugin.data_impl`, `convert/raw_to_tool_data.py`): every other parameter is dropped
# before the plugin sees the query and before the cache key is made, so junk parameters
# (`&x=1`, `&x=2`, ...) neither convert again nor add cached answers. `use_saved_result`
# is dropped too: a client must not be able to force a conversion.
COMMON_PARAMS = frozenset({"run", "tag", "host", "hosts"})
_TRACE_PARAMS = frozenset({"resolution", "full_dma", "start_time_ms", "end_time_ms",
                           "event_name", "format", "duration_ms", "unique_id",
                           "search_prefix", "search_metadata"})
TOOL_PARAMS: dict[str, frozenset[str]] = {
    "graph_viewer": frozenset({"module_name", "program_id", "node_name", "graph_width",
                               "show_metadata", "merge_fusion", "format", "type"}),
    "hlo_op_profile": frozenset({"group_by"}),
    "megascale_stats": frozenset({"perfetto"}),
    "memory_viewer": frozenset({"module_name", "program_id", "memory_space",
                                "view_memory_allocation_timeline"}),
    "op_profile": frozenset({"group_by"}),
    "perf_counters": frozenset({"names_only", "device_type"}),
    "smart_suggestion": frozenset({"refresh_suggestion"}),
    "trace_viewer": _TRACE_PARAMS,
    "trace_viewer@": _TRACE_PARAMS,
}
# Parameters whose value must be a number (xprof parses them, and fails on text).
_NUMERIC_PARAMS = frozenset({"resolution", "start_time_ms", "end_time_ms", "duration_ms",
                             "graph_width", "program_id", "memory_space"})
# The frontend writes JavaScript numbers: after a host switch, `start_time_ms=5e-324`
# (Number.MIN_VALUE) and `end_time_ms=67831.78656943952`.
_NUMBER = re.compile(r"^-?[0-9]{1,20}(\.[0-9]{1,20})?([eE][-+]?[0-9]{1,3})?$")
_DEVICE_TYPE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# The trace viewer asks for as many events as its canvas has pixels, times a factor
# (`resolution=3240` in a 1400 px window): a resolution is rounded up to the next of these, so
# every window size shares a few answers (at most twice the events asked for), and the
# prebuild holds the answers that common window sizes ask first.
TRACE_RESOLUTIONS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
PREBUILT_RESOLUTIONS = (4096, 8192)
# What xprof's plugin asks its converter for when a trace query names no resolution.
XPROF_DEFAULT_RESOLUTION = "8000"
# Whole answers kept per workspace beyond the prebuilt ones: the least recently used go first.
MAX_RESPONSES = 256
MAX_RESPONSE_BYTES = 512 * 1024 * 1024
# Requests that depend on a view window or a search: not kept as whole responses.
_WINDOWED = frozenset({"start_time_ms", "end_time_ms", "event_name", "search_prefix",
                       "search_metadata", "unique_id", "duration_ms", "refresh_suggestion"})
_SAFE_RUN = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
# In a workspace: the hosts of its windowed view (the manifest's `view`).
VIEW_HOSTS = ".view.json"


GZIP_MIN_BYTES = 1024
GZIP_MAGIC = b"\x1f\x8b"
# How often a console asks again for the rebuild of one expired cache.
REBUILD_ASK_S = 600.0
# How long a console waits for a rebuild it asked for before opening the session as one
# never prebuilt (the prebuild of the largest sessions, in the collect job, takes up to an hour).
REBUILD_GIVE_UP_S = 2 * 3600.0


class ViewerError(MldiagError):
    """A request the viewer refuses (unknown host, module or parameter: a 4xx) or one xprof
    failed to answer (a 5xx). Permanent: the same request fails the same way."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Response:
    body: bytes
    content_type: str
    content_encoding: str | None = None


# xprof's graph viewer answers these `type`s as downloads (`convert/raw_to_tool_data.py`).
_DOWNLOAD_TYPES = frozenset({"pb", "pbtxt", "json", "short_txt", "long_txt"})
HTML = "text/html; charset=utf-8"


def content_type(route: str, query: Mapping[str, str]) -> str:
    """The content type of the answer to `route` with the sanitised `query`, decided by the
    tool and the request as xprof 2.24.2 decides it (`convert/raw_to_tool_data.py`), never by
    what is stored beside a cached answer: that metadata is in the bucket, which is not trusted
    to say what is markup or script. Only two answers are HTML: the graph viewer's `type=graph`
    and the memory viewer's allocation timeline (served sandboxed, `console.xprof_html`)."""
    if route in ("runs", "run_tools", "hosts"):
        return "application/json"
    if route == "module_list":
        return "text/plain; charset=utf-8"
    tool = query.get("tag", "")
    if tool in ("trace_viewer", "trace_viewer@"):
        return "application/octet-stream" if query.get("format") == "pb" else "application/json"
    if tool == "graph_viewer":
        kind = query.get("type", "")
        if kind == "graph":
            return HTML
        return "application/octet-stream" if kind in _DOWNLOAD_TYPES else (
            "text/plain; charset=utf-8")
    if tool == "memory_viewer" and query.get("view_memory_allocation_timeline"):
        return HTML
    if tool == "megascale_stats" and query.get("perfetto") in ("1", "true"):
        return "application/octet-stream"
    return "application/json"


def _query_key(query: Mapping[str, str]) -> str:
    return hashlib.sha256(urlencode(sorted(query.items())).encode()).hexdigest()[:32]


def _trace_resolution(value: str) -> str:
    """`value` rounded up to the next of TRACE_RESOLUTIONS (0, no downsampling, stays 0)."""
    asked = float(value)
    if asked <= 0:
        return "0"
    return str(next((r for r in TRACE_RESOLUTIONS if r >= asked), TRACE_RESOLUTIONS[-1]))


class _CacheMiss(logging.Filter):
    """xprof logs a missing tool-list cache (every first open) as an ERROR with a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (".cached_tools.json" in text and "FileNotFoundError" in text)


def _quiet_xprof_logs() -> None:
    """Give xprof's plugin logger a handler of ours before it installs its own (at INFO):
    warnings and errors still show, its routine notes and cache misses do not."""
    logger = logging.getLogger("tensorboard.plugins.profile")
    if any(isinstance(f, _CacheMiss) for h in logger.handlers for f in h.filters):
        return
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.addFilter(_CacheMiss())
    handler.setFormatter(logging.Formatter("%(levelname)s xprof: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False


class Workspace:
    """One session's logdir, plugin and caches on local disk."""

    def __init__(self, root: Path, session: SessionRecord) -> None:
        self.root = root
        self.key = cache_key(session)
        self.run = session.session if _SAFE_RUN.match(session.session) else "session"
        self.run_dir = root / "plugins" / "profile" / self.run
        self.responses = root / "responses"
        self.hosts = list(arrived_hosts(session))
        # Hosts viewed whole and their sizes: a conversion is refused when the largest would
        # not fit `memory_budget` (the console's), rather than take the console down.
        self.sizes = {h: r.size for h, r in session.hosts.items() if r.status == "ARRIVED"}
        self.memory_budget: int | None = None
        # Whether `responses/` is kept under MAX_RESPONSES and MAX_RESPONSE_BYTES (a console's
        # workspace); the prebuild keeps every answer it builds, for the bucket.
        self.trim = True
        # Windows of a windowed view not fetched yet: host -> the cache files it needs.
        self.pending: dict[str, list[str]] = {}
        self._windows: dict[str, int] = {}
        # A windowed host's stub (its planes and metadata, no events: `viewer_prebuild`),
        # standing for its windows not fetched yet, by host: a request over all hosts (op_stats
        # tools) or none (tool and host lists) then needs no window.
        self._stubs: dict[str, str] = {}
        # Where the prebuilt cache is read from: (storage, prefix), set when opened.
        self.source: tuple[Storage, str] | None = None
        view = root / VIEW_HOSTS
        if view.is_file():
            self.view(json.loads(view.read_text()))
        self.lock = threading.Lock()
        self._plugin: Any = None
        self._modules: list[str] | None = None
        self.last_used = time.monotonic()

    # Building

    def materialise(self, session: SessionRecord, storage: Storage, *,
                    skip: Collection[str] = (), prebuilt: bool = True) -> None:
        """Fetch the hosts' xplanes, and the prebuilt caches when the bucket has them (with
        the windows of the hosts viewed window by window instead of those hosts). `skip`:
        hosts not to fetch (the prebuild cuts them into windows itself); `prebuilt`: whether
        to read the prebuilt caches (not the prebuild's: it rebuilds one expired in part)."""
        private_dir(self.run_dir)
        private_dir(self.responses)
        prefix = cache_prefix(session)
        manifest: dict[str, Any] | None = None
        if prebuilt and storage.stat(f"{prefix}/{MANIFEST}") is not None:
            manifest = json.loads(storage.read_bytes(f"{prefix}/{MANIFEST}"))
        windowed = set((manifest or {}).get("view", {}).get("windows", {})) | set(skip)
        for host, name in arrived_hosts(session).items():
            if host not in windowed:
                storage.fetch_to(name, self.run_dir / f"{host}.xplane.pb")
        if manifest is None:
            return
        files = [rel for rel in manifest.get("files", []) if isinstance(rel, str)
                 and ".." not in rel.split("/") and not rel.startswith("/")]
        if isinstance(manifest.get("view"), dict):
            # Large hosts are viewed window by window: their windows are among the files. The
            # first window is fetched now (what a first open shows), the others when a
            # request names them (a 2 GB host's windows and traces are several GB, and the
            # console's disk is its memory).
            self.view(manifest["view"])
            later = [h for h in self.hosts if h not in self.sizes][1:]
            answers = manifest["view"].get("answers") or {}
            for rel in files:
                name = rel.rsplit("/", 1)[-1]
                owner = next((w for w in later if name.startswith(f"{w}.")
                              or rel in answers.get(w, ())), None)
                if owner is not None:
                    self.pending.setdefault(owner, []).append(rel)
            files = [rel for rel in files if not any(rel in v for v in self.pending.values())]
            self._save_view(manifest["view"])
        self.source = (storage, prefix)
        for rel in files:
            self._fetch(rel)
        self._stand_in()

    def _stand_in(self) -> None:
        """Each window not fetched yet gets its host's stub in its place (a hard link)."""
        for window in self.pending:
            host = window.rsplit(".window", 1)[0]
            stub, path = self._stubs.get(host), self.run_dir / f"{window}.xplane.pb"
            if stub and (self.root / stub).is_file() and not path.exists():
                os.link(self.root / stub, path)

    def _fetch(self, rel: str) -> None:
        """One file of the prebuilt cache, from the bucket into the workspace."""
        assert self.source is not None
        storage, prefix = self.source
        dest = self.root / rel
        private_dir(dest.parent)
        # CacheExpired when it is gone: the cache is then rebuilt (`Viewers.workspace`).
        viewer_cache.fetch(storage, prefix, rel, dest)
        body = rel.startswith("responses/") and not rel.endswith(".json")
        if dest.stat().st_nlink > 1 and not rel.endswith((".SSTABLE", ".xplane.pb")) and (
                not body):
            # A hard link to the bucket's object: xprof rewrites small cache files such
            # as cache_version.txt in place, and a whole answer's metadata is touched when
            # read, which must not change the bucket's copy (answers' bodies are only ever
            # replaced, and traces and xplanes only read: those stay linked).
            data = dest.read_bytes()
            dest.unlink()
            write_private(dest, data)

    def _save_view(self, view: Mapping[str, Any]) -> None:
        replace_private(self.root / VIEW_HOSTS, json.dumps(
            {"windows": view.get("windows", {}), "pending": self.pending,
             "stubs": view.get("stubs", self._stubs)}).encode())

    def _fetch_windows(self, q: Mapping[str, str]) -> None:
        """Fetch the windows a request needs that are not here yet: those it names. With
        stubs standing in for the others (a prebuild that wrote them), that is all: a tool
        over ALL_HOSTS reads the session's op_stats, and the lists read the stubs. Without,
        every window when it names none or ALL_HOSTS."""
        if not self.pending or self.source is None:
            return
        named = [h for h in (q.get("hosts") or q.get("host") or "").split(",") if h]
        every = (not named or ALL_HOSTS in named) and not self._stubs
        wanted = list(self.pending) if every else [h for h in named if h in self.pending]
        for host in wanted:
            for rel in self.pending[host]:
                self._fetch(rel)
            del self.pending[host]
        if wanted:
            self._save_view({"windows": self._windows})

    def view(self, view: Mapping[str, Any]) -> None:
        """Take the hosts of a windowed view (`viewer_prebuild`): each large host's windows
        stand for it, named `<host>.window<k>`."""
        windows = {str(h): int(n) for h, n in (view.get("windows") or {}).items()}
        self._windows = windows
        self.pending = {str(h): list(f) for h, f in (view.get("pending") or {}).items()}
        self._stubs = {str(h): str(p) for h, p in (view.get("stubs") or {}).items()
                       if ".." not in str(p).split("/") and not str(p).startswith("/")}
        self.hosts = [w for h in self.hosts for w in (
            [window_host(h, k) for k in range(windows[h])] if h in windows else [h])]
        for h in windows:
            self.sizes.pop(h, None)

    def too_large(self) -> str | None:
        """Why this workspace must not convert (a host viewed whole that xprof's converters
        would need more than `memory_budget` for), or None."""
        why = over_budget(self.sizes, self.memory_budget)
        return f"{why}, and this request is not among its prebuilt answers" if why else None

    @property
    def plugin(self) -> Any:
        if self._plugin is None:
            _quiet_xprof_logs()
            from xprof import profile_plugin
            from xprof.server import DataProvider, TBContext

            logdir = str(self.root)
            context = TBContext(logdir, DataProvider(logdir), TBContext.Flags(False))
            context.hide_capture_profile_button = True
            self._plugin = profile_plugin.ProfilePlugin(context)
        return self._plugin

    def modules(self) -> list[str]:
        if self._modules is None:
            listed = self.plugin.hlo_module_list_impl(self._request({"run": self.run}))
            self._modules = [m for m in listed.split(",") if m]
        return self._modules

    # Requests

    def sanitise(self, query: Mapping[str, str]) -> dict[str, str]:
        """The query the plugin may see: this session's run, known hosts and modules only,
        and of the other parameters only those that change the tool's answer."""
        allowed = COMMON_PARAMS | TOOL_PARAMS.get(query.get("tag", ""), frozenset())
        out = {k: v for k, v in query.items() if k in allowed and k not in REFUSED_PARAMS}
        for k in _NUMERIC_PARAMS & out.keys():
            if not _NUMBER.match(out[k]):
                raise ViewerError(f"{k} must be a number", 400)
        if "device_type" in out and not _DEVICE_TYPE.match(out["device_type"]):
            raise ViewerError("device_type must be a device type name", 400)
        if "resolution" in out:
            out["resolution"] = _trace_resolution(out["resolution"])
        elif out.get("tag") in ("trace_viewer", "trace_viewer@"):
            # xprof's own default, rounded like any: one answer, not two nearly equal ones
            # (8,000 and 8,192 events, 8 MB each for a 92 MB host).
            out["resolution"] = _trace_resolution(XPROF_DEFAULT_RESOLUTION)
        if out.get("hosts") and out.get("hosts") == out.get("host"):
            del out["hosts"]  # one host, named twice (the frontend's first trace request)
        out["run"] = self.run
        host = out.get("host")
        if host and host != ALL_HOSTS and host not in self.hosts and host not in self.modules():
            raise ViewerError(f"no host or module {host!r} in this session", 404)
        for h in filter(None, out.get("hosts", "").split(",")):
            if h not in self.hosts:
                raise ViewerError(f"no host {h!r} in this session", 404)
        module = out.get("module_name")
        if module and module not in self.modules():
            raise ViewerError(f"no module {module!r} in this session", 404)
        return out

    @staticmethod
    def _request(query: Mapping[str, str]) -> Any:
        from werkzeug.test import EnvironBuilder
        from werkzeug.wrappers import Request

        return Request(EnvironBuilder(query_string=urlencode(list(query.items()))).get_environ())

    def _cached(self, route: str, query: Mapping[str, str]) -> Path:
        return self.responses / f"{route}-{_query_key(query)}"

    def cached_path(self, route: str, query: Mapping[str, str]) -> Path:
        """Where the whole answer to `query` (as a client asks it) is kept."""
        return self._cached(route, self.sanitise(query))

    def _load(self, path: Path, route: str, query: Mapping[str, str]) -> Response | None:
        """The whole answer kept at `path`, typed by `content_type(route, query)`. Its
        metadata file only marks it complete (written last) and recently used: what it says
        is not read, and the body's encoding is what the body is (gzip's magic or not)."""
        meta = path.with_suffix(".json")
        if not path.is_file() or not meta.is_file():
            return None
        with contextlib.suppress(OSError):
            os.utime(meta)  # recently used: the last to be trimmed
        body = path.read_bytes()
        return Response(body, content_type(route, query),
                        "gzip" if body[:2] == GZIP_MAGIC else None)

    def _trim(self) -> None:
        """Keep at most MAX_RESPONSES answers and MAX_RESPONSE_BYTES in `responses/`, the
        least recently used going first (prebuilt answers included: they convert again)."""
        if not self.trim:
            return
        entries = []
        for meta in self.responses.glob("*.json"):
            body = meta.with_suffix("")
            try:
                entries.append((meta.stat().st_mtime, meta, body, body.stat().st_size))
            except FileNotFoundError:
                continue
        entries.sort(key=lambda e: e[0], reverse=True)
        count = total = 0
        for _, meta, body, size in entries:
            count, total = count + 1, total + size
            if count > MAX_RESPONSES or total > MAX_RESPONSE_BYTES:
                meta.unlink(missing_ok=True)
                body.unlink(missing_ok=True)

    def _store(self, path: Path, response: Response) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.unlink(missing_ok=True)
        write_private(tmp, response.body)
        tmp.replace(path)
        meta = {"content_type": response.content_type,
                "content_encoding": response.content_encoding}
        tmp_meta = tmp.with_suffix(".json")
        tmp_meta.unlink(missing_ok=True)
        write_private(tmp_meta, json.dumps(meta).encode())
        tmp_meta.replace(path.with_suffix(".json"))

    def _trace_built(self, query: Mapping[str, str]) -> bool:
        hosts = [h for h in query.get("hosts", query.get("host", "")).split(",") if h]
        hosts = hosts or self.hosts
        return all((self.run_dir / f"{h}.SSTABLE").is_file() for h in hosts) and (
            self.run_dir / "cache_version.txt").is_file()

    def answer(self, route: str, query: Mapping[str, str]) -> Response:
        """Serve `runs`, `run_tools`, `hosts`, `module_list` or `data` for this session."""
        self.last_used = time.monotonic()
        if route == "runs":
            return Response(json.dumps([self.run]).encode(), "application/json")
        q = self.sanitise(query)
        tool = q.get("tag", "")
        cacheable = route != "data" or not (_WINDOWED & set(q))
        if cacheable:
            path = self._cached(route, q)
            hit = self._load(path, route, q)
            if hit is not None:
                return hit
        elif tool.startswith("trace_viewer") and self._trace_built(q):
            return self._convert(route, q)
        with self.lock:
            if route == "data" and self.pending:
                self._fetch_windows(q)  # a window fetched now may bring its answer
            if cacheable:
                hit = self._load(path, route, q)
                if hit is not None:
                    return hit
            response = self._convert(route, q)
            if cacheable:
                self._store(path, response)
                self._trim()
            return response

    def _convert(self, route: str, q: Mapping[str, str]) -> Response:
        if route == "data" and (why := self.too_large()):
            raise ViewerError(f"not converted: {why}", 503)
        if route != "runs":
            self._fetch_windows(q if route == "data" else {})
        plugin, request = self.plugin, self._request(q)
        typed = content_type(route, q)
        if route == "run_tools":
            return Response(json.dumps(plugin.run_tools_imp(self.run, request)).encode(), typed)
        if route == "hosts":
            hosts = plugin.host_impl(self.run, q.get("tag", ""), request)
            return Response(json.dumps(hosts).encode(), typed)
        if route == "module_list":
            return Response(",".join(self.modules()).encode(), typed)
        if route != "data":
            raise ViewerError(f"no route {route!r}", 404)
        try:
            data, xprof_type, encoding = plugin.data_impl(request)
        except FileNotFoundError as e:
            raise ViewerError("no data for this tool and host", 404) from e
        except (ValueError, AttributeError, KeyError, TypeError) as e:
            # xprof's converters reject a query they cannot answer (a graph without a
            # module, counters without a device type) by raising: a short 400, and one
            # log line instead of a traceback.
            log.warning("xprof could not answer %s: %s", dict(q), e)
            raise ViewerError(f"xprof cannot answer this {q.get('tag') or 'tool'} "
                              "request", 400) from e
        except Exception as e:  # noqa: BLE001 - any other converter failure: a 500, said
            log.warning("xprof failed on %s: %r", dict(q), e)
            raise ViewerError(f"xprof failed to convert {q.get('tag') or 'this tool'}",
                              500) from e
        if data is None:
            raise ViewerError("No Data", 404)
        body = data.encode() if isinstance(data, str) else bytes(data)
        if encoding is None and len(body) > GZIP_MIN_BYTES:
            # Compressed once, here: a 106 MB profile's overview is 18 MB of JSON, 0.9 MB
            # gzipped (the official server gzips every response too).
            body, encoding = gzip.compress(body, compresslevel=5), "gzip"
        if xprof_type and xprof_type.split(";")[0] != typed.split(";")[0]:
            # A new xprof typing an answer otherwise: served as `content_type` says (the type
            # of a cached copy of it could not be decided otherwise), and said once here.
            log.warning("xprof typed %s as %s; served as %s", dict(q), xprof_type, typed)
        return Response(body, typed, encoding)


class Viewers:
    """The console's workspaces, one per session version, least recently used evicted."""

    def __init__(self, storage: Storage, root: Path, *, keep: int = 8,
                 memory_budget: int | None = None,
                 rebuild: Callable[[SessionRecord], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """`memory_budget`: what one conversion may take here; a session whose host viewed
        whole needs more gets a 503 saying so for what is not cached, instead of a conversion
        that would take the console down (None: no limit). `rebuild(session)`: asks the
        pipeline to rebuild an expired cache (`viewer_cache.expired`); meanwhile its session
        gets a 503 saying so (None: an expired cache is converted here, as if never built)."""
        self.storage = storage
        self.root = root
        self.keep = keep
        self.memory_budget = memory_budget
        self.rebuild = rebuild
        self.clock = clock
        # When each expired cache's rebuild was last asked for (by cache key).
        self._asked: dict[str, float] = {}
        self._first_asked: dict[str, float] = {}
        # Caches found gone in part while read, until rebuilt whole.
        self._lost: set[str] = set()
        self._lock = threading.Lock()
        self._open: OrderedDict[str, Workspace] = OrderedDict()
        self._opening: dict[str, threading.Lock] = {}
        # Importing xprof's plugin takes about half a second: pay it before the first open.
        threading.Thread(target=_warm_import, name="mldiag-viewer-import", daemon=True).start()

    def workspace(self, session: SessionRecord) -> Workspace:
        """The session's workspace, materialised once however many ask at once."""
        if not arrived_hosts(session):
            raise ViewerError("this session has no profile to view", 404)
        key = cache_key(session)
        with self._lock:
            ws = self._open.get(key)
            if ws is not None:
                self._open.move_to_end(key)
                return ws
            opening = self._opening.setdefault(key, threading.Lock())
        with opening:
            with self._lock:
                ws = self._open.get(key)
                if ws is not None:
                    return ws
            root = self.root / key
            owner_only_dir(self.root)
            with _file_lock(self.root / f"{key}.lock"):
                done = root / ".ready"
                if not done.is_file() or key in self._lost:
                    if self.rebuilding(session):
                        with self._lock:
                            self._opening.pop(key, None)
                        raise ViewerError(REBUILDING, 503)
                    why = unviewable(session, self.storage, self.memory_budget)
                    if why is not None:
                        with self._lock:
                            self._opening.pop(key, None)
                        raise ViewerError(f"not opened: {why}", 503)
                    shutil.rmtree(root, ignore_errors=True)
                    ws = Workspace(root, session)
                    try:
                        ws.materialise(session, self.storage)
                    except CacheExpired as e:
                        with self._lock:
                            self._opening.pop(key, None)
                        raise self.lost(session, e) from e
                    replace_private(done, str(time.time()).encode())
                else:
                    ws = Workspace(root, session)
            ws.memory_budget = self.memory_budget
            ws.source = (self.storage, cache_prefix(session))
            with self._lock:
                self._open[key] = ws
                self._opening.pop(key, None)
                self._evict()
            return ws

    def rebuilding(self, session: SessionRecord) -> bool:
        """Whether `session`'s cache expired and is being rebuilt (asked for here, at most
        once every REBUILD_ASK_S per cache)."""
        if self.rebuild is None:
            return False
        key = cache_key(session)
        if key in self._lost:  # found gone in part: until its rebuild is whole again
            if lacks_files(self.storage, cache_prefix(session)):
                self._ask(session)
                return True
            with self._lock:
                self._lost.discard(key)
            return False
        if not expired(session, self.storage, self.clock()):
            return False
        first = self._first_asked.setdefault(key, self.clock())
        if self.clock() - first > REBUILD_GIVE_UP_S:
            # The pipeline never rebuilt it (its prebuild failing, or off): opened as a
            # session never prebuilt, converted here or refused with the reason.
            return False
        self._ask(session)
        return True

    def lost(self, session: SessionRecord, why: CacheExpired) -> ViewerError:
        """A cache found gone while it was read (a file its manifest lists): its workspace
        is dropped, its rebuild asked for, and the error to answer with."""
        key = cache_key(session)
        with self._lock:
            ws = self._open.pop(key, None)
            if self.rebuild is not None:
                self._lost.add(key)
        shutil.rmtree(ws.root if ws is not None else self.root / key, ignore_errors=True)
        log.warning("viewer cache of %s/%s: %s", session.run, session.session, why)
        if self.rebuild is None:
            return ViewerError(f"not opened: {why}", 503)
        self._ask(session)
        return ViewerError(REBUILDING, 503)

    def _ask(self, session: SessionRecord) -> None:
        key, now = cache_key(session), self.clock()
        with self._lock:
            if now - self._asked.get(key, float("-inf")) < REBUILD_ASK_S:
                return
            self._asked[key] = now
        assert self.rebuild is not None
        self.rebuild(session)

    def _evict(self) -> None:
        while len(self._open) > self.keep:
            key, ws = self._open.popitem(last=False)
            if ws.lock.locked():
                self._open[key] = ws  # busy converting: keep it, evict the next time
                break
            shutil.rmtree(ws.root, ignore_errors=True)


def _warm_import() -> None:
    _quiet_xprof_logs()
    try:
        from xprof import profile_plugin  # noqa: F401
    except ImportError as e:  # the first request then says so
        log.warning("xprof's plugin does not import: %s", e)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Across processes sharing the cache directory (several console workers)."""
    private_dir(path.parent)
    with os.fdopen(open_private(path), "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
