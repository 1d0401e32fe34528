"""`mldiag demo`: capture and analysis end to end on one machine, with a live JAX job.

Starts the embedded runtime and a training job that uses the SDK (on-demand profiler server,
continuous profiling on), injects an input stall, and follows the step-time monitor's alert
through auto-capture (a snapshot of the ring), analysis and summary.html. `--workload NAME`
instead profiles a planted-bottleneck workload and drops its xplane into the bucket.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from mldiag.bootstrap import bootstrap
from mldiag.cli._home import add_home
from mldiag.cli.up import describe_transition
from mldiag.errors import MldiagError
from mldiag.messages import CaptureProfile, ContinuousProfiling
from mldiag.model import FAILED, REPORTED, AutoCapturePolicy, SessionRecord
from mldiag.settings import Settings

WORKLOADS = Path(__file__).resolve().parents[3] / "scripts" / "workloads"


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run a live JAX training job through capture and analysis",
                       description="By default: start the runtime and a JAX training job that "
                       "uses the SDK (on-demand profiler, continuous profiling on), inject an "
                       "input stall, and follow the degradation alert through auto-capture, "
                       "analysis and summary.html. With --workload NAME: profile a planted-"
                       "bottleneck workload and drop its xplane into the bucket instead.")
    p.add_argument("--workload", help="drop mode: a workload of scripts/workloads (host_bound, "
                   "layout_copy, ...)")
    add_home(p)
    p.add_argument("--timeout", type=float, default=170.0, help="seconds to wait for the report")


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env(home=args.home)
    if args.workload:
        return _drop_demo(args, settings)
    return _live_demo(args, settings)


def _say(text: str) -> None:
    print(f"mldiag demo: {text}", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _until(what: str, timeout: float, check: Callable[[], Any],
           proc: subprocess.Popen[bytes] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise MldiagError(f"the training job exited ({proc.returncode}) while waiting for "
                              f"{what}")
        time.sleep(0.1)
    raise MldiagError(f"timed out after {timeout:g} s waiting for {what}")


def _stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _live_demo(args: argparse.Namespace, settings: Settings) -> int:
    started = time.monotonic()
    run_name = f"demo-train-{time.strftime('%Y%m%d-%H%M%S')}"
    runtime = bootstrap(settings, listener=lambda s: print("  " + describe_transition(s),
                                                           flush=True))
    runtime.start()
    proc: subprocess.Popen[bytes] | None = None
    try:
        _say(f"runtime up on {settings.home} (bucket {runtime.storage.root})")
        with tempfile.TemporaryDirectory(prefix="mldiag-demo-") as tmp:
            flag = Path(tmp) / "stall"
            env = {**os.environ, "MLDIAG_HOME": str(settings.home.resolve()),
                   "MLDIAG_DEMO_PORT": str(_free_port()), "TF_CPP_MIN_LOG_LEVEL": "3"}
            proc = subprocess.Popen(
                [sys.executable, str(WORKLOADS / "demo_train.py"), "--run", run_name,
                 "--stall-flag", str(flag)], env=env, start_new_session=True)
            _say(f"training job started (pid {proc.pid}): scripts/workloads/demo_train.py")
            pid = proc.pid
            target = _until("the training job to register its profiler target", 120.0,
                            lambda: next((t for t in runtime.state.list_targets(run_name)
                                          if t.pid == pid), None), proc)
            _say(f"target {target.host} registered (profiler {target.service_addr}, "
                 f"{target.platform}, jax {target.framework_version})")
            runtime.services.bus.publish(ContinuousProfiling(run=run_name, action="start",
                                                             window_s=1.0))
            _until("continuous profiling to start", 60.0, lambda: any(
                t.continuous != "OFF" for t in runtime.state.list_targets(run_name)), proc)
            _say("continuous profiling on (1 s windows in the SDK's ring)")
            # The job registers its target before its first step compiles: wait for steps
            # (their recorded step times, which the SDK persists) so the baseline is steady
            # training, not compilation.
            _until("the training loop's first steps", 120.0, lambda: len(
                runtime.state.list_metrics(run_name, name="step_time", limit=20)) >= 20, proc)
            # A healthy reference first, on demand (served from the ring, which holds the
            # profiler); meanwhile the monitor learns its step-time baseline.
            baseline, before = _baseline(runtime, run_name, proc)
            _say(f"baseline (healthy): {_headline(before)}")
            # Alert-triggered sessions are compared with it (`mldiag runs set-baseline`).
            runtime.state.set_baseline(run_name, baseline.session)
            _say(f"pinned {run_name}/{baseline.session} as the run's baseline")
            time.sleep(max(0.0, 4.0 - (time.monotonic() - started)))
            # Auto-capture is armed with the stall: an alert the monitor raises before it (a
            # loaded machine slows healthy steps too) captures nothing, and cannot spend the
            # cooldown that the stall's own alert needs.
            policy = AutoCapturePolicy(enabled=True, kind="auto", duration_s=2.0,
                                       cooldown_s=600.0, max_per_hour=4)
            runtime.state.set_auto_capture(run_name, policy.to_dict())
            _say("auto-capture policy: on degradation, snapshot 2 s of the ring (cooldown "
                 "10 min)")
            flag.touch()
            _say("injecting an input-pipeline stall (the batch reader sleeps 80 ms a step); "
                 "waiting for the step-time monitor to raise an alert ...")

            def reported() -> SessionRecord | None:
                for s in runtime.state.list_sessions(run=run_name):
                    if s.trigger == "alert" and s.state in (REPORTED, FAILED):
                        return s
                return None

            final = _until("the auto-captured session's report", args.timeout, reported, proc)
    finally:
        if proc is not None:
            _stop_process(proc)
        runtime.stop()
    if final.state == FAILED:
        raise MldiagError(f"session {run_name}/{final.session} FAILED: {final.reason}")
    _print_report(final, f"{run_name}/{final.session}")
    _print_what_changed(final)
    _say(f"done in {time.monotonic() - started:.0f} s")
    for line in console_pointer(settings, run_name, final.session, baseline.session):
        print(line)
    return 0


def console_pointer(settings: Settings, run: str, session: str,
                    baseline: str | None = None) -> list[str]:
    """How to see a demo run in the console: the command that serves it on the demo's home,
    and the pages of the run, its session and (with a baseline) the compare view."""
    home = "" if settings.home == Settings().home else f" --home {settings.home}"
    base = f"{settings.console_url}/runs/{quote(run, safe='')}"
    lines = ["", "see it in the console (the step-time chart with the alert, the captured "
             "session, what changed):",
             f"  .venv/bin/mldiag up{home}     # then open the login URL it prints, and",
             f"  {base}",
             f"  {base}/sessions/{quote(session, safe='')}"]
    if baseline:
        lines.append(f"  {base}/compare?a={quote(baseline, safe='')}&b={quote(session, safe='')}")
    return lines


def _print_what_changed(final: SessionRecord) -> None:
    """The report's "What changed" section: the diff against the pinned baseline."""
    block = _analysis(final).get("regression") or {}
    if not block.get("baseline"):
        print(f"what changed: {block.get('reason') or 'no comparison in the report'}")
        return
    print(f"what changed since {block['baseline']['run']}/{block['baseline']['session']}:")
    print(f"  {block['headline']}")
    for item in block.get("explanation", [])[:3]:
        share = item.get("share_of_delta")
        print(f"  {item['rank']}. {item['delta_ms']:+.2f} ms"
              + (f" ({share:.0%})" if share is not None else "")
              + f"  {item['change'].replace('`', '')}")
    diff = Path(final.report_path.removeprefix("file://")).with_name("diff.html")
    print(f"diff: {diff}")


