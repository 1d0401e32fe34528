"""Benchmark: the viewer prebuild of a session of several large hosts, in the collect job's
budget (`viewer_prebuild.prebuild`, as the collect job runs it after the report), in one
task or shared by `--tasks` (`viewer_prebuild.build_share` in the others).

    python bench/prebuild.py HOST.xplane.pb [--hosts 3] [--tasks 1,2] [--budget 14G]
                             [--op-stats PATH] [--workdir DIR] [--json OUT]

The session: HOST.xplane.pb under `--hosts` host names (hard links: one file's bytes on disk,
each host a different object to the prebuild), in a local bucket. The op_stats shown beside
windowed hosts are `--op-stats` (default: the TPU fixture's, built here in a second; what
the overview shows, not what is measured).
Measured, in a child process: wall and CPU time, peak resident memory (its VmHWM), and the
peak bytes of its files (the workspace and the cut's scratch, sampled every 0.2 s: /tmp is
memory on Cloud Run); the windows and the bytes put in the bucket. Beside it, what the plan
says for the same session (`viewer_prebuild.view_windows`). Then a first open as the console
serves it (`viewer.Viewers` on a fresh directory: the frontend's first requests, overview
then trace, on the first host each list names), and `--clients` first opens of the trace at
once on another fresh directory; then the framework op stats (over ALL_HOSTS, not
prebuilt), with how many windows the console fetched for it. `--reuse` keeps a prebuild
already in the bucket.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "shared"))
sys.path.insert(0, str(REPO / "bench"))
from _workdir import workdir  # noqa: E402 - bench/_workdir.py

TPU_FIXTURE = (REPO.parent / "shared" / "fixtures" / "tpu_inference_2" / "plugins" / "profile"
               / "run1" / "tpu_inference_2.xplane.pb")
RUN, SESSION = "bench", "prebuild"


def _bytes(text: str) -> int:
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units \
        else int(text)


def _session(bucket: Path, xplane: Path, hosts: int) -> Any:
    from mldiag.model import HostRecord, SessionRecord

    run_dir = bucket / RUN / "plugins" / "profile" / SESSION
    run_dir.mkdir(parents=True, exist_ok=True)
    records = {}
    for k in range(hosts):
        host = f"host{k:02d}"
        dest = run_dir / f"{host}.xplane.pb"
        if not dest.exists():
            os.link(xplane, dest)
        records[host] = HostRecord(object_name=f"{RUN}/plugins/profile/{SESSION}/{host}"
                                   ".xplane.pb", generation="1", size=dest.stat().st_size,
                                   arrived_at=0.0)
    return SessionRecord(run=RUN, session=SESSION, state="REPORTED", hosts=records)


def _op_stats(path: str | None, dest: Path) -> None:
    if path:
        dest.write_bytes(Path(path).read_bytes())
        return
    from mldiag.analysis.collection.profile_input import resolve_session
    from mldiag.analysis.collection.xprof_tools import OP_STATS_FILE, XprofWorkspace

    with XprofWorkspace(resolve_session(TPU_FIXTURE.parent)) as ws:
        ws.precompute_op_stats()
        dest.write_bytes((ws.run_dir / OP_STATS_FILE).read_bytes())


def _child(bucket: str, session: dict[str, Any], budget: int, tmp: str, task: int, tasks: int,
           claims: str, out: mp.Queue) -> None:  # type: ignore[type-arg]
    """Task `task` of `tasks`: task 0 the prebuild (`prebuild`), the others their shares
    (`build_share`), claiming hosts in one SQLite state store as the job's tasks do in
    Firestore."""
    from contextlib import contextmanager

    from mldiag.adapters.local.state import SqliteStateStore
    from mldiag.adapters.local.storage import LocalDirStorage
    from mldiag.model import SessionRecord
    from mldiag.stages.analysis import op_stats_name
    from mldiag.viewer_prebuild import build_share, prebuild

    record = SessionRecord.from_dict(session)
    state = SqliteStateStore(Path(claims))
    owner = f"task-{task}"

    @contextmanager
    def take(host: str) -> Any:
        key = f"viewer-host:{record.run}/{record.session}/{host}"
        mine = state.claim(key, owner, 3600.0, time.time())
        try:
            yield mine
        except BaseException:
            if mine:
                state.release(key, owner)
            raise
        if mine:
            state.complete(key, owner)

    storage = LocalDirStorage(Path(bucket))
    started = time.monotonic()
    if task:
        hosts = build_share(record, storage, task=task, tasks=tasks, take=take, tmp_dir=tmp,
                            budget_bytes=budget)
        out.put({"task": task, "wall_s": round(time.monotonic() - started, 1), "built": hosts,
                 "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)})
        return
    manifest = prebuild(record, storage, tmp_dir=tmp, budget_bytes=budget,
                        op_stats_name=op_stats_name(record), tasks=tasks, take=take)
    out.put({"task": 0, "wall_s": round(time.monotonic() - started, 1),
             "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
             "windows": manifest.get("view", {}).get("windows", {}),
             "files": len(manifest["files"]), "built": len(manifest["built"])})


def _first_open(bucket: Path, session: Any, work: Path, clients: int) -> dict[str, Any]:
    """The frontend's first requests on a console instance that never saw the session."""
    from concurrent.futures import ThreadPoolExecutor

    from mldiag.adapters.local.storage import LocalDirStorage
    from mldiag.viewer import Viewers

    run = session.session

    def trace(host: str) -> dict[str, str]:
        return {"run": run, "tag": "trace_viewer@", "host": host, "hosts": host,
                "replace_model": "true", "new_backend": "false", "resolution": "4120"}

    def first_host(ws: Any, tag: str) -> str:
        body = ws.answer("hosts", {"run": run, "tag": tag}).body
        return str(json.loads(_plain(body))[0]["hostname"])

    out: dict[str, Any] = {}
    for name in ("fresh-one", "fresh-many"):
        shutil.rmtree(work / name, ignore_errors=True)
    start = time.perf_counter()
    ws = Viewers(LocalDirStorage(bucket), work / "fresh-one").workspace(session)
    out["workspace_s"] = round(time.perf_counter() - start, 3)
    ws.answer("run_tools", {"run": run})
    host = first_host(ws, "overview_page")
    ws.answer("data", {"run": run, "tag": "overview_page", "host": host})
    out["overview_s"] = round(time.perf_counter() - start, 3)
    mark = time.perf_counter()
    body = ws.answer("data", trace(first_host(ws, "trace_viewer@"))).body
    out["trace_s"] = round(time.perf_counter() - mark, 3)
    out["first_open_s"] = round(time.perf_counter() - start, 3)
    out["trace_events"] = json.loads(_plain(body)).get("returnedEventsSize")
    # Then a tool over ALL_HOSTS not prebuilt (the framework op stats), as a user picks it.
    mark = time.perf_counter()
    ws.answer("data", {"run": run, "tag": "framework_op_stats",
                       "host": first_host(ws, "framework_op_stats")})
    out["framework_op_stats_s"] = round(time.perf_counter() - mark, 3)
    out["windows_fetched"] = sum(n for n in getattr(ws, "_windows", {}).values()) - len(
        ws.pending)
    many = Viewers(LocalDirStorage(bucket), work / "fresh-many").workspace(session)
    window = first_host(many, "trace_viewer@")

    def one(_: int) -> bool:
        try:
            return bool(many.answer("data", trace(window)).body)
        except Exception:  # noqa: BLE001 - counted as an error
            return False

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        ok = list(pool.map(one, range(clients)))
    out["concurrent"] = {"clients": clients, "all_done_s": round(time.perf_counter() - start, 3),
                         "errors": ok.count(False)}
    return out


