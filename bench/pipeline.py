"""Benchmark: the event pipeline (`mldiag up`) against the collection alone, on one profile.

    python bench/pipeline.py PATH [--repeat N] [--sessions N]

PATH is a logdir, session directory or .xplane.pb (its session's hosts are all dropped).
Measures, in one run on the same profile:
  (1) drop → summary.html wall time through a running `mldiag up` (a subprocess on a fresh
      MLDIAG_HOME with default settings). The clock starts when the last host file is closed in
      the bucket and stops when `analysis/summary.html` appears. Two cases, median of N each,
      after one warm-up session that pays the runtime's first-use imports:
        known:   the session's expected hosts were registered before the drop, as a capture
                 request does; it is analysed as soon as its last host has arrived.
        dropped: nothing registered, so the runtime cannot know how many hosts will come; it
                 waits for the settle window (MLDIAG_SETTLE_S, default 2 s) after the last one.
  (2) `collect()` alone, in-process and warm (median of N after a warm-up), on the same files,
      interleaved with (1) while the runtime idles, so both see the same machine;
  (3) throughput: N sessions (default 20) dropped at once, time until all are REPORTED.

Prints a table; the last line is `drop_to_report_s=<x> collection_s=<y> ratio=<x/y>`, where x
is the `known` case: the settle window is a wait the user configures, not processing time
(its own line reports the `dropped` case).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from mldiag.adapters.local.state import SqliteStateStore
from mldiag.model import CAPTURED, CAPTURING, INVESTIGATING, REPORTED, SessionRecord
from mldiag.settings import Settings

MLDIAG = Path(sys.executable).with_name("mldiag")


@dataclass
class Drop:
    """One measured session: the wall times seen from outside and the runtime's own stamps."""

    key: str
    dropped_at: float
    summary_at: float = 0.0
    reported_at: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.summary_at - self.dropped_at


class Runtime:
    """`mldiag up` on a fresh home, with default settings (no MLDIAG_* but the home)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLDIAG_")}
        env.update(MLDIAG_HOME=str(home), PYTHONUNBUFFERED="1")
        started = time.perf_counter()
        self.proc = subprocess.Popen([str(MLDIAG), "up"], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(120) or self.proc.poll() is not None:
            self.stop()
            raise SystemExit("`mldiag up` did not start:\n" + "\n".join(self.lines))
        self.startup_s = time.perf_counter() - started
        self.state = SqliteStateStore(home / "state.db")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if "watching" in line:
                self.ready.set()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)

    def session_dir(self, run: str, session: str) -> Path:
        return self.home / "bucket" / run / "plugins" / "profile" / session

    def drop(self, run: str, session: str, xplanes: list[Path], *, expected: bool) -> Drop:
        if expected:
            self.state.ensure_run(run, discovered=False)
            self.state.create_session(SessionRecord(
                run=run, session=session, state=CAPTURING, kind="on_demand",
                expected_hosts=[host_of(p) for p in xplanes], created_at=time.time()))
        target = self.session_dir(run, session)
        target.mkdir(parents=True, exist_ok=True)
        for p in xplanes:
            shutil.copyfile(p, target / p.name)  # a plain copy, as a user makes it
        return Drop(key=f"{run}/{session}", dropped_at=time.time())

    def wait_reported(self, drops: list[Drop], timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        waiting = {d.key: d for d in drops}
        while waiting:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"sessions not reported: {sorted(waiting)}\n"
                                 + "\n".join(self.lines[-30:]))
            for key, d in list(waiting.items()):
                run, session = key.split("/")
                summary = self.session_dir(run, session) / "analysis" / "summary.html"
                if not d.summary_at and summary.exists():
                    d.summary_at = time.time()
                s = self.state.get_session(run, session)
                if s is not None and s.state == "FAILED":
                    raise SystemExit(f"{key} FAILED: {s.reason}")
                if d.summary_at and s is not None and s.state == REPORTED:
                    d.reported_at = s.timings[REPORTED]
                    d.phases = phases(d, s)
                    del waiting[key]
            time.sleep(0.005)


def host_of(xplane: Path) -> str:
    return xplane.name.removesuffix(".xplane.pb")


def phases(d: Drop, s: SessionRecord) -> dict[str, float]:
    """Where the time went, from the runtime's own timestamps (same machine clock)."""
    arrived = max(h.arrived_at for h in s.hosts.values())
    t = s.timings
    return {
        "drop → last host registered (stability window, watcher poll, bus)":
            arrived - d.dropped_at,
        "registered → CAPTURED (settle window, sweeper tick)": t[CAPTURED] - arrived,
        "CAPTURED → ANALYZING (bus pickup)": t["ANALYZING"] - t[CAPTURED],
        "ANALYZING → INVESTIGATING (collect, triage, snapshot write)":
            t.get(INVESTIGATING, t[REPORTED]) - t["ANALYZING"],
        "INVESTIGATING → REPORTED (investigation, render)":
            t[REPORTED] - t.get(INVESTIGATING, t[REPORTED]),
    }