def _baseline(runtime: Any, run_name: str, proc: subprocess.Popen[bytes]
              ) -> tuple[SessionRecord, dict[str, Any]]:
    """Capture the healthy reference; again (up to 3 times) while a capture holds no
    training step yet (on a loaded machine the job may still be compiling)."""
    for attempt in range(1, 4):
        name = "baseline" if attempt == 1 else f"baseline-{attempt}"
        runtime.services.bus.publish(CaptureProfile(run=run_name, session=name,
                                                    duration_s=1.0))
        def done(name: str = name) -> SessionRecord | None:
            s = runtime.state.get_session(run_name, name)
            return s if s is not None and s.state in (REPORTED, FAILED) else None

        session: SessionRecord = _until("the baseline capture's report", 120.0, done, proc)
        if session.state == FAILED:
            raise MldiagError(f"baseline capture FAILED: {session.reason}")
        analysis = _analysis(session)
        if (analysis.get("metrics") or {}).get("step_time_ms") is not None or attempt == 3:
            return session, analysis
        _say(f"{name} holds no training step yet (the job is still starting); again")
    raise AssertionError("unreachable")


def _analysis(s: SessionRecord) -> dict[str, Any]:
    path = Path(s.report_path.removeprefix("file://")).with_name("analysis.json")
    return dict(json.loads(path.read_text()))