def _plain(body: bytes) -> bytes:
    import gzip

    return gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body


def _du(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("xplane", help="one large host's .xplane.pb")
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--tasks", default="1",
                        help="the collect job's tasks sharing the windowed hosts, each a "
                             "process here (on Cloud Run, each its own container); several "
                             "counts (1,2) run one after the other on a fresh cache")
    parser.add_argument("--budget", default="14G", help="the prebuild's memory budget")
    parser.add_argument("--op-stats", help="the session's op_stats (default: the fixture's)")
    parser.add_argument("--workdir", help="where the bucket and the prebuild's files go "
                        "(default: a temp dir, removed at exit)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--clients", type=int, default=8, help="concurrent first opens")
    parser.add_argument("--reuse", action="store_true", help="keep a prebuild already done")
    args = parser.parse_args()

    from mldiag.stages.analysis import op_stats_name
    from mldiag.viewer_prebuild import NotPrebuilt, view_windows

    work = workdir(args.workdir, "mldiag-prebuild-bench-")
    bucket = work / "bucket"
    session = _session(bucket, Path(args.xplane).resolve(), args.hosts)
    stats = bucket / op_stats_name(session)
    stats.parent.mkdir(parents=True, exist_ok=True)
    _op_stats(args.op_stats, stats)
    budget = _bytes(args.budget)
    size = sum(h.size for h in session.hosts.values())
    try:
        plan: Any = view_windows(session, budget)
    except NotPrebuilt as e:
        plan = f"NotPrebuilt: {e}"
    print(f"session: {args.hosts} hosts, {size / 1024**3:.2f} GiB; budget {args.budget}; "
          f"plan: {plan}", flush=True)
    from mldiag.viewer_cache import MANIFEST, cache_prefix

    if args.reuse and (bucket / cache_prefix(session) / MANIFEST).is_file():
        result = json.loads(Path(args.json).read_text()) if args.json and Path(
            args.json).is_file() else {}
        result["first_open"] = _first_open(bucket, session, work, args.clients)
        print(json.dumps(result), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        return
    results = []
    for tasks in [int(t) for t in args.tasks.split(",")]:
        shutil.rmtree(bucket / cache_prefix(session), ignore_errors=True)
        result = _prebuild(work, bucket, session, budget, tasks, args.clients)
        result.update(hosts=args.hosts, session_bytes=size, budget=args.budget,
                      plan=plan if isinstance(plan, str) else {"windows": plan})
        print(json.dumps(result), flush=True)
        results.append(result)
    if args.json:
        Path(args.json).write_text(json.dumps(results[0] if len(results) == 1 else results,
                                              indent=1))


def _prebuild(work: Path, bucket: Path, session: Any, budget: int, tasks: int,
              clients: int) -> dict[str, Any]:
    """One prebuild of the session by `tasks` tasks (processes), then its first opens."""
    tmps = [work / "tmp" / f"task{t}" for t in range(tasks)]
    for tmp in tmps:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    peak_files = [0] * tasks
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            for t, tmp in enumerate(tmps):
                peak_files[t] = max(peak_files[t], _du(tmp))

    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    claims = work / "claims.db"
    claims.unlink(missing_ok=True)
    children = [ctx.Process(target=_child, args=(str(bucket), session.to_dict(), budget,
                                                 str(tmps[t]), t, tasks, str(claims), out))
                for t in range(tasks)]
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for child in children:
        child.start()
    for child in children:
        child.join()
    done.set()
    sampler.join()
    wall = time.monotonic() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    result: dict[str, Any] = {
        "tasks": tasks, "rc": [child.exitcode for child in children], "wall_s": round(wall, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 1),
        # Each task's files at their peak (each task is its own container, its files its
        # memory).
        "peak_files_mb": max(round(f / 2**20) for f in peak_files),
        "peak_files_mb_per_task": [round(f / 2**20) for f in peak_files],
        "bucket_cache_mb": round(_du(bucket / "xprof-cache" / RUN / "plugins" / "profile"
                                     / SESSION) / 2**20)}
    if all(child.exitcode == 0 for child in children):
        reports = sorted((out.get() for _ in children), key=lambda r: r["task"])
        # The largest of the tasks' processes (each its own VmHWM).
        result["peak_rss_mb"] = max(r.pop("peak_rss_mb") for r in reports)
        result.update({k: v for k, v in reports[0].items() if k != "task"})
        result["task_shares"] = [{"task": r["task"], "wall_s": r["wall_s"],
                                  "built": r["built"]} for r in reports]
        result["first_open"] = _first_open(bucket, session, work, clients)
    return result


if __name__ == "__main__":
    main()