class CollectAlone:
    """`collect()` alone on a copy of the same files, in this process, warm."""

    def __init__(self, xplanes: list[Path], tmp: Path) -> None:
        from mldiag.analysis.collection.collect import collect
        from mldiag.analysis.collection.profile_input import resolve_session

        session_dir = tmp / "collect" / "plugins" / "profile" / "bench"
        session_dir.mkdir(parents=True)
        for p in xplanes:
            shutil.copyfile(p, session_dir / p.name)
        self._collect = collect
        self.session = resolve_session(session_dir)
        self.times: list[float] = []
        collect(self.session)  # warm-up: imports and xprof's one-time native initialisation

    def measure(self) -> None:
        started = time.perf_counter()
        self._collect(self.session)
        self.times.append(time.perf_counter() - started)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text()
                   .splitlines() if line.startswith("MemTotal"))
        mem_s = f"{mem / 1024**2:.0f} GiB"
    except (OSError, StopIteration):
        mem_s = "?"
    from importlib.metadata import version

    return (f"{os.cpu_count()} cores ({cpu}), {mem_s}, Python {platform.python_version()}, "
            f"xprof {version('xprof')}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a logdir, session directory or .xplane.pb")
    parser.add_argument("--repeat", type=int, default=5, help="runs per case; median is kept")
    parser.add_argument("--sessions", type=int, default=20, help="sessions dropped at once")
    args = parser.parse_args()
    from mldiag.analysis.collection.profile_input import resolve_session

    source = resolve_session(args.path)
    xplanes = list(source.xplanes)
    size_mb = sum(p.stat().st_size for p in xplanes) / 1e6
    defaults = Settings()

    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        alone = CollectAlone(xplanes, Path(tmp))
        # The runtime reads its own copies; the original PATH is never touched.
        rt = Runtime(Path(tmp) / "home")
        try:
            warm = rt.drop("warmup", "s0", xplanes, expected=False)
            rt.wait_reported([warm])
            # Interleaved, so that both sides see the same machine (a shared VM drifts).
            known, dropped = [], []
            for i in range(args.repeat):
                known.append(rt.drop("bench", f"known{i}", xplanes, expected=True))
                rt.wait_reported(known[-1:])
                alone.measure()
                dropped.append(rt.drop("bench", f"dropped{i}", xplanes, expected=False))
                rt.wait_reported(dropped[-1:])
            # Throughput: N sessions at once, as dropped files (nothing registered).
            for i in range(args.sessions):
                target = rt.session_dir("tput", f"s{i:02d}")
                target.mkdir(parents=True)
                for p in xplanes:
                    shutil.copyfile(p, target / p.name)
            batch_at = time.time()
            batch = [Drop(key=f"tput/s{i:02d}", dropped_at=batch_at)
                     for i in range(args.sessions)]
            rt.wait_reported(batch)
            batch_s = max(d.reported_at for d in batch) - batch_at
        finally:
            rc = rt.stop()
    collect_times = alone.times

    known_s = statistics.median(d.seconds for d in known)
    dropped_s = statistics.median(d.seconds for d in dropped)
    collect_s = statistics.median(collect_times)
    print(f"machine: {machine()}")
    print(f"profile: {source.path} ({len(xplanes)} host(s), {size_mb:.1f} MB)")
    print(f"runtime: `mldiag up` defaults: settle {defaults.settle_s:g} s, stability "
          f"{defaults.stability_s:g} s, poll {defaults.poll_s:g} s, {defaults.workers} workers; "
          f"started in {rt.startup_s:.2f} s; exit code on SIGINT {rc}")
    print()
    print(f"{'measure':<58}{'seconds':>9}")
    print(f"{'(1) drop → summary.html, expected hosts known (median)':<58}{known_s:>9.3f}"
          f"   [{', '.join(f'{d.seconds:.3f}' for d in known)}]")
    print(f"{'(1) drop → summary.html, dropped, settle window (median)':<58}{dropped_s:>9.3f}"
          f"   [{', '.join(f'{d.seconds:.3f}' for d in dropped)}]")
    print(f"{'(1) first session of the process (cold imports, dropped)':<58}{warm.seconds:>9.3f}")
    print(f"{'(2) collect() alone, in-process, warm (median)':<58}{collect_s:>9.3f}"
          f"   [{', '.join(f'{x:.3f}' for x in collect_times)}]")
    print()
    for title, case in (("expected hosts known", known), ("dropped", dropped)):
        mid = sorted(case, key=lambda d: d.seconds)[len(case) // 2]
        print(f"where the time goes, {title} (the median run):")
        for name, secs in mid.phases.items():
            print(f"  {name:<66}{secs:>7.3f}")
        print(f"  {'summary.html seen by the poller vs REPORTED':<66}"
              f"{mid.summary_at - mid.reported_at:>7.3f}")
    print()
    reported = sorted(d.reported_at - batch_at for d in batch)
    print(f"throughput: {args.sessions} sessions dropped at once → all REPORTED in {batch_s:.2f} s "
          f"= {args.sessions / batch_s * 60:.1f} sessions/min (first report after "
          f"{reported[0]:.2f} s, median {statistics.median(reported):.2f} s)")
    print(f"dropped-case ratio (settle window included): {dropped_s / collect_s:.2f}")
    print(f"drop_to_report_s={known_s:.3f} collection_s={collect_s:.3f} "
          f"ratio={known_s / collect_s:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
