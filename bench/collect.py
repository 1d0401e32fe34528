"""Benchmark: our in-process parallel collection against the xprof CLI, on one profile.

    python bench/collect.py PATH [--repeat N]

Measures, in one run on the same profile:
  (a) the xprof-backed collection tools as sequential `xprof` CLI subprocesses (cold cache,
      fresh copy of the trace, as a script driving the CLI would run them; the detectors'
      input is fetched with `get_hlo_text` per module);
  (b) our `collect()`: all the collection tools in its worker processes (fresh private
      workspace; the workers are warm, as in a long-running pipeline process);
  (c) each tool alone in a fresh workspace, including the jobs it depends on; the slowest counts.

Prints a table, then as the last line: speedup_vs_cli=<a/b> ratio_to_slowest_tool=<b/c>.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _proc import tree_cpu_s, tree_pids

from mldiag.analysis.collection.collect import COLLECTION_TOOLS, XPROF_CLI, collect
from mldiag.analysis.collection.profile_input import ProfileSession, resolve_session
from mldiag.analysis.collection.workers import rss_bytes

# The xprof commands of the collection tools that have one, in the snapshot's order.
CLI_TOOLS = tuple(cli[0] for cli in XPROF_CLI.values() if cli)


def _fresh_copy(session: ProfileSession, root: Path) -> Path:
    """A copy of the session without xprof's cache files, so nothing is reused."""
    dst = root / "logdir" / "plugins" / "profile" / session.name
    dst.mkdir(parents=True)
    for xplane in session.xplanes:
        shutil.copy(xplane, dst / xplane.name)
    return root / "logdir"


def run_cli(session: ProfileSession, rss_limit: int | None = None,
            failures: dict[str, str] | None = None) -> tuple[float, dict[str, float]]:
    """The CLI tools one after another on a fresh copy of the session: (wall seconds, seconds
    per tool). With `rss_limit`, a tool whose process tree passes it is killed; `failures`
    then gets, per tool that did not exit 0, why (killed at the limit, or its exit status)."""
    xprof = Path(sys.executable).with_name("xprof")
    per_tool: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        logdir = _fresh_copy(session, Path(tmp))
        env = {**os.environ, "TMPDIR": tmp, "TF_CPP_MIN_LOG_LEVEL": "3"}
        started = time.perf_counter()

        def call(*args: str) -> str:
            name = args[0] if len(args) == 1 else f"{args[0]} {args[2]}"
            t = time.perf_counter()
            proc = subprocess.Popen([str(xprof), *args, "--logdir", str(logdir)], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
            killed = _watch(proc, rss_limit)
            out, err = proc.communicate(timeout=600)
            per_tool[name] = time.perf_counter() - t
            if proc.returncode and failures is not None:
                failures[name] = (f"killed at the RSS limit ({rss_limit / 2**30:.0f} GiB) after "
                                  f"{per_tool[name]:.0f} s" if killed.is_set() else
                                  f"exit {proc.returncode}: {err.strip()[-300:]}")
            return out

        for tool in CLI_TOOLS:
            out = call(tool)
            if tool == "list_hlo_modules":
                modules = json.loads(out).get("modules", []) if out.strip() else []
                for m in modules:
                    call("get_hlo_text", "--module_name", m, "--max_lines", "10000000")
        return time.perf_counter() - started, per_tool


def _watch(proc: subprocess.Popen[str], rss_limit: int | None) -> threading.Event:
    """Kill `proc`'s process group once its tree's RSS passes `rss_limit` (set: killed)."""
    killed = threading.Event()
    if rss_limit is None:
        return killed

    def run() -> None:
        while proc.poll() is None:
            if sum(rss_bytes(p) for p in tree_pids(proc.pid)) > rss_limit:
                killed.set()
                os.killpg(proc.pid, signal.SIGKILL)
                return
            time.sleep(0.1)

    threading.Thread(target=run, daemon=True).start()
    return killed


def run_ours(session: ProfileSession, tools: tuple[str, ...] = COLLECTION_TOOLS
             ) -> tuple[float, float]:
    """Wall and CPU seconds (this process and its worker processes) of one collection."""
    started, cpu = time.perf_counter(), tree_cpu_s()
    collect(session, tools=tools)
    return time.perf_counter() - started, tree_cpu_s() - cpu


def run_each_alone(session: ProfileSession) -> dict[str, tuple[float, float]]:
    """Wall and CPU seconds of each tool run alone, the jobs it needs included."""
    return {name: run_ours(session, (name,)) for name in COLLECTION_TOOLS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a logdir, session directory or .xplane.pb")
    parser.add_argument("--repeat", type=int, default=3, help="runs of (b); median is kept")
    args = parser.parse_args()
    session = resolve_session(args.path)

    run_ours(session)  # warm-up: imports and xprof's one-time native initialisation
    cli_s, cli_tools = run_cli(session)
    runs = [run_ours(session) for _ in range(args.repeat)]
    ours = [wall for wall, _ in runs]
    ours_s = statistics.median(ours)
    ours_cpu = statistics.median(cpu for _, cpu in runs)
    alone = run_each_alone(session)
    slowest_name, (slowest_s, _) = max(alone.items(), key=lambda kv: kv[1][0])
    cpu_sum = sum(c for _, c in alone.values())
    cores = os.cpu_count() or 1

    print(f"profile: {session.path} ({len(session.xplanes)} host(s), "
          f"{sum(p.stat().st_size for p in session.xplanes) / 1e6:.1f} MB)")
    print(f"{'tool':<40}{'alone wall s':>14}{'alone cpu s':>13}")
    for name, (wall, cpu) in alone.items():
        print(f"{name:<40}{wall:>14.3f}{cpu:>13.3f}")
    print(f"{'(a) xprof CLI, sequential subprocesses':<40}{cli_s:>14.3f}"
          f"   ({len(cli_tools)} calls)")
    print(f"{'(b) mldiag collect(), worker processes':<40}{ours_s:>14.3f}"
          f"   (median of {args.repeat}: {', '.join(f'{x:.3f}' for x in ours)})")
    print(f"{'(c) slowest tool alone: ' + slowest_name:<40}{slowest_s:>14.3f}")
    print(f"sum of per-tool CPU time alone {cpu_sum:.3f} s (shared inputs counted per tool)")
    print(f"(b) used {ours_cpu:.3f} CPU s: on {cores} core(s) its wall time is at least "
          f"{ours_cpu / cores:.3f} s, so ratio_to_slowest_tool >= "
          f"{ours_cpu / cores / slowest_s:.2f} here")
    print(f"speedup_vs_cli={cli_s / ours_s:.2f} ratio_to_slowest_tool={ours_s / slowest_s:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
