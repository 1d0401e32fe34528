"""`mldiag up` as a user runs it: a real process, a real bucket directory, real profiles.

Covers the drop → summary.html path, Ctrl-C, and crash safety (`kill -9` during an analysis,
then a restart). Everything is polled with generous deadlines; nothing sleeps as an assertion.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mldiag.adapters.local.state import SqliteStateStore
from tests.helpers.fixtures import TPU_XPLANE, team_fixture
from tests.helpers.pipeline import bus_messages, finalized_names
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow

MLDIAG = Path(sys.executable).with_name("mldiag")
# The pipeline's artifacts: the engine's four, and the version's triage (computed once, after
# collection, and read back by the investigator and the report).
ARTIFACTS = {"health_snapshot.json", "triage.json", "investigation.json", "analysis.json",
             "summary.html"}


@pytest.fixture(scope="module")
def tpu_xplane() -> Path:
    team_fixture(TPU_XPLANE)
    return TPU_XPLANE


class Up:
    """One `mldiag up` process on `home`, its output collected by a reader thread."""

    def __init__(self, home: Path) -> None:
        self.home = home
        env = {**os.environ, "MLDIAG_HOME": str(home), "MLDIAG_SETTLE_S": "0.5",
               "MLDIAG_CONSOLE_PORT": "0",
               "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([str(MLDIAG), "up"], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        wait_until(lambda: any("watching" in line for line in self.lines) or
                   self.proc.poll() is not None, timeout=60, what="`mldiag up` to start")
        assert self.proc.poll() is None, f"`mldiag up` exited early:\n{self.output}"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(10)
        return rc


@pytest.fixture
def up(tmp_path: Path) -> Iterator[list[Up]]:
    """Starts `mldiag up` processes on demand; any still running is killed at the end."""
    started: list[Up] = []
    yield started
    for u in started:
        if u.proc.poll() is None:
            u.proc.kill()
            u.proc.wait(10)


def start(started: list[Up], home: Path) -> Up:
    u = Up(home)
    started.append(u)
    return u


def drop(home: Path, run: str, session: str, host: str, source: Path) -> Path:
    """Copy a profile into the bucket the way a user does: a plain copy, written in place."""
    dst = home / "bucket" / run / "plugins" / "profile" / session / f"{host}.xplane.pb"
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dst)
    return dst


def describe(home: Path, key: str) -> dict[str, Any]:
    out = subprocess.run([str(MLDIAG), "sessions", "describe", key, "--json"],
                         env={**os.environ, "MLDIAG_HOME": str(home)}, capture_output=True,
                         text=True, timeout=60, check=True)
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def state_of(store: SqliteStateStore, run: str, session: str) -> str | None:
    s = store.get_session(run, session)
    return s.state if s is not None else None


def test_a_dropped_profile_is_reported_and_ctrl_c_stops_cleanly(
        tmp_path: Path, up: list[Up], tpu_xplane: Path) -> None:
    home = tmp_path / "home"
    u = start(up, home)
    xplane = drop(home, "myrun", "s1", "tpu_inference_2", tpu_xplane)
    # Beside it, what users also drop: a broken profile and a file with an unusable name.
    broken = home / "bucket/myrun/plugins/profile/broken/h0.xplane.pb"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"\x00\xff this is not an XSpace " * 100)
    odd = home / "bucket/my run/plugins/profile/s1/h0.xplane.pb"
    odd.parent.mkdir(parents=True)
    shutil.copyfile(tpu_xplane, odd)

    analysis = xplane.parent / "analysis"
    wait_until(lambda: (analysis / "summary.html").is_file() and
               (analysis / "analysis.json").is_file(), timeout=120,
               what=f"summary.html and analysis.json in {analysis}\n{u.output}")
    store = SqliteStateStore(home / "state.db")
    wait_until(lambda: state_of(store, "myrun", "s1") == "REPORTED", timeout=60,
               what="the session to be REPORTED")
    session = describe(home, "myrun/s1")
    assert session["state"] == "REPORTED" and session["version"] == 1
    assert session["report_path"] == (analysis / "summary.html").as_uri()
    assert list(session["hosts"]) == ["tpu_inference_2"]
    report = json.loads((analysis / "analysis.json").read_text())
    assert report["status"] == session["verdict"] == "NEEDS_ATTENTION"
    assert report["findings"], "the TPU trace has known bottlenecks"
    assert ARTIFACTS <= {p.name for p in analysis.iterdir()}
    # The transitions are printed as they happen.
    wait_until(lambda: "myrun/s1 v1 REPORTED" in u.output, timeout=30,
               what="the REPORTED line in the output")
    for state in ("CAPTURING", "CAPTURED", "ANALYZING", "INVESTIGATING"):
        assert f"myrun/s1 v1 {state}" in u.output

    wait_until(lambda: state_of(store, "myrun", "broken") == "FAILED", timeout=60,
               what="the broken profile's session to fail")
    assert "h0.xplane.pb: not a readable XSpace" in describe(home, "myrun/broken")["reason"]
    (dead,) = wait_until(store.list_dead_letters, timeout=60, what="the odd name's dead letter")
    assert dead["reason"].startswith("poison message: unsafe object name 'my run/"), dead
    assert [r.name for r in store.list_runs()] == ["myrun"]

    assert u.stop(signal.SIGINT) == 0, u.output
    assert "mldiag up: stopped" in u.output
    assert "Traceback" not in u.output, u.output

    # A restart re-scans the bucket: the same files are duplicates, not new analyses.
    again = start(up, home)
    name = "myrun/plugins/profile/s1/tpu_inference_2.xplane.pb"
    wait_until(lambda: finalized_names(store).count(name) >= 2, timeout=60,
               what="the restarted watcher to report the file again")
    wait_until(lambda: all(m["state"] in ("done", "dead") for m in bus_messages(store)),
               timeout=60, what="the bus to drain")
    assert again.stop(signal.SIGINT) == 0, again.output
    session = describe(home, "myrun/s1")
    assert (session["state"], session["version"]) == ("REPORTED", 1)
    assert not (analysis / "v2").exists()


def test_kill_9_during_an_analysis_then_restart_completes_every_session(
        tmp_path: Path, up: list[Up], tpu_xplane: Path) -> None:
    home = tmp_path / "home"
    store = SqliteStateStore(home / "state.db")
    # Several hosts make the analysis long enough (seconds) to be caught in the middle.
    hosts = [f"host{i}" for i in range(4)]
    u = start(up, home)
    for host in hosts:
        drop(home, "big", "s1", host, tpu_xplane)
    drop(home, "small", "s1", "tpu_inference_2", tpu_xplane)
    caught = wait_until(lambda: state_of(store, "big", "s1") in ("ANALYZING", "INVESTIGATING",
                                                                 "REPORTED")
                        and state_of(store, "big", "s1"), timeout=120, interval=0.005,
                        what="the multi-host session to start its analysis")
    u.proc.kill()  # SIGKILL: no cleanup of any kind
    u.proc.wait(30)
    if caught == "REPORTED":
        pytest.fail("the analysis finished before it could be interrupted; use a bigger input")
    killed_in = state_of(store, "big", "s1")
    assert killed_in in ("ANALYZING", "INVESTIGATING"), killed_in

    again = start(up, home)
    for key in ("big/s1", "small/s1"):
        run, session = key.split("/")
        wait_until(lambda r=run, s=session: state_of(store, r, s) in ("REPORTED", "FAILED"),
                   timeout=180, what=f"{key} to finish after the restart\n{again.output}")
        done = describe(home, key)
        assert done["state"] == "REPORTED", done
        assert done["version"] == 1 and done["reported_version"] == 1
        analysis = home / "bucket" / run / "plugins/profile" / session / "analysis"
        # Exactly one report: version 1 only, every artifact once.
        # ... and the XProf viewer's caches of that version, built after the report.
        # (under the bucket's xprof-cache/, which its lifecycle expires)
        cache = home / "bucket" / "xprof-cache" / run / "plugins/profile" / session / "analysis"
        wait_until(lambda c=cache: list(c.glob("*/manifest.json")), timeout=120,
                   what=f"{key}'s viewer caches after its report")
        assert {p.name for p in analysis.iterdir() if not p.name.startswith(".")} == (
            ARTIFACTS | {"v1"})
        # (with the session's op_stats, kept for the viewer's prebuild)
        assert {p.name for p in (analysis / "v1").iterdir()
                if not p.name.startswith(".")} == ARTIFACTS | {"op_stats.pb"}
    assert sorted(describe(home, "big/s1")["hosts"]) == hosts
    snapshot = json.loads((home / "bucket/big/plugins/profile/s1/analysis/health_snapshot.json")
                          .read_text())
    assert snapshot["session"]["hosts"] == hosts
    assert store.list_dead_letters() == []
    assert again.stop(signal.SIGINT) == 0, again.output