def _num(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "n/a"


def _headline(analysis: dict[str, Any]) -> str:
    findings = analysis.get("findings") or []
    top = (f"{findings[0]['priority']} {findings[0]['category']}" if findings
           else "no bottleneck found")
    m = analysis.get("metrics") or {}
    return (f"{top}; step time {_num(m.get('step_time_ms'))} ms, device idle "
            f"{_num(m.get('device_idle_percent'))}%")


def _print_report(final: SessionRecord, label: str) -> None:
    analysis_path = Path(final.report_path.removeprefix("file://")).with_name("analysis.json")
    analysis = json.loads(analysis_path.read_text())
    print()
    print(f"{analysis['status']}  {label}  (trigger: {final.trigger}, kind: {final.kind})")
    for f in analysis["findings"]:
        print(f"  {f['priority']} {f['category']:<16} {f['title']}")
    print(f"summary: {final.report_path.removeprefix('file://')}")


def _drop_demo(args: argparse.Namespace, settings: Settings) -> int:
    script = WORKLOADS / f"{args.workload}.py"
    # demo_train is the live demo's job, and regression writes a pair of profiles for diffs.
    paired = ("demo_train", "regression")
    if not script.is_file() or args.workload.startswith("_") or args.workload in paired:
        names = sorted(p.stem for p in WORKLOADS.glob("[!_]*.py") if p.stem not in paired)
        raise MldiagError(f"unknown workload {args.workload!r} (choose from {', '.join(names)})")
    runtime = bootstrap(settings, listener=lambda s: print("  " + describe_transition(s),
                                                           flush=True))
    runtime.start()
    try:
        _say(f"runtime up on {settings.home} (bucket {runtime.storage.root})")
        with tempfile.TemporaryDirectory(prefix="mldiag-demo-") as tmp:
            _say(f"profiling scripts/workloads/{script.name} ...")
            done = subprocess.run([sys.executable, str(script), "--logdir", tmp])
            if done.returncode != 0:
                raise MldiagError(f"scripts/workloads/{script.name} failed (exit "
                                  f"{done.returncode}); its output is above")
            found = sorted(Path(tmp).glob("plugins/profile/*/*.xplane.pb"))
            if not found:
                raise MldiagError(f"scripts/workloads/{script.name} wrote no .xplane.pb")
            xplane = found[-1]
            session = f"{args.workload}-{time.strftime('%Y%m%d-%H%M%S')}"
            target = runtime.storage.root / "demo" / "plugins" / "profile" / session
            target.mkdir(parents=True, exist_ok=True)
            _say(f"dropping {xplane.name} into {target}")
            shutil.copy(xplane, target / xplane.name)
        final = _wait(runtime.state.get_session, "demo", session, args.timeout)
    finally:
        runtime.stop()
    if final.state == FAILED:
        raise MldiagError(f"session demo/{session} FAILED: {final.reason}")
    _print_report(final, f"demo/{session}")
    for line in console_pointer(settings, "demo", session):
        print(line)
    return 0


def _wait(get: Callable[[str, str], SessionRecord | None], run: str, session: str,
          timeout: float) -> SessionRecord:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = get(run, session)
        if s is not None and s.state in (REPORTED, FAILED):
            return s
        time.sleep(0.1)
    raise MldiagError(f"no report for demo/{session} after {timeout:g} s")
