"""The CLI as gcloud users type it: `gcloud alpha mldiagnostics` command lines with `mldiag`
in front, the short names as aliases, `--format`, dead letters, liveness and `| head`."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mldiag.bootstrap import LocalRuntime
from mldiag.cli.main import main
from mldiag.messages import ProfileObjectFinalized
from mldiag.model import CAPTURING, SessionRecord, TargetRecord
from tests.helpers.pipeline import MakeRuntime, bus_messages
from tests.helpers.wait import wait_until

RUN = "train"
RESOURCE = f"projects/p/locations/us-central1/machineLearningRuns/{RUN}"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def listener() -> Iterator[int]:
    """A port that accepts connections (not a profiler): the target looks reachable."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


@pytest.fixture
def rt(make_runtime: MakeRuntime, listener: int) -> LocalRuntime:
    runtime = make_runtime()
    runtime.state.ensure_run(RUN, discovered=False)
    runtime.state.upsert_target(TargetRecord(run=RUN, host="h0", port=listener,
                                             last_heartbeat=time.time() + 3600))
    return runtime


def cli(rt: LocalRuntime, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main([*argv, "--home", str(rt.services.settings.home)])
    return code, capsys.readouterr().out


def test_a_gcloud_capture_line_runs_with_mldiag_in_front(
        rt: LocalRuntime, capsys: pytest.CaptureFixture[str]) -> None:
    rt.start()
    code, _ = cli(rt, capsys, "profiler-session", "capture", "on-demand-session",
                  f"--machine-learning-run={RESOURCE}", "--location=us-central1",
                  "--project=p", "--targets", f"{RESOURCE}/profilerTargets/h0",
                  "--duration", "500ms", "--host-tracer-level=host-tracer-level-verbose",
                  "--device-tracer-level=disabled",
                  "--python-tracer-level=PYTHON_TRACER_LEVEL_ENABLED", "--kind=on_demand",
                  "--async")
    assert code == 0
    (request,) = bus_messages(rt.state, "capture-requests")
    body = request["body"]
    assert (body["run"], body["session"], body["capture"], body["targets"]) == (
        RUN, "on-demand-session", "on_demand", ["h0"])
    assert body["duration_s"] == pytest.approx(0.5)
    assert (body["host_tracer_level"], body["device_tracer_level"],
            body["python_tracer_level"]) == (3, 0, 1)
    # A full session resource name names the run too.
    assert main(["profiler-session", "capture", f"{RESOURCE}/profilerSessions/s-full",
                 "--async", "--home", str(rt.services.settings.home)]) == 0
    assert bus_messages(rt.state, "capture-requests")[-1]["body"]["session"] == "s-full"
    assert main(["capture", "s-norun", "--home", str(rt.services.settings.home)]) == 1
    assert "which run?" in capsys.readouterr().err
    # With --format, stdout is the record alone (the progress line goes to stderr).
    capsys.readouterr()
    assert main(["profiler-session", "capture", "s-fmt", "--machine-learning-run", RUN,
                 "--async", "--format=json(session,capture,duration_s)",
                 "--home", str(rt.services.settings.home)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"session": "s-fmt", "capture": "on_demand", "duration_s": 2.0}
    assert "capture train/s-fmt: on-demand of 1 target(s)" in err


def test_continuous_profiling_by_gcloud_names(
        rt: LocalRuntime, capsys: pytest.CaptureFixture[str]) -> None:
    rt.start()
    code, out = cli(rt, capsys, "machine-learning-run", "start-continuous-profiling",
                    f"--machine-learning-run={RUN}", "--targets=h0", "--host-tracer-level=info",
                    "--device-tracer-level=enabled", "--python-tracer-level=disabled",
                    "--location=us-central1", "--async")
    assert code == 0 and "continuous start requested" in out
    code, _ = cli(rt, capsys, "machine-learning-run", "stop-continuous-profiling",
                  f"--machine-learning-run={RUN}", "--async")
    assert code == 0
    start, stop = (m["body"] for m in bus_messages(rt.state, "capture-requests"))
    assert (start["action"], start["targets"], start["host_tracer_level"],
            start["device_tracer_level"], start["python_tracer_level"]) == (
        "start", ["h0"], 2, 1, 0)
    assert stop["action"] == "stop"


@pytest.mark.parametrize("flag, value, why", [
    ("--host-tracer-level", "loud", "not a host tracer level"),
    ("--device-tracer-level", "3", "not a device tracer level"),
    ("--kind", "continuous", "invalid choice"),
    ("--format", "yaml", "unsupported --format"),
    ("--format", "csv", "needs the fields"),
    ("--format", "csv[heading](name)", "unknown attribute"),
    ("--format", "csv[no-heading](name.date())", "the transform date() is not supported"),
    ("--format", "value(name:sort=1)", "key attribute 'sort' is not supported"),
])
def test_bad_flags_are_one_clear_usage_error(
        rt: LocalRuntime, capsys: pytest.CaptureFixture[str], flag: str, value: str,
        why: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["profiler-session", "capture", "s", "--machine-learning-run", RUN, flag, value])
    assert exit_.value.code == 2
    assert why in capsys.readouterr().err


def test_lists_and_describes_in_gcloud_formats(
        rt: LocalRuntime, capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    for name in ("s1", "s2"):
        rt.state.create_session(SessionRecord(run=RUN, session=name, state=CAPTURING,
                                              kind="on_demand", created_at=now, updated_at=now))
    code, out = cli(rt, capsys, "profiler-session", "list", f"--machine-learning-run={RUN}",
                    "--format=csv[no-heading](name,state,kind)")
    assert code == 0 and out.splitlines() == ["s1,CAPTURING,on_demand", "s2,CAPTURING,on_demand"]
    code, out = cli(rt, capsys, "profiler-session", "describe",
                    f"{RESOURCE}/profilerSessions/s2", "--format=json")
    assert code == 0 and json.loads(out)["name"] == "s2" and json.loads(out)["run"] == RUN
    code, out = cli(rt, capsys, "machine-learning-run", "list", "--format=value(name)")
    assert code == 0 and out.split() == [RUN]
    code, out = cli(rt, capsys, "machine-learning-run", "describe", RESOURCE,
                    "--format=json(name,sessions)")
    assert code == 0 and json.loads(out) == {"name": RUN, "sessions": ["s1", "s2"]}
    code, out = cli(rt, capsys, "profiler-target", "list", "--machine-learning-run", RUN,
                    "--format=csv(name,status,registeredAt,nothing)")
    assert code == 0
    assert list(csv.reader(io.StringIO(out))) == [
        ["name", "status", "registeredAt", "nothing"], ["h0", "up", "0.0", ""]]
    # The short names stay, with --json.
    code, out = cli(rt, capsys, "sessions", "list", "--run", RUN, "--json")
    assert code == 0 and [s["name"] for s in json.loads(out)] == ["s1", "s2"]
    code, out = cli(rt, capsys, "targets", "list", "--run", RUN)
    assert code == 0 and "h0" in out and " up " in out


def test_a_killed_target_is_down_before_its_heartbeat_is_missed(
        rt: LocalRuntime, capsys: pytest.CaptureFixture[str]) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    rt.state.upsert_target(TargetRecord(run=RUN, host="w1", port=9, pid=proc.pid,
                                        heartbeat_s=10.0, last_heartbeat=time.time()))
    code, out = cli(rt, capsys, "targets", "list", "--run", RUN)
    assert code == 0 and "w1" in out and "down:" not in out
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    code, out = cli(rt, capsys, "targets", "list", "--run", RUN)
    assert code == 0 and f"down: its process {proc.pid} is gone" in out
    # A target elsewhere: one and a half heartbeats late is down, whatever MLDIAG_TARGET_STALE_S.
    rt.state.upsert_target(TargetRecord(run=RUN, host="w2", port=9, address="10.0.0.2",
                                        heartbeat_s=2.0, last_heartbeat=time.time() - 5))
    code, out = cli(rt, capsys, "profiler-target", "list", "--machine-learning-run", RUN,
                    "--format=csv[no-heading](name,status)")
    assert out.splitlines() == ["h0,up", "w1,down", "w2,down"]


def test_refused_objects_are_listed_as_dead_letters_with_the_reason(
        rt: LocalRuntime, capsys: pytest.CaptureFixture[str]) -> None:
    rt.start()
    name = f"{RUN}/plugins/profile/my session ✓/h0.xplane.pb"
    rt.services.bus.publish(ProfileObjectFinalized(bucket="local", name=name, generation="1",
                                                   size=10))
    wait_until(rt.state.list_dead_letters, what="the refused object's dead letter")
    code, out = cli(rt, capsys, "dead-letters", "list")
    assert code == 0 and name in out and "unsafe object name" in out
    code, out = cli(rt, capsys, "dead-letters", "list", "--run", RUN, "--format=json")
    (dead,) = json.loads(out)
    assert (dead["topic"], dead["subject"], dead["run"]) == ("profile-objects", name, RUN)
    code, out = cli(rt, capsys, "dead-letters", "list", "--run", "other")
    assert code == 0 and out.strip() == "no dead letters matching"
    # A profile outside a session directory is not silently ignored either.
    misplaced = f"{RUN}/h0.xplane.pb"
    rt.services.bus.publish(ProfileObjectFinalized(bucket="local", name=misplaced,
                                                   generation="1", size=10))
    wait_until(lambda: len(rt.state.list_dead_letters()) == 2, what="a second dead letter")
    code, out = cli(rt, capsys, "dead-letters", "list", "--format=csv[no-heading](subject)")
    assert out.splitlines()[-1] == misplaced
    assert "not in a session directory" in rt.state.list_dead_letters()[-1]["reason"]


def test_output_piped_to_head_exits_quietly(rt: LocalRuntime) -> None:
    now = time.time()
    for i in range(3000):  # far more than a pipe holds
        rt.state.create_session(SessionRecord(run=RUN, session=f"s{i:04d}", state=CAPTURING,
                                              created_at=now, updated_at=now))
    env = {**os.environ, "MLDIAG_HOME": str(rt.services.settings.home),
           "PYTHONPATH": os.pathsep.join([str(REPO / "shared"), str(REPO)])}
    done = subprocess.run(
        f"set -o pipefail; {sys.executable} -m mldiag.cli.main sessions list | head -n 2",
        shell=True, executable="/bin/bash", env=env, capture_output=True, text=True,
        timeout=60)
    assert done.returncode == 0
    assert len(done.stdout.splitlines()) == 2 and "RUN/SESSION" in done.stdout
    assert done.stderr == ""
