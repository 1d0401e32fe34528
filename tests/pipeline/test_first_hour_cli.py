"""A newcomer's first hour with the CLI: adding a logdir, a profile copied into the wrong
place, empty lists that say how to fill them, a share link under `up --port 0`, `capture
--async --format`, gcloud's durations, and raising an alert by hand."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from mldiag.bootstrap import LocalRuntime
from mldiag.capture.alerts import alert_session
from mldiag.cli._home import forget_console, record_console, running_console_url
from mldiag.cli.main import main
from mldiag.model import STATES, AutoCapturePolicy, TargetRecord
from tests.helpers.fixtures import TPU_XPLANE, team_fixture
from tests.helpers.pipeline import MakeRuntime, bus_messages
from tests.helpers.wait import wait_until

REPO = Path(__file__).resolve().parents[2]
RUN = "train"


@pytest.fixture
def listener() -> Iterator[int]:
    """A port that accepts connections (not a profiler): the target looks live."""
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
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def logdir(tmp_path: Path, session: str = "2026_01_01_00_00_00") -> Path:
    """What `jax.profiler.trace(LOGDIR)` leaves: LOGDIR/plugins/profile/<session>/."""
    top = tmp_path / "my_logdir"
    where = top / "plugins" / "profile" / session
    where.mkdir(parents=True)
    shutil.copyfile(team_fixture(TPU_XPLANE), where / "tpu_inference_2.xplane.pb")
    (where / "tpu_inference_2.trace.json.gz").write_bytes(b"not a profile mldiag reads")
    return top


# Adding a logdir; the cp slip; empty lists


def test_add_copies_a_logdir_into_a_run_that_does_not_exist_yet(
        rt: LocalRuntime, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rt.start()
    code, out = cli(rt, capsys, "add", str(logdir(tmp_path)), "--run", "my_run")
    assert code == 0, out
    dest = (rt.storage.root / "my_run" / "plugins" / "profile" / "2026_01_01_00_00_00"
            / "tpu_inference_2.xplane.pb")
    assert dest.read_bytes() == team_fixture(TPU_XPLANE).read_bytes()
    assert "mldiag sessions list --run my_run" in out
    # Only the xplane: the trace.json.gz beside it is no profile of ours.
    assert not list(rt.storage.root.rglob("*.trace.json.gz"))
    s = wait_until(lambda: rt.state.get_session("my_run", "2026_01_01_00_00_00"),
                   what="the added session to be registered")
    assert list(s.hosts) == ["tpu_inference_2"]
    # --session renames a logdir's one session; adding the same session twice is refused.
    code, out = cli(rt, capsys, "add", str(logdir(tmp_path / "b")), "--run", "my_run",
                    "--session", "again")
    assert code == 0 and (rt.storage.root / "my_run/plugins/profile/again").is_dir()
    code, out = cli(rt, capsys, "add", str(logdir(tmp_path / "c")), "--run", "my_run",
                    "--session", "again")
    assert code == 1 and "is in the bucket already" in out


def test_add_refuses_a_logdir_without_xplanes(
        rt: LocalRuntime, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty_logdir" / "plugins" / "profile" / "s1"
    empty.mkdir(parents=True)
    (empty / "host.trace.json.gz").write_bytes(b"x")
    code, out = cli(rt, capsys, "add", str(tmp_path / "empty_logdir"), "--run", "my_run")
    assert code == 1
    assert "no .xplane.pb in" in out and "plugins/profile/<session>/" in out
    assert not (rt.storage.root / "my_run").exists()


def test_a_cp_into_a_missing_run_folder_is_refused_with_the_right_layout(
        rt: LocalRuntime, capsys: pytest.CaptureFixture[str]) -> None:
    """`cp -r my_logdir/plugins .mldiag/bucket/my_run/` when my_run/ does not exist lands at
    my_run/profile/<session>/: the dead letter and `sessions list` say where it belongs."""
    rt.start()
    code, out = cli(rt, capsys, "sessions", "list", "--run", "my_run")
    assert code == 0
    assert "no sessions of run my_run yet" in out and "mldiag add LOGDIR --run my_run" in out
    assert "refused" not in out
    wrong = rt.storage.root / "my_run" / "profile" / "s1" / "h0.xplane.pb"
    wrong.parent.mkdir(parents=True)
    shutil.copyfile(team_fixture(TPU_XPLANE), wrong)
    dead = wait_until(lambda: rt.state.list_dead_letters(), what="the object's dead letter")
    assert "my_run/plugins/profile/s1/h0.xplane.pb" in dead[0]["reason"]
    assert "mldiag add" in dead[0]["reason"]
    code, out = cli(rt, capsys, "sessions", "list", "--run", "my_run")
    assert code == 0
    assert "1 object(s) under my_run/ were refused" in out
    assert "move it to my_run/plugins/profile/s1/h0.xplane.pb" in out
    assert "mldiag dead-letters list --run my_run" in out


# capture --async --format; durations


def test_async_capture_prints_the_fields_it_is_asked_for(
        rt: LocalRuntime, capsys: pytest.CaptureFixture[str]) -> None:
    rt.start()
    capsys.readouterr()
    assert main(["capture", "s-fmt", "--run", RUN, "--async", "--format=value(name,state)",
                 "--home", str(rt.services.settings.home)]) == 0
    name, state = capsys.readouterr().out.rstrip("\n").split("\t")
    # REQUESTED while queued; the capture stage may have taken it already.
    assert name == "s-fmt" and state in STATES
    assert main(["capture", "s-csv", "--run", RUN, "--async",
                 "--format=csv(name,state,capture,duration_s)",
                 "--home", str(rt.services.settings.home)]) == 0
    heading, row = capsys.readouterr().out.splitlines()
    assert heading == "name,state,capture,duration_s"
    assert row.startswith("s-csv,") and row.split(",")[1] in STATES
    assert row.endswith(",on_demand,2.0")


@pytest.mark.parametrize(("text", "seconds"), [
    ("1m30s", 90.0), ("PT5S", 5.0), ("PT1M30S", 90.0), ("90s", 90.0), ("5", 5.0),
    ("500ms", 0.5), ("1.5m", 90.0), ("PT4M59.5S", 299.5)])
def test_capture_durations_take_what_gcloud_takes(
        rt: LocalRuntime, capsys: pytest.CaptureFixture[str], text: str, seconds: float) -> None:
    rt.start()
    code, out = cli(rt, capsys, "capture", "s-dur", "--run", RUN, "--async",
                    "--duration", text)
    assert code == 0, out
    (request,) = bus_messages(rt.state, "capture-requests")
    assert request["body"]["duration_s"] == pytest.approx(seconds)


@pytest.mark.parametrize(("text", "seconds"), [
    ("1h", 3600.0), ("1h5m30s", 3930.0), ("P1DT1H", 90000.0), ("PT0.5H", 1800.0)])
def test_long_durations_take_what_gcloud_takes(
        rt: LocalRuntime, capsys: pytest.CaptureFixture[str], text: str, seconds: float) -> None:
    code, out = cli(rt, capsys, "autocapture", "set", "--run", RUN, "--cooldown", text)
    assert code == 0, out
    run = rt.state.get_run(RUN)
    assert run is not None and run.policy.cooldown_s == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["1x", "PT", "1m30", "-5s", "5 minutes"])
def test_a_bad_duration_is_a_usage_error(capsys: pytest.CaptureFixture[str], text: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["capture", "s", "--run", RUN, "--duration", text])
    assert exit_.value.code == 2 and "duration" in capsys.readouterr().err


# alerts publish


INCIDENT = {"version": "1.2", "incident": {
    "incident_id": "0.abc123", "state": "open", "started_at": 1767225600,
    "summary": "step_time for train above 0.3 s for 1 minute",
    "metric": {"type": "custom.googleapis.com/step_time", "labels": {"run": RUN}},
    "resource": {"type": "global", "labels": {}}, "condition_name": "step time"}}


def test_an_alert_published_by_hand_starts_a_capture(
        rt: LocalRuntime, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rt.state.set_auto_capture(RUN, AutoCapturePolicy(enabled=True, duration_s=0.2,
                                                     cooldown_s=0.0, max_per_hour=10).to_dict())
    rt.start()
    code, out = cli(rt, capsys, "alerts", "publish", "--run", RUN, "--metric", "step_time",
                    "--value", "0.41", "--id", "by-hand-1")
    assert code == 0, out
    session = alert_session("by-hand-1")
    assert f"{RUN}/{session}" in out
    s = wait_until(lambda: rt.state.get_session(RUN, session),
                   what="the alert's capture session")
    assert s.trigger == "alert" and "step_time = 0.41" in s.note
    # A Cloud Monitoring incident, as its webhook would send it.
    incident = tmp_path / "incident.json"
    incident.write_text(json.dumps(INCIDENT))
    code, out = cli(rt, capsys, "alerts", "publish", "--file", str(incident))
    assert code == 0, out
    s = wait_until(lambda: rt.state.get_session(RUN, alert_session("incident:0.abc123")),
                   what="the incident's capture session")
    assert s.trigger == "alert" and "above 0.3 s" in s.note


def test_an_alert_that_cannot_be_delivered_is_refused_before_it_is_published(
        rt: LocalRuntime, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out = cli(rt, capsys, "alerts", "publish", "--run", "nope")
    assert code == 1 and "unknown run 'nope'" in out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"incident": {"incident_id": "1", "state": "open"}}))
    code, out = cli(rt, capsys, "alerts", "publish", "--file", str(bad))
    assert code == 1 and "add a `run` user label" in out
    code, out = cli(rt, capsys, "alerts", "publish", "--run", RUN)
    assert code == 0 and "auto-capture is off" in out
    assert not bus_messages(rt.state, "capture-requests")
    assert len(bus_messages(rt.state, "degradation-alerts")) == 1


# The README's local path, on a real `mldiag up --port 0`


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """`mldiag up --port 0` in a subprocess on a fresh home; yields (home, console URL)."""
    home = tmp_path / "home"
    env = {**os.environ, "PYTHONPATH": str(REPO / "shared"), "MLDIAG_HOME": str(home)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mldiag.cli.main", "up", "--port", "0", "--settle", "0.5"],
        env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    try:
        url = wait_until(lambda: next((m[1] for line in lines
                                       if (m := re.match(r"console: (http://\S+?)/?$", line))),
                                      None) if proc.poll() is None else pytest.fail(
            "mldiag up exited:\n" + "\n".join(lines)), timeout=60, what="the console URL")
        yield home, url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    assert not (home / "console.json").exists(), "up leaves no console note behind"


def test_the_readme_path_on_up_port_0(up: tuple[Path, str], tmp_path: Path) -> None:
    home, url = up
    assert not url.endswith(":8790")
    env = {**os.environ, "PYTHONPATH": str(REPO / "shared"), "MLDIAG_HOME": str(home)}

    def mldiag(*argv: str) -> str:
        done = subprocess.run([sys.executable, "-m", "mldiag.cli.main", *argv], env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    session = "2026_01_01_00_00_00"
    mldiag("add", str(logdir(tmp_path)), "--run", "my_run")
    wait_until(lambda: f"my_run/{session}" in (out := mldiag("sessions", "list", "--run",
                                                             "my_run")) and "REPORTED" in out,
               timeout=180, interval=0.5, what="the added session's report")
    described = mldiag("sessions", "describe", f"my_run/{session}")
    assert "verdict:  NEEDS_ATTENTION" in described
    findings = [line for line in described.splitlines()
                if re.match(r"  P[012] \w+\s+\S", line)]
    assert findings and "findings: " in described
    link = mldiag("share", "create", f"my_run/{session}", "--anyone").strip()
    assert link.startswith(url + "/")
    with urllib.request.urlopen(link, timeout=30) as answer:  # noqa: S310 - loopback
        assert answer.status == 200
    assert mldiag("share", "create", f"my_run/{session}", "--url",
                  "https://console.example.org/").startswith("https://console.example.org/")


def test_empty_lists_say_how_to_fill_them(
        make_runtime: MakeRuntime, capsys: pytest.CaptureFixture[str]) -> None:
    rt = make_runtime()
    code, out = cli(rt, capsys, "runs", "list")
    assert code == 0 and "no runs yet" in out and "mldiag add LOGDIR --run RUN" in out
    rt.state.ensure_run("r1", discovered=False)
    code, out = cli(rt, capsys, "targets", "list", "--run", "r1")
    assert code == 0 and "mldiag profiler-target create r1 --address HOST:PORT" in out
    code, out = cli(rt, capsys, "sessions", "list", "--run", "r1", "--state", "REPORTED")
    assert code == 0 and "no sessions of run r1 in state REPORTED" in out


def test_a_console_note_left_by_a_killed_up_is_not_used(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    (tmp_path / "console.json").write_text(json.dumps(
        {"url": "http://127.0.0.1:41234", "pid": int(gone.stdout)}))
    assert running_console_url(tmp_path) == ""
    record_console(tmp_path, "http://127.0.0.1:41234/")
    assert running_console_url(tmp_path) == "http://127.0.0.1:41234"
    forget_console(tmp_path)
    assert not (tmp_path / "console.json").exists()
