"""Benchmark: first open of a session in the XProf viewer, the console beside the official server.

    python bench/viewer.py [--large PATH] [--tpu PATH] [--repeat N] [--clients 8]
                           [--json OUT] [--workdir DIR] [--rss-limit 12G] [--no-frontend]

On the same files (the TPU fixture and a ~100 MB profile), in one run, both sides cold:
  official: `xprof --logdir=<fresh copy> --port=P`, a fresh process and a fresh copy each time;
  console:  a fresh `mldiag console` process each time, with an empty workspace directory
            (MLDIAG_VIEWER_CACHE_DIR), as a new console instance has. Its home was set up first
            by `mldiag up`, which analysed the session and, once it was REPORTED, prebuilt its
            viewer caches in the bucket
            (`xprof-cache/<session dir>/analysis/<key>/manifest.json`).
Measured:
  first open: the requests the official frontend makes, in its order: runs, run_tools,
      hosts?tag=overview_page, data?tag=overview_page (the overview is shown), then
      hosts?tag=trace_viewer@ and the trace viewer's data request (the trace is shown). The
      queries are the frontend's own, as logged from it with Playwright (checked again at the
      start of each run unless --no-frontend);
  N concurrent first opens (--clients, default 8): N clients ask for the trace at once on a
      session nobody opened: the official server; the console on a prebuilt session; the
      console on a session analysed with MLDIAG_PREBUILD_VIEWER=0, which builds on first open.
Peak RSS is the server process's VmHWM; CPU is the server's process tree. Each measurement is
repeated N times (--repeat), the sides alternating; medians are reported. --large defaults to
a 103 MB profile generated with bench/scale.py's workload.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qsl, urlencode, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _proc import tree_cpu_s  # noqa: E402 - bench/_proc.py, beside this file
from _workdir import workdir  # noqa: E402 - bench/_workdir.py

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
TPU_FIXTURE = (REPO.parent / "shared" / "fixtures" / "tpu_inference_2" / "plugins" / "profile"
               / "run1" / "tpu_inference_2.xplane.pb")
RUN = "bench"
# bench/scale.py's workload: 46,473 steps gave 103 MB (BENCHMARKS.md, "Large profiles").
LARGE_STEPS = 46_473
# The trace viewer asks for as many events as its width allows: 4120 in a 1280x720 window.
RESOLUTION = "4120"


@dataclass(frozen=True)
class Profile:
    label: str
    session: str  # the session on our side, the run (profile directory) on the official side
    host: str
    path: Path

    @property
    def mb(self) -> float:
        return self.path.stat().st_size / 1024**2


Query = tuple[str, dict[str, str]]


def overview_queries(p: Profile, host: str = "") -> list[Query]:
    """What the frontend asks for when it opens a session (its default tool, the overview),
    on the first host the `hosts` route lists (`host`; a large host viewed in time windows
    is listed as its windows)."""
    return [("runs", {}), ("run_tools", {"run": p.session}),
            ("hosts", {"run": p.session, "tag": "overview_page"}),
            ("data", {"run": p.session, "tag": "overview_page", "host": host or p.host})]


def trace_query(p: Profile, host: str = "") -> dict[str, str]:
    host = host or p.host
    return {"run": p.session, "tag": "trace_viewer@", "host": host, "hosts": host,
            "replace_model": "true", "new_backend": "false", "resolution": RESOLUTION}


def trace_queries(p: Profile, host: str = "") -> list[Query]:
    """What it asks for when the user then picks the trace viewer."""
    return [("hosts", {"run": p.session, "tag": "trace_viewer@"}),
            ("data", trace_query(p, host))]


def prebuilt_trace_query(p: Profile, host: str = "") -> dict[str, str]:
    """The trace request that `mldiag.viewer_prebuild.default_queries` prebuilds as a whole
    response."""
    return {"run": p.session, "tag": "trace_viewer@", "host": host or p.host}


# Processes and requests


def _cache_dir(session_dir: Path) -> Path:
    """Where a session's viewer caches are in a local bucket (`viewer_cache.cache_prefix`):
    under the bucket's xprof-cache/, at the session directory's path, then analysis/."""
    bucket = next(p for p in session_dir.parents if p.name == "bucket")
    return bucket / "xprof-cache" / session_dir.relative_to(bucket) / "analysis"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fetch(url: str, headers: dict[str, str], timeout: float = 900) -> tuple[int, bytes]:
    """Status and body as sent on the wire: it asks for compression, as a browser does."""
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip, deflate, br",
                                                   **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def get(url: str, headers: dict[str, str], timeout: float = 900) -> tuple[int, float, int]:
    """(status, seconds, body bytes) of one GET."""
    start = time.perf_counter()
    status, body = fetch(url, headers, timeout)
    return status, time.perf_counter() - start, len(body)


def status_kb(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """Every default setting: no MLDIAG_* variable but the home (and `extra`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLDIAG_")}
    return {**env, "MLDIAG_HOME": str(home), "PYTHONUNBUFFERED": "1", **extra}


def warm(paths: list[Path]) -> None:
    """Read the files once, so that neither side pays the first read from this VM's disk."""
    for path in paths:
        with open(path, "rb") as f:
            while f.read(64 * 1024**2):
                pass


class Server:
    """A server under test, on its own port: its data routes' prefix, peak RSS and CPU. A
    watchdog kills it past `rss_limit` bytes, so that a burst cannot take the machine down."""

    def __init__(self, argv: list[str], env: dict[str, str], base: str, headers: dict[str, str],
                 log: Path, rss_limit: int, cleanup: list[Path]) -> None:
        self.base, self.headers, self.cleanup = base, headers, cleanup
        self.log = log
        self._log: IO[bytes] = log.open("wb")
        started = time.perf_counter()
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.killed_at_limit = False
        self.killed_at = 0.0  # perf_counter() when the watchdog killed it
        self._limit = rss_limit
        self._peak_kb = 0
        self._cpu_s = 0.0
        self._stop = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()
        self._wait_ready()
        self.startup_s = time.perf_counter() - started

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            # Kept for after it is killed: a dead process has neither.
            self._peak_kb = max(self._peak_kb, status_kb(self.proc.pid, "VmHWM"))
            self._cpu_s = max(self._cpu_s, tree_cpu_s(self.proc.pid))
            if status_kb(self.proc.pid, "VmRSS") * 1024 > self._limit:
                self.killed_at_limit = True
                self.killed_at = time.perf_counter()
                self.proc.kill()
                return

    def _wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if get(self.url("version"), self.headers, timeout=5)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise SystemExit(f"{self.proc.args} did not start:\n{self.log.read_text()[-3000:]}")

    def url(self, route: str, query: dict[str, str] | None = None) -> str:
        return f"{self.base}/{route}" + (f"?{urlencode(query)}" if query else "")

    def get(self, route: str, query: dict[str, str] | None = None) -> tuple[int, float, int]:
        return get(self.url(route, query), self.headers)

    def first_host(self, p: Profile, tag: str) -> str:
        """The host the frontend shows first for `tag`: the first the `hosts` route lists."""
        try:
            status, body = fetch(self.url("hosts", {"run": p.session, "tag": tag}),
                                 self.headers)
            listed = json.loads(body) if status == 200 else []
        except (OSError, ValueError):
            listed = []
        return str(listed[0]["hostname"]) if listed else p.host

    def peak_rss_mb(self) -> int:
        return round(max(self._peak_kb, status_kb(self.proc.pid, "VmHWM")) / 1024)

    def cpu_s(self) -> float:
        return max(self._cpu_s, tree_cpu_s(self.proc.pid) if self.proc.poll() is None else 0.0)

    def stop(self) -> None:
        self._stop.set()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        for path in self.cleanup:
            shutil.rmtree(path, ignore_errors=True)


class Bench:
    def __init__(self, work: Path, rss_limit: int) -> None:
        self.work = work
        self.rss_limit = rss_limit
        self.count = 0

    def _tag(self, name: str) -> str:
        self.count += 1
        return f"{self.count:03d}-{name}"

    def official(self, p: Profile) -> Server:
        """`xprof --logdir` on a fresh copy of the file, in a fresh process."""
        tag = self._tag(f"official-{p.session}")
        logdir = self.work / "official" / tag
        target = logdir / "plugins" / "profile" / p.session
        target.mkdir(parents=True)
        shutil.copyfile(p.path, target / f"{p.host}.xplane.pb")
        port, grpc_port = free_port(), free_port()
        argv = [str(BIN / "xprof"), f"--logdir={logdir}", f"--port={port}",
                f"--grpc_port={grpc_port}"]
        return Server(argv, dict(os.environ), f"http://127.0.0.1:{port}/data/plugin/profile",
                      {}, self.work / "logs" / f"{tag}.log", self.rss_limit, [logdir])

    def console(self, home: Path, p: Profile) -> Server:
        """A fresh `mldiag console` on `home`, with an empty workspace directory."""
        tag = self._tag(f"console-{home.name}-{p.session}")
        cache = self.work / "viewer" / tag
        warm([f for f in (home / "bucket" / RUN / "plugins" / "profile" / p.session).rglob("*")
              if f.is_file()])
        port = free_port()
        env = clean_env(home, MLDIAG_VIEWER_CACHE_DIR=str(cache))
        token = (home / "admin.token").read_text().strip()
        base = f"http://127.0.0.1:{port}/runs/{RUN}/sessions/{p.session}/xprof/data/plugin/profile"
        return Server([str(BIN / "mldiag"), "console", "--port", str(port)], env, base,
                      {"Authorization": f"Bearer {token}"}, self.work / "logs" / f"{tag}.log",
                      self.rss_limit, [cache])


# Setting up our side: `mldiag up` analyses each session, then (by default) prebuilds


BUDGETS: dict[str, str] = {}  # MLDIAG_MEMORY_BUDGET / MLDIAG_VIEWER_MEMORY_BUDGET, if given


def analyse(home: Path, profiles: list[Profile], *, prebuild: bool) -> dict[str, Any]:
    """Drop each profile into `mldiag up`'s bucket, one at a time, and wait until it is REPORTED
    and, with `prebuild`, until its viewer manifest is in the bucket."""
    env = clean_env(home, **BUDGETS, **({} if prebuild else {"MLDIAG_PREBUILD_VIEWER": "0"}))
    proc = subprocess.Popen([str(BIN / "mldiag"), "up", "--port", "0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    url: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("console: "):
                url.append(line.split(" ", 1)[1].strip().rstrip("/"))

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 120
    while not url:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("`mldiag up` did not start:\n" + "\n".join(lines[-30:]))
        time.sleep(0.05)
    token = home / "admin.token"  # written just after the console line is printed
    while not token.is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("`mldiag up` wrote no admin token:\n" + "\n".join(lines[-30:]))
        time.sleep(0.05)
    time.sleep(0.1)
    headers = {"Authorization": f"Bearer {token.read_text().strip()}"}
    out: dict[str, Any] = {}
    try:
        for p in profiles:
            session_dir = home / "bucket" / RUN / "plugins" / "profile" / p.session
            session_dir.mkdir(parents=True)
            shutil.copyfile(p.path, session_dir / f"{p.host}.xplane.pb")
            dropped = time.perf_counter()
            reported = built = 0.0
            manifests: list[Path] = []
            while not (reported and (built or not prebuild)):
                if proc.poll() is not None or time.perf_counter() - dropped > 1800:
                    raise SystemExit(f"{p.session} not done:\n" + "\n".join(lines[-40:]))
                if not reported:
                    status, body = fetch(f"{url[0]}/api/v1/runs/{RUN}/sessions/{p.session}",
                                         headers)
                    if status == 200:
                        state = json.loads(body)
                        if state["state"] == "FAILED":
                            raise SystemExit(f"{p.session} FAILED: {state['reason']}")
                        if state["state"] == "REPORTED":
                            reported = time.perf_counter()
                manifests = sorted(_cache_dir(session_dir).glob("*/manifest.json"))
                if manifests and not built:
                    built = time.perf_counter()
                time.sleep(0.1)
            row: dict[str, Any] = {"drop_to_reported_s": round(reported - dropped, 2)}
            if prebuild:
                manifest = json.loads(manifests[0].read_text())
                cache = manifests[0].parent
                row.update(reported_to_prebuilt_s=round(max(0.0, built - reported), 2),
                           prebuild_elapsed_s=round(manifest["elapsed_ms"] / 1000, 2),
                           cache_files=len(manifest["files"]),
                           cache_mb=round(sum(f.stat().st_size for f in cache.rglob("*")
                                              if f.is_file()) / 1024**2, 1),
                           prebuilt_queries=manifest["built"],
                           view=manifest.get("view"))
            else:
                time.sleep(1.0)
                row["manifest_present"] = any(_cache_dir(session_dir).glob("*/*.json"))
            out[p.session] = row
            print(f"   {home.name}/{p.session}: {json.dumps(row)}", flush=True)
        out["up_peak_rss_mb"] = round(status_kb(proc.pid, "VmHWM") / 1024)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
    return out


# The measurements


def first_open(server: Server, p: Profile, *, prebuilt: bool = False) -> dict[str, Any]:
    """The frontend's requests, one after the other: overview shown, then the trace shown."""
    cpu0 = server.cpu_s()
    requests = []

    def run(queries: list[Query]) -> float:
        start = time.perf_counter()
        for route, query in queries:
            try:
                status, secs, size = server.get(route, query)
            except OSError:  # the connection closed without an answer (the server killed)
                status, secs, size = -1, time.perf_counter() - start, 0
            requests.append({"route": route, "tag": query.get("tag", ""), "status": status,
                             "s": round(secs, 3), "bytes": size})
        return time.perf_counter() - start

    # The frontend picks the first host each tool's host list names (ALL_HOSTS first for the
    # overview of several hosts); its hosts requests are timed in `run` as it asks them.
    alive = server.proc.poll() is None
    overview_host = server.first_host(p, "overview_page") if alive else p.host
    overview_s = run(overview_queries(p, overview_host))
    host = server.first_host(p, "trace_viewer@") if server.proc.poll() is None else p.host
    trace_s = run(trace_queries(p, host))
    out = {"overview_s": round(overview_s, 3), "trace_s": round(trace_s, 3),
           "trace_data_s": requests[-1]["s"],
           "overview_wire_mb": round(requests[3]["bytes"] / 1024**2, 2),
           "trace_wire_mb": round(requests[-1]["bytes"] / 1024**2, 2),
           "ok": all(r["status"] == 200 for r in requests),
           "startup_s": round(server.startup_s, 2), "cpu_s": round(server.cpu_s() - cpu0, 2),
           "peak_rss_mb": server.peak_rss_mb(), "requests": requests}
    # The same trace at another window width, now that the process has loaded xprof and the
    # trace's SSTABLE exists: what a cached-response miss costs without the first-use imports.
    if server.proc.poll() is None:
        status, secs, _ = server.get("data", {**trace_query(p, host), "resolution": "4000"})
        out["trace_other_width_s"] = round(secs, 3) if status == 200 else f"HTTP {status}"
    if prebuilt and server.proc.poll() is None:
        # For comparison: the trace request that the pipeline did prebuild, now that the
        # workspace is open.
        status, secs, _ = server.get("data", prebuilt_trace_query(p, host))
        out["prebuilt_trace_data_s"] = round(secs, 3) if status == 200 else f"HTTP {status}"
    if server.killed_at_limit:
        out["killed_at_rss_limit"] = True
    return out


def burst(server: Server, p: Profile, clients: int) -> dict[str, Any]:
    """`clients` trace requests at once, on a session this server never opened."""
    host = server.first_host(p, "trace_viewer@")
    barrier = threading.Barrier(clients + 1)
    results: list[tuple[int, float]] = [(0, 0.0)] * clients
    t0 = [0.0]

    def one(i: int) -> None:
        barrier.wait()
        try:
            status, _, _ = server.get("data", trace_query(p, host))
        except OSError:
            status = -1  # the connection closed without an answer
        results[i] = (status, time.perf_counter() - t0[0])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    cpu0 = server.cpu_s()
    t0[0] = time.perf_counter()
    barrier.wait()
    for t in threads:
        t.join()
    done = sorted(r[1] for r in results)
    statuses = Counter(r[0] for r in results)
    cpu_s = server.cpu_s() - cpu0
    # Is the session usable afterwards? (A burst can leave the official server's cache broken.)
    after: int | str = "server gone"
    after_s = 0.0
    if server.proc.poll() is None:
        after, after_s, _ = server.get("data", trace_query(p, host))
    out = {"all_done_s": round(done[-1], 3), "first_done_s": round(done[0], 3),
           "non_200": sum(n for s, n in statuses.items() if s != 200),
           "statuses": {str(s): n for s, n in sorted(statuses.items())},
           "cpu_s": round(cpu_s, 2), "peak_rss_mb": server.peak_rss_mb(),
           "next_request": after, "next_request_s": round(after_s, 3)}
    if server.killed_at_limit:
        out["killed_at_rss_limit_after_s"] = round(server.killed_at - t0[0], 1)
    return out


def measured(make: Callable[[], Server], fn: Callable[[Server], dict[str, Any]]) -> dict[str, Any]:
    server = make()
    try:
        return fn(server)
    finally:
        server.stop()


def frontend_requests(server: Server) -> list[Query]:
    """Drive the official frontend once (chromium, 1280x720): open the session, then pick the
    trace viewer. Returns the data requests it made, in order."""
    from playwright.sync_api import sync_playwright

    seen: list[Query] = []

    def on_request(request: Any) -> None:
        parts = urlsplit(request.url)
        route = parts.path.rsplit("/", 1)[-1]
        if parts.path.startswith(urlsplit(server.base).path) and route in (
                "runs", "run_tools", "hosts", "data"):
            seen.append((route, dict(parse_qsl(parts.query))))

    def wait_for(tag: str, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while not any(r == "data" and q.get("tag") == tag for r, q in seen):
            if time.monotonic() > deadline:
                raise SystemExit(f"the frontend never asked for {tag}: {seen}")
            page.wait_for_timeout(100)
        page.wait_for_load_state("networkidle", timeout=timeout * 1000)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_context(extra_http_headers=server.headers,
                                   viewport={"width": 1280, "height": 720}).new_page()
        page.on("request", on_request)
        page.goto(server.base + "/")
        wait_for("overview_page")
        selects = page.locator("mat-select")
        for i in range(selects.count()):
            if "Overview" in selects.nth(i).inner_text():
                selects.nth(i).click()
                break
        page.locator("mat-option", has_text="Trace Viewer").first.click()
        wait_for("trace_viewer@")
        browser.close()
    return seen


def check_frontend(server: Server, p: Profile) -> dict[str, Any]:
    seen = frontend_requests(server)
    expected = overview_queries(p) + trace_queries(p)
    missing = [q for q in expected if q not in seen]
    print("   frontend's requests: " + "; ".join(f"{r}?{urlencode(q)}" for r, q in seen),
          flush=True)
    print("   the bench's queries are the frontend's" if not missing else
          f"   MISMATCH, not sent by the frontend: {missing}", flush=True)
    return {"seen": [f"{r}?{urlencode(q)}" for r, q in seen],
            "missing": [f"{r}?{urlencode(q)}" for r, q in missing]}


# Reporting


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
    return round(statistics.median(values), 3) if values else None


def summarise(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {k: median_of(runs, k) for k in keys}
    out["runs"] = runs
    return out


def machine() -> str:
    from importlib.metadata import version

    mem = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
               if line.startswith("MemTotal"))
    return (f"{os.cpu_count()} cores, {mem / 1024**2:.0f} GiB, Python {sys.version.split()[0]}, "
            f"xprof {version('xprof')}")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def parse_bytes(text: str) -> int:
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].isalpha() else int(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", help="a ~100 MB .xplane.pb (default: generate one)")
    parser.add_argument("--tpu", default=str(TPU_FIXTURE), help="the small profile")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement")
    parser.add_argument("--clients", type=int, default=8, help="concurrent first opens")
    parser.add_argument("--workdir", help="where copies, homes and logs go (default: a temp dir, "
                        "removed at exit)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--rss-limit", default="12G",
                        help="kill a server under test past this RSS (default 12G)")
    parser.add_argument("--memory-budget", help="MLDIAG_MEMORY_BUDGET of the pipeline")
    parser.add_argument("--viewer-budget",
                        help="MLDIAG_VIEWER_MEMORY_BUDGET of the prebuild (the collect job's "
                             "on Google Cloud: 14G)")
    parser.add_argument("--reuse", action="store_true",
                        help="reuse the homes an earlier run set up in --workdir")
    parser.add_argument("--no-frontend", action="store_true",
                        help="skip checking the bench's queries against the real frontend")
    args = parser.parse_args()
    if args.memory_budget:
        BUDGETS["MLDIAG_MEMORY_BUDGET"] = args.memory_budget
    if args.viewer_budget:
        BUDGETS["MLDIAG_VIEWER_MEMORY_BUDGET"] = args.viewer_budget
    work = workdir(args.workdir, "mldiag-viewer-bench-")
    work.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    bench = Bench(work, parse_bytes(args.rss_limit))

    if args.large:
        large_path = Path(args.large)
    else:
        from scale import generate  # bench/scale.py's workload, 103 MB

        print(f"generating a profile of {LARGE_STEPS} steps...", flush=True)
        large_path = generate(work / "large", LARGE_STEPS)
    tpu_path = Path(args.tpu)
    profiles = [Profile("TPU fixture", "tpu", tpu_path.name.removesuffix(".xplane.pb"), tpu_path),
                Profile(f"{large_path.stat().st_size / 1024**2:.0f} MB", "large",
                        large_path.name.removesuffix(".xplane.pb"), large_path)]
    print(f"machine: {machine()}; load average at start {load()}", flush=True)
    for p in profiles:
        print(f"profile {p.label}: {p.path} ({p.mb:.1f} MB, host {p.host})", flush=True)

    # The homes: the large session first, alone, so its prebuild is timed on an idle pipeline.
    print("== setting up: mldiag up, prebuilt", flush=True)
    pre, nopre = work / "home-prebuilt", work / "home-not-prebuilt"
    saved = work / "setup.json"
    if args.reuse and saved.is_file():
        # The homes of an earlier run in this workdir, analysed and prebuilt already.
        setup = json.loads(saved.read_text())
        print("   reusing the homes set up earlier in this workdir", flush=True)
    else:
        setup = {"prebuilt": analyse(pre, profiles[::-1], prebuild=True)}
        print("== setting up: mldiag up, MLDIAG_PREBUILD_VIEWER=0", flush=True)
        setup["not_prebuilt"] = analyse(nopre, profiles[::-1], prebuild=False)
        saved.write_text(json.dumps(setup))
    frontend = None
    if not args.no_frontend:
        print("== the real frontend's requests (console, TPU fixture)", flush=True)
        frontend = measured(lambda: bench.console(pre, profiles[0]),
                            lambda s: check_frontend(s, profiles[0]))

    sides: dict[str, Callable[[Profile], Server]] = {
        "official": bench.official, "console": lambda p: bench.console(pre, p)}
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {p.session: {} for p in profiles}
    for i in range(args.repeat):
        # Alternate which side goes first, so drift in the machine's speed hits both alike.
        order = ["official", "console"] if i % 2 == 0 else ["console", "official"]
        print(f"== run {i + 1}/{args.repeat}, load average {load()}", flush=True)
        for p in profiles:
            runs = rows[p.session]
            for side in order:
                if side == "official":
                    warm([p.path])
                result = measured(lambda side=side, p=p: sides[side](p),
                                  lambda s, side=side, p=p: first_open(
                                      s, p, prebuilt=side == "console"))
                runs.setdefault(f"first_open/{side}", []).append(result)
                print(f"   {p.session} first open, {side}: "
                      f"{json.dumps({k: v for k, v in result.items() if k != 'requests'})}",
                      flush=True)
            cases: list[tuple[str, Callable[[], Server]]] = [
                ("official", lambda p=p: bench.official(p)),
                ("console_prebuilt", lambda p=p: bench.console(pre, p)),
                ("console_not_prebuilt", lambda p=p: bench.console(nopre, p))]
            for name, make in cases if i % 2 == 0 else cases[::-1]:
                if name == "official":
                    warm([p.path])
                result = measured(make, lambda s, p=p: burst(s, p, args.clients))
                runs.setdefault(f"burst/{name}", []).append(result)
                print(f"   {p.session} {args.clients} at once, {name}: {json.dumps(result)}",
                      flush=True)

    first_keys = ("overview_s", "trace_s", "trace_data_s", "trace_other_width_s",
                  "prebuilt_trace_data_s", "overview_wire_mb", "trace_wire_mb", "startup_s",
                  "cpu_s", "peak_rss_mb")
    burst_keys = ("all_done_s", "first_done_s", "non_200", "cpu_s", "peak_rss_mb")
    summary = {p.session: {case: summarise(runs, first_keys if case.startswith("first")
                                           else burst_keys)
                           for case, runs in rows[p.session].items()} for p in profiles}

    print(f"\nmachine: {machine()}; load average at the end {load()}")
    print(f"\nfirst open (medians of {args.repeat}; seconds; the console on a prebuilt session)")
    print(f"{'profile':<12} {'side':<9} {'overview':>9} {'trace':>8} {'trace data':>11} "
          f"{'wire MB':>13} {'startup':>8} {'CPU':>7} {'peak RSS MB':>12} {'all 200':>8}")
    for p in profiles:
        for side in ("official", "console"):
            runs = summary[p.session][f"first_open/{side}"]
            ok = all(r["ok"] for r in runs["runs"])
            wire = f"{runs['overview_wire_mb']} / {runs['trace_wire_mb']}"
            print(f"{p.label:<12} {side:<9} {runs['overview_s']:>9} {runs['trace_s']:>8} "
                  f"{runs['trace_data_s']:>11} {wire:>13} {runs['startup_s']:>8} "
                  f"{runs['cpu_s']:>7} {runs['peak_rss_mb']:>12} {str(ok):>8}")
    print(f"\n{args.clients} concurrent first opens of the trace "
          "(medians; non-200 summed over runs)")
    print(f"{'profile':<12} {'case':<22} {'all done':>9} {'first done':>11} {'non-200':>8} "
          f"{'CPU':>7} {'peak RSS MB':>12}  next request")
    for p in profiles:
        for case in ("official", "console_prebuilt", "console_not_prebuilt"):
            runs = summary[p.session][f"burst/{case}"]
            non_200 = sum(r["non_200"] for r in runs["runs"])
            killed = [r["killed_at_rss_limit_after_s"] for r in runs["runs"]
                      if "killed_at_rss_limit_after_s" in r]
            print(f"{p.label:<12} {case:<22} {runs['all_done_s']:>9} {runs['first_done_s']:>11} "
                  f"{non_200:>4}/{args.clients * len(runs['runs']):<3} {runs['cpu_s']:>7} "
                  f"{runs['peak_rss_mb']:>12}  "
                  f"{','.join(str(r['next_request']) for r in runs['runs'])}"
                  + (f"  killed past --rss-limit {args.rss_limit} in {len(killed)} run(s), "
                     f"after {', '.join(f'{k} s' for k in killed)}" if killed else ""))
    large = summary["large"]
    ours, theirs = large["first_open/console"], large["first_open/official"]
    print(f"\ntarget: first open of the REPORTED {profiles[1].label} session <= 1 s: overview "
          f"{ours['overview_s']} s ({'met' if ours['overview_s'] <= 1 else 'not met'}), "
          f"trace {ours['trace_s']} s ({'met' if ours['trace_s'] <= 1 else 'not met'}); "
          f"official cold: overview {theirs['overview_s']} s, trace {theirs['trace_s']} s")
    pre_large = setup["prebuilt"]["large"]
    print(f"prebuild of the {profiles[1].label} session (paid once by the pipeline): "
          f"{pre_large['prebuild_elapsed_s']} s, {pre_large['cache_mb']} MB of caches; "
          f"pipeline peak RSS {setup['prebuilt']['up_peak_rss_mb']} MB with the prebuild, "
          f"{setup['not_prebuilt']['up_peak_rss_mb']} MB without")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"machine": machine(), "load_average_end": load(), "clients": args.clients,
             "repeat": args.repeat, "profiles": {p.session: {"path": str(p.path), "mb":
                                                             round(p.mb, 1)} for p in profiles},
             "setup": setup, "frontend": frontend, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
