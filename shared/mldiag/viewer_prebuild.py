"""A REPORTED session's viewer caches, built into the bucket so that a first open is warm
(`prebuild`; the pipeline's prebuild_viewer stage calls it).

What a first open asks for is answered once, here (`default_queries`), and every file the
plugin wrote (trace-viewer SSTABLEs, op_stats, HLO protos) and every whole answer is put
under the cache's prefix (`viewer_cache.cache_prefix`) with a manifest, written last.

**Large hosts, window by window.** xprof's viewer conversions read a whole host in memory,
about 17.5 bytes per byte (`viewer_cache.PREBUILD_RSS_PER_BYTE`): a 2 GB host needs about 35 GiB,
over any Cloud Run instance. A host whose conversions would not fit the prebuild's budget is
cut into time windows between module executions (`op_stats_shards.module_cuts`, the same
seam as the collection's), each small enough to convert within it, and viewed as hosts of
their own, `<host>.window<k>` (`viewer_cache.window_host`): the trace viewer of each window is
prebuilt, and the first window's is what a first open shows. The session's tools that read
op_stats (overview, op profile, roofline, HLO stats, ...) read the session's op_stats as the
collection combined them (`analysis/v<n>/op_stats.pb`, adopted as the workspace's
`ALL_HOSTS` op_stats), so they show the whole session's figures, not a window's. The
windows' files are part of the cache: the console fetches them instead of the host.

**Many large hosts, one at a time.** The prebuild's files are memory on Cloud Run, and a
session of tens of 2 GB hosts is tens of GB of windows. So a windowed host is fetched and
cut alone; its windows go to the bucket at once, and what stays in the workspace is a stub
per window: the window's planes, lines and metadata without an event (one per host, written
in the same pass), which is all xprof reads to list the tools and the hosts. The overview
reads the collection's op_stats. Each window's trace is then built from the real window,
fetched back, and its files go to the bucket before the next one: the files held at once are
the hosts viewed whole, the host being cut and its windows, or one window and its tables.

**Shared by the collect job's tasks.** The time grows with the hosts (about 4 minutes per
2 GB host on 2 cores), so in a job of several tasks each windowed host is built by one task:
each takes its share first (`task_share`, balanced by windows), then any host nobody holds,
each under a claim (`take`); a host's windows, stub, traces and answers go to the bucket with
a part that lists them (`parts/<host>.json`). Task 0 also waits for the other tasks' parts
(taking over a host whose claim lapses), then builds what concerns the whole session (the
tool and host lists, the overview) with the stubs standing in for every window, and writes
the manifest.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from mldiag import viewer_cache
from mldiag.errors import MldiagError
from mldiag.limits import size_text
from mldiag.model import SessionRecord
from mldiag.ports import Storage
from mldiag.viewer import PREBUILT_RESOLUTIONS, Workspace
from mldiag.viewer_cache import (
    MANIFEST,
    PREBUILD_BASE_BYTES,
    PREBUILD_RSS_PER_BYTE,
    arrived_hosts,
    cache_prefix,
    window_host,
    xprof_version,
)

log = logging.getLogger(__name__)
# The file name xprof's viewer reads a session's op_stats from (its `ALL_HOSTS` cache), and
# the one that says which xprof version wrote a run directory's saved results.
ALL_HOSTS_OP_STATS = "ALL_HOSTS.op_stats_v2.pb"
CACHE_VERSION_FILE = "cache_version.txt"
# The most a window of the windowed view holds: its trace conversion about 2.5 GB.
VIEW_WINDOW_BYTES = 128 * 1024**2
# A window's trace-viewer tables per byte of it, as measured at 1.9 GB (BENCHMARKS.md, "A 2
# GB host, viewed window by window": 178 MB of tables per 125 MB window).
VIEW_TABLES_PER_BYTE = 1.45
# The cut's own memory per byte of the host (`plan.RSS_PER_BYTE["split_windows"]`).
CUT_RSS_PER_BYTE = 0.1
# The prebuild's time per byte of a task's hosts, above the measurements on 2 cores
# (BENCHMARKS.md, "XProf viewer": one 1.9 GB host in 311 s under a loaded `mldiag up`,
# 1.6e-7 s per byte, and in 240 s alone, 1.2e-7; three in 648 s, 1.1e-7), for the deadline it
# runs under (`prebuild_seconds`).
VIEW_SECONDS_PER_BYTE = 1.6e-7
# Below this, windows are too many and too short to be worth viewing one by one.
MIN_VIEW_WINDOW_BYTES = 16 * 1024**2


# Where a windowed host's part is kept in the cache: its windows and the files it put.
PARTS = "parts"
# Claims one host's share of a prebuild: yields whether this task builds it (see `prebuild`).
Take = Callable[[str], AbstractContextManager[bool]]


class NotPrebuilt(MldiagError):
    """The session's caches cannot be built under this budget (the reason says why).
    Permanent for this budget: `skipped.json` records it."""


def view_windows(session: SessionRecord, budget_bytes: int | None, *,
                 window_bytes: int | None = None) -> dict[str, int]:
    """host -> how many time windows it is viewed in, for the hosts whose whole conversions
    would need more than `budget_bytes` beside the session's files (none without a budget).
    Windows are as large as the budget allows, at most VIEW_WINDOW_BYTES (or
    `window_bytes`). Raises NotPrebuilt, naming the need and the budget, when not even a
    window of MIN_VIEW_WINDOW_BYTES would fit, or a host could not be cut beside the hosts
    viewed whole.

    The files count as memory (/tmp is memory on Cloud Run): the hosts viewed whole all
    along; a windowed host is held with its windows only while it is cut, and a window with
    its trace tables only while its trace is built (see the module's notes)."""
    if not budget_bytes:
        return {}
    sizes = {h: r.size for h, r in session.hosts.items() if r.status == "ARRIVED"}
    # Hosts viewed whole, smallest first, while converting the largest of them fits beside
    # all of their files.
    whole = 0
    big: dict[str, int] = {}
    for host, size in sorted(sizes.items(), key=lambda kv: (kv[1], kv[0])):
        if not big and (PREBUILD_BASE_BYTES + PREBUILD_RSS_PER_BYTE * size + whole + size
                        <= budget_bytes):
            whole += size
        else:
            big[host] = size
    if not big:
        return {}
    room = budget_bytes - PREBUILD_BASE_BYTES - whole
    window = window_bytes or (
        min(VIEW_WINDOW_BYTES, int(room / (PREBUILD_RSS_PER_BYTE + VIEW_TABLES_PER_BYTE)))
        if room > 0 else 0)
    if window < MIN_VIEW_WINDOW_BYTES and not window_bytes:
        raise NotPrebuilt(
            f"not even time windows of {MIN_VIEW_WINDOW_BYTES // 1024**2} MB would fit "
            f"beside the {size_text(whole)} of hosts viewed whole, under the "
            f"prebuild's {size_text(budget_bytes)}")
    host, largest = max(big.items(), key=lambda kv: kv[1])
    cut = PREBUILD_BASE_BYTES + whole + int((2 + CUT_RSS_PER_BYTE) * largest)
    if cut > budget_bytes and not window_bytes:
        raise NotPrebuilt(
            f"cutting host {host} ({largest / 1024**2:,.0f} MB) into windows needs about "
            f"{size_text(cut)} with its windows beside it, over the prebuild's "
            f"{size_text(budget_bytes)}")
    return {h: -(-s // window) for h, s in sorted(big.items())}


def default_queries(ws: Workspace) -> list[tuple[str, dict[str, str]]]:
    """What a first open asks for, as the official frontend asks it: the tool list, each
    tool's host list, then the overview and the trace on the first host those lists name
    (`ALL_HOSTS` for the overview of several hosts). The trace viewer's first request names
    its window's resolution (`tag=trace_viewer@&host=H&hosts=H&resolution=3240&...`), rounded
    up by `Workspace.sanitise`. In a windowed view every window's trace is built too, so that
    each one opens warm."""
    out: list[tuple[str, dict[str, str]]] = [("run_tools", {"run": ws.run})]
    for tool in ("overview_page", "trace_viewer@", "op_profile", "input_pipeline_analyzer",
                 "framework_op_stats", "hlo_stats", "roofline_model", "memory_profile"):
        out.append(("hosts", {"run": ws.run, "tag": tool}))
    out.append(("data", {"run": ws.run, "tag": "overview_page",
                         "host": _first_listed(ws, "overview_page")}))
    first = _first_listed(ws, "trace_viewer@")
    windowed = [h for h in ws.hosts if h not in arrived_hosts_of(ws)]
    for host in [first, *(h for h in windowed if h != first)]:
        out.extend(trace_queries(ws.run, host))
    return out


def trace_queries(run: str, host: str) -> list[tuple[str, dict[str, str]]]:
    """The trace viewer's first requests for `host`, as the frontend makes them."""
    # A query without a resolution is xprof's default, which `Workspace.sanitise` rounds to
    # the last of these: it shares their answer.
    return [("data", {"run": run, "tag": "trace_viewer@", "host": host,
                      "resolution": str(resolution)}) for resolution in PREBUILT_RESOLUTIONS]


def _first_listed(ws: Workspace, tag: str) -> str:
    """The host the frontend shows first for `tag`: the first its host list names."""
    try:
        answer = ws.answer("hosts", {"run": ws.run, "tag": tag})
        body = gzip.decompress(answer.body) if answer.content_encoding == "gzip" else (
            answer.body)
        return str(json.loads(body)[0]["hostname"])
    except Exception:  # noqa: BLE001 - no list: the first host, as before
        return ws.hosts[0] if ws.hosts else ""


def arrived_hosts_of(ws: Workspace) -> set[str]:
    """The workspace's hosts viewed whole (the others are windows)."""
    return set(ws.sizes)


def _cut(ws: Workspace, session: SessionRecord, storage: Storage, windows: dict[str, int],
         scratch: Path, prefix: str) -> tuple[dict[str, int], list[str]]:
    """Cut each windowed host, one at a time, into its windows: each window goes to the
    bucket under the cache's `prefix`, and a stub of its host takes its place in the
    workspace (see the module's notes; the stub stays in `scratch`). Returns how many
    windows each host has (fewer when the trace has fewer gaps between modules) and the
    files put in the bucket."""
    from mldiag.analysis import XSpaceScan
    from mldiag.analysis import op_stats_shards as shards

    names = arrived_hosts(session)
    done: dict[str, int] = {}
    put: list[str] = []
    for host, count in windows.items():
        whole = scratch / f"{host}.xplane.pb"
        storage.fetch_to(names[host], whole)
        stub = _stub(scratch, host)
        with XSpaceScan(whole) as scan:
            cuts = shards.module_cuts(scan, count)
            out = [scratch / f"{window_host(host, k)}.xplane.pb" for k in range(len(cuts) + 1)]
            shards.write_windows(scan, cuts, out, stub=stub)
        whole.unlink()
        for path in out:
            rel = (ws.run_dir / path.name).relative_to(ws.root).as_posix()
            viewer_cache.put(storage, prefix, rel, path)
            put.append(rel)
            path.unlink()
            os.link(stub, ws.run_dir / path.name)
        # The console's stand-in for the windows it has not fetched (`Workspace._stand_in`).
        viewer_cache.put(storage, prefix, stub_name(host), stub)
        put.append(stub_name(host))
        done[host] = len(cuts) + 1
    return done, put


def stub_name(host: str) -> str:
    """Where a windowed host's stub is kept in the cache (outside the run directory: xprof
    would list it as a host)."""
    return f"stubs/{host}.xplane.pb"


def _stub(scratch: Path, host: str) -> Path:
    return scratch / f"{host}.stub.xplane.pb"


class _WindowInPlace:
    """The real window in the workspace while its trace is built, its stub again after, and
    its trace tables and answers in the bucket as soon as they are built (see the module's
    notes). `answers`: each window's answers' files, as the prebuild records them."""

    def __init__(self, ws: Workspace, storage: Storage, prefix: str, scratch: Path,
                 windows: dict[str, int], answers: dict[str, list[str]]) -> None:
        self.ws, self.storage, self.prefix, self.scratch = ws, storage, prefix, scratch
        self.owner = {window_host(h, k): h for h, n in windows.items() for k in range(n)}
        self.answers = answers
        self.current: str | None = None
        self.put: list[str] = []

    def before(self, query: dict[str, str]) -> None:
        window = query.get("host", "")
        if window == self.current or window not in self.owner:
            return
        self.done()
        # Current from here: should the fetch fail (its queries then fail, said in the log),
        # `done` still puts the stub back.
        self.current = window
        path = self.ws.run_dir / f"{window}.xplane.pb"
        path.unlink(missing_ok=True)
        viewer_cache.fetch(self.storage, self.prefix, self._rel(path), path)

    def done(self) -> None:
        """Put the current window's trace tables in the bucket and its stub back."""
        if self.current is None:
            return
        window, self.current = self.current, None
        built = [*sorted(self.ws.run_dir.glob(f"{window}.*SSTABLE")),
                 *(self.ws.root / rel for rel in self.answers.get(window, ()))]
        for path in built:
            if path.is_file():
                viewer_cache.put(self.storage, self.prefix, self._rel(path), path)
                self.put.append(self._rel(path))
                path.unlink()
        path = self.ws.run_dir / f"{window}.xplane.pb"
        path.unlink(missing_ok=True)
        os.link(_stub(self.scratch, self.owner[window]), path)

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.ws.root).as_posix()


def _duration(seconds: float) -> str:
    return f"{seconds / 60:,.0f} min" if seconds >= 120 else f"{seconds:,.2f} s"


def task_share(windows: Mapping[str, int], task: int, tasks: int) -> list[str]:
    """The windowed hosts task `task` of `tasks` builds first: hosts with the most windows
    first, each to the task with the fewest windows so far (the lowest index on a tie)."""
    loads = [0] * max(1, tasks)
    shares: list[list[str]] = [[] for _ in loads]
    for host, count in sorted(windows.items(), key=lambda kv: (-kv[1], kv[0])):
        t = min(range(len(loads)), key=lambda i: (loads[i], i))
        loads[t] += count
        shares[t].append(host)
    return shares[task] if 0 <= task < len(shares) else []


def _order(windows: Mapping[str, int], task: int, tasks: int) -> list[str]:
    """The windowed hosts in the order task `task` tries to take them: its share first."""
    mine = task_share(windows, task, tasks)
    return [*mine, *(h for h in sorted(windows) if h not in mine)]


def prebuild_seconds(session: SessionRecord, windows: Mapping[str, int] | None = None,
                     tasks: int = 1) -> float:
    """About how long the prebuild of `session` takes (VIEW_SECONDS_PER_BYTE): with its
    windowed hosts (`windows`) shared by `tasks`, the hosts viewed whole and the largest
    share."""
    sizes = {h: r.size for h, r in session.hosts.items() if r.status == "ARRIVED"}
    windows = windows or {}
    shares = [task_share(windows, t, tasks) for t in range(max(1, tasks))]
    whole = sum(size for h, size in sizes.items() if h not in windows)
    return VIEW_SECONDS_PER_BYTE * (whole + max(sum(sizes[h] for h in share)
                                                for share in shares))


def _plan(session: SessionRecord, budget_bytes: int | None, window_bytes: int | None,
          deadline_s: float, tasks: int) -> dict[str, int]:
    """The windowed hosts (`view_windows`); NotPrebuilt when over the deadline."""
    windows = view_windows(session, budget_bytes, window_bytes=window_bytes)
    if deadline_s and (took := prebuild_seconds(session, windows, tasks)) > deadline_s:
        size = sum(r.size for r in session.hosts.values() if r.status == "ARRIVED")
        shared = f", shared by {tasks} tasks," if tasks > 1 and windows else ""
        raise NotPrebuilt(
            f"prebuilding its {len(session.hosts)} hosts ({size / 1024**3:,.2f} GiB){shared} "
            f"would take about {_duration(took)}, over its deadline of {_duration(deadline_s)}")
    return windows


def part_name(host: str) -> str:
    """Where a windowed host's part is kept in the cache (see the module's notes)."""
    return f"{PARTS}/{host}.json"


def _build_host(ws: Workspace, session: SessionRecord, storage: Storage, host: str,
                count: int, scratch: Path, prefix: str,
                view: dict[str, Any]) -> dict[str, Any]:
    """Cut one windowed host into its windows and build each window's trace, every file
    going to the bucket as it is done; then its part, which lists them. `view` (the
    workspace's windowed view so far) gets the host's windows and stub."""
    counts, put = _cut(ws, session, storage, {host: count}, scratch, prefix)
    view["windows"][host] = counts[host]
    view["stubs"][host] = stub_name(host)
    ws.view(view)
    answers: dict[str, list[str]] = {}
    built: list[str] = []
    in_place = _WindowInPlace(ws, storage, prefix, scratch, counts, answers)
    for k in range(counts[host]):
        for route, query in trace_queries(ws.run, window_host(host, k)):
            try:
                in_place.before(query)
                ws.answer(route, query)
            except Exception as e:  # noqa: BLE001 - one window's failure leaves the others
                log.warning("viewer prebuild of %s %s failed: %s", route, query, e)
                continue
            built.append(f"{route}?{urlencode(sorted(query.items()))}")
            body = ws.cached_path(route, query)
            answers.setdefault(query["host"], []).extend(
                p.relative_to(ws.root).as_posix() for p in (body, body.with_suffix(".json")))
    in_place.done()
    part = {"host": host, "windows": counts[host], "put": sorted([*put, *in_place.put]),
            "answers": answers, "built": built}
    storage.write_bytes(f"{prefix}/{part_name(host)}", json.dumps(part).encode(),
                        content_type="application/json")
    return part


def _read_part(storage: Storage, prefix: str, host: str) -> dict[str, Any] | None:
    if storage.stat(f"{prefix}/{part_name(host)}") is None:
        return None
    part: dict[str, Any] = json.loads(storage.read_bytes(f"{prefix}/{part_name(host)}"))
    return part


def _walk(ws: Workspace, session: SessionRecord, storage: Storage, order: list[str],
          windows: Mapping[str, int], scratch: Path, prefix: str, view: dict[str, Any],
          take: Take, fresh: bool = False) -> dict[str, dict[str, Any]]:
    """Build each host of `order` that has no part yet (`fresh`: whatever parts there are,
    left by an expired cache) and that this task takes; returns the parts built here."""
    parts: dict[str, dict[str, Any]] = {}
    for host in order:
        if not fresh and storage.stat(f"{prefix}/{part_name(host)}") is not None:
            continue
        with take(host) as mine:
            if mine:
                parts[host] = _build_host(ws, session, storage, host, windows[host], scratch,
                                          prefix, view)
    return parts


def _free(host: str) -> AbstractContextManager[bool]:
    """`take` without other tasks: every host is this task's."""
    return contextlib.nullcontext(True)


def build_share(session: SessionRecord, storage: Storage, *, task: int, tasks: int,
                take: Take, tmp_dir: str | None = None, budget_bytes: int | None = None,
                window_bytes: int | None = None, deadline_s: float = 0.0) -> list[str]:
    """Task `task` (> 0) of a collect job of `tasks`: build its share of the session's
    windowed hosts, then any host nobody has taken, each with its part (see the module's
    notes); returns the hosts it built. Task 0's `prebuild` writes the manifest."""
    prefix = cache_prefix(session)
    windows = _plan(session, budget_bytes, window_bytes, deadline_s, tasks)
    order = _order(windows, task, tasks)
    if not order:
        return []
    with tempfile.TemporaryDirectory(prefix="mldiag-viewer-", dir=tmp_dir) as tmp:
        ws = Workspace(Path(tmp) / "ws", session)
        ws.trim = False
        ws.materialise(session, storage, skip=set(arrived_hosts(session)), prebuilt=False)
        scratch = Path(tmp) / "scratch"
        scratch.mkdir()
        (ws.run_dir / CACHE_VERSION_FILE).write_text(xprof_version())
        view: dict[str, Any] = {"windows": {}, "stubs": {}}
        return sorted(_walk(ws, session, storage, order, windows, scratch, prefix, view, take))


def _gather(ws: Workspace, session: SessionRecord, storage: Storage,
            windows: Mapping[str, int], scratch: Path, prefix: str, view: dict[str, Any],
            take: Take, started: float, deadline_s: float, poll_s: float,
            tasks: int, fresh: bool = False) -> dict[str, dict[str, Any]]:
    """Task 0's windowed hosts: its share and any host nobody holds, built here; the
    others' parts as their tasks write them (a host whose claim lapses is taken over).
    Each host built elsewhere has its stub fetched to stand in for its windows."""
    parts = _walk(ws, session, storage, _order(windows, 0, tasks), windows, scratch, prefix,
                  view, take, fresh)
    # Past the deadline the task would be killed: the job's retry then finds the parts.
    wait_until = started + (deadline_s or 2 * prebuild_seconds(session, windows, tasks) + 600)
    while missing := [h for h in sorted(windows) if h not in parts]:
        for host in missing:
            part = _read_part(storage, prefix, host)
            if part is None:
                parts.update(_walk(ws, session, storage, [host], windows, scratch, prefix,
                                   view, take))
                continue
            stub = _stub(scratch, host)
            viewer_cache.fetch(storage, prefix, stub_name(host), stub)
            for k in range(int(part["windows"])):
                path = ws.run_dir / f"{window_host(host, k)}.xplane.pb"
                path.unlink(missing_ok=True)
                os.link(stub, path)
            view["windows"][host] = int(part["windows"])
            view["stubs"][host] = stub_name(host)
            ws.view(view)
            parts[host] = part
        if [h for h in windows if h not in parts]:
            if time.monotonic() > wait_until:
                raise TimeoutError(
                    "the viewer prebuild's other tasks did not finish hosts "
                    f"{', '.join(h for h in sorted(windows) if h not in parts)} in time")
            time.sleep(poll_s)
    return parts


def prebuild(session: SessionRecord, storage: Storage, *, tmp_dir: str | None = None,
             budget_bytes: int | None = None, op_stats_name: str | None = None,
             window_bytes: int | None = None, deadline_s: float = 0.0, tasks: int = 1,
             take: Take | None = None, poll_s: float = 2.0,
             fresh: bool = False) -> dict[str, Any]:
    """Build a session's viewer caches and store them in the bucket; returns the manifest.

    Hosts whose conversions would not fit `budget_bytes` are viewed window by window (see
    the module's notes; `window_bytes` sets the windows' size), with the session's op_stats
    from `op_stats_name`. Raises NotPrebuilt when that cannot be done, or would not be done
    within `deadline_s` (0: no deadline). With `tasks` > 1 this is task 0 of a collect job
    whose other tasks run `build_share`, and `take` claims a host (see the module's notes).
    The manifest is written last, so a reader never sees half a cache. `fresh` (a rebuild
    of an expired cache, one task) builds every host again, whatever parts are left."""
    prefix = cache_prefix(session)
    started = time.monotonic()
    windows = _plan(session, budget_bytes, window_bytes, deadline_s, tasks)
    if windows and (op_stats_name is None or storage.stat(op_stats_name) is None):
        raise NotPrebuilt("its hosts are viewed in time windows, and the collection kept no "
                          "op_stats of the session to show beside them")
    with tempfile.TemporaryDirectory(prefix="mldiag-viewer-", dir=tmp_dir) as tmp:
        ws = Workspace(Path(tmp) / "ws", session)
        # Every answer built goes to the bucket: none is trimmed to a console's share (the
        # traces of 45 windows are over it, and the overview built first went).
        ws.trim = False
        ws.materialise(session, storage, skip=set(windows), prebuilt=False)
        scratch = Path(tmp) / "scratch"
        scratch.mkdir()
        (ws.run_dir / CACHE_VERSION_FILE).write_text(xprof_version())
        view: dict[str, Any] = {"windows": {}, "stubs": {}}
        parts = _gather(ws, session, storage, windows, scratch, prefix, view, take or _free,
                        started, deadline_s, poll_s, max(1, tasks),
                        fresh) if windows else {}
        put = sorted(rel for part in parts.values() for rel in part["put"])
        built = [b for h in sorted(parts) for b in parts[h]["built"]]
        answers = {w: files for part in parts.values() for w, files in part["answers"].items()}
        if windows:
            assert op_stats_name is not None
            storage.fetch_to(op_stats_name, ws.run_dir / ALL_HOSTS_OP_STATS)
            # xprof's plugin clears a run directory's saved results (these op_stats included)
            # before its first conversion there unless this file names its version.
            (ws.run_dir / CACHE_VERSION_FILE).write_text(xprof_version())
        traced = {window_host(h, k) for h, n in view["windows"].items() for k in range(n)}
        for route, query in default_queries(ws):
            if query.get("host") in traced and query.get("tag") == "trace_viewer@":
                continue  # a window's trace: built with its host
            try:
                ws.answer(route, query)
                built.append(f"{route}?{urlencode(sorted(query.items()))}")
            except Exception as e:  # noqa: BLE001 - one tool's failure leaves the others
                log.warning("viewer prebuild of %s %s failed: %s", route, query, e)
        files: list[str] = list(put)
        for path in sorted(ws.root.rglob("*")):
            rel = path.relative_to(ws.root).as_posix()
            if not path.is_file() or any(part.startswith(".") for part in rel.split("/")):
                continue  # xprof's tool-list cache keys on file mtimes: ours replaces it
            if path.name.endswith(".xplane.pb") and path.stem.removesuffix(
                    ".xplane") in arrived_hosts_of(ws):
                continue  # a host viewed whole: the console reads it from the session
            if rel in put:
                continue  # a window's stub: the window itself is in the bucket
            viewer_cache.put(storage, prefix, rel, path)
            files.append(rel)
        manifest: dict[str, Any] = {
            "key": ws.key, "xprof": xprof_version(), "files": sorted(set(files)),
            "built": built, "elapsed_ms": round((time.monotonic() - started) * 1000, 1)}
        if windows:
            # The console fetches a window's answers with the window, when a request names it.
            manifest["view"] = {**view, "answers": answers}
        storage.write_bytes(f"{prefix}/{MANIFEST}", json.dumps(manifest, indent=1).encode(),
                            content_type="application/json")
    return manifest
