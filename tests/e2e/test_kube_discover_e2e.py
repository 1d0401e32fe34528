"""GKE without a cluster: JAX workloads with `jax.profiler.start_server` on loopback stand in
for the pods of an Indexed Job that a fake API server lists; kube-discover registers them,
an on-demand capture and a recorded duty-cycle incident each reach REPORTED, a pod restarts
on a new port and is followed there, and a pod that ends is marked gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mldiag.bootstrap import LocalRuntime, bootstrap, control_plane
from mldiag.cli.main import main
from mldiag.kube.discover import NOWHERE, Discoverer, connect
from mldiag.model import REPORTED
from mldiag.settings import Settings
from tests.helpers.fake_kube import RECORDED, FakeKube, pod, recorded
from tests.helpers.net import free_port
from tests.helpers.pipeline import FAST, finished
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow

WORKLOAD = Path(__file__).with_name("plain_workload.py")
RUN, NS, JOB = "kube-run", "ml-team", "resnet-bench"


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[LocalRuntime]:
    rt = bootstrap(Settings(home=tmp_path / "home", **FAST))
    rt.start()
    yield rt
    rt.stop()


class Workloads:
    """The stand-in pods: one plain JAX workload a completion index."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self) -> tuple[subprocess.Popen[str], int]:
        port = free_port()
        proc = subprocess.Popen([sys.executable, str(WORKLOAD), "--port", str(port),
                                 "--seconds", "120"],
                                env={**os.environ, "JAX_PLATFORMS": "cpu",
                                     "TF_CPP_MIN_LOG_LEVEL": "3"},
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc, port

    @staticmethod
    def kill(proc: subprocess.Popen[str]) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def workloads() -> Iterator[Workloads]:
    w = Workloads()
    yield w
    for proc in w.procs:
        w.kill(proc)


def job_pod(index: int, port: int, suffix: str, phase: str = "Running") -> dict[str, Any]:
    return pod(recorded("job_pod"), name=f"{JOB}-{index}-{suffix}", index=index,
               ip="127.0.0.1", phase=phase, run=RUN, port=port)


def cli(runtime: LocalRuntime, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert main([*argv, "--home", str(runtime.services.settings.home)]) == 0
    return capsys.readouterr().out


def test_pods_of_a_job_are_discovered_captured_followed_and_let_go(
        runtime: LocalRuntime, workloads: Workloads, capsys: pytest.CaptureFixture[str]
        ) -> None:
    cli(runtime, capsys, "machine-learning-run", "create", RUN, "--location=us-central1")
    (first, p0), (second, p1) = workloads.start(), workloads.start()
    fake = FakeKube()
    job = recorded("job")
    job["metadata"].update(name=JOB, namespace=NS)
    fake.put_job(job)  # parallelism 2
    fake.put(job_pod(0, p0, "aaaaa"))
    fake.put(job_pod(1, p1, "bbbbb"))
    with fake.serving():
        # Its own connection to the runtime's home, as `mldiag kube-discover` has.
        d = Discoverer(control_plane(runtime.services.settings), RUN, [NS],
                       connect(server=fake.url), watch_timeout_s=2, retry_s=0.2)
        threads = d.run_forever()
        try:
            def at(host: str, port: int) -> bool:
                return any((t.host, t.address, t.port) == (host, "127.0.0.1", port)
                           for t in runtime.state.list_targets(RUN))
            wait_until(lambda: at(f"{JOB}-0", p0) and at(f"{JOB}-1", p1),
                       what="both pods registered")
            out = cli(runtime, capsys, "profiler-target", "list",
                      f"--machine-learning-run={RUN}", "--format=csv[no-heading](name,status)")
            # Alive (busy too: registering probed them a moment ago).
            assert sorted(line.split(",")[0] for line in out.split()) == [f"{JOB}-0", f"{JOB}-1"]
            assert all(line.split(",")[1] in ("up", "busy") for line in out.split()), out

            # On demand, as a user asks for it: both pods, under their stable names.
            cli(runtime, capsys, "profiler-session", "capture", "od1",
                f"--machine-learning-run={RUN}", "--duration", "1000ms")
            s = finished(runtime, RUN, "od1")
            assert s.state == REPORTED, s.reason
            assert {h: r.status for h, r in s.hosts.items()} == {
                f"{JOB}-0": "ARRIVED", f"{JOB}-1": "ARRIVED"}

            # Pod 1 fails and its Job starts another: a new pod, the same index, a new port.
            Workloads.kill(second)
            fake.put(job_pod(1, p1, "bbbbb", phase="Failed"))
            fake.delete(NS, f"{JOB}-1-bbbbb")
            _, p2 = workloads.start()
            fake.put(job_pod(1, p2, "ccccc"))
            wait_until(lambda: at(f"{JOB}-1", p2), what="pod 1 followed to its new port")
            assert [t.port for t in runtime.state.list_targets(RUN)
                    if t.host == f"{JOB}-1"] == [p2]

            # The job slows down: Cloud Monitoring's incident on its TPU duty cycle.
            cli(runtime, capsys, "autocapture", "set", "--run", RUN, "--enable",
                "--kind", "on-demand", "--duration", "1s")
            incident = json.loads((RECORDED / "duty_cycle_incident.json").read_text())
            incident["incident"]["metadata"]["user_labels"] = job_pod(1, p2, "ccccc")[
                "metadata"]["labels"]
            runtime.services.bus.publish_raw("degradation-alerts", json.dumps(incident))
            auto = wait_until(lambda: next((x for x in runtime.state.list_sessions(run=RUN)
                                            if x.trigger == "alert"), None),
                              what="the alert's session", timeout=60, interval=0.1)
            auto = finished(runtime, RUN, auto.session)
            assert auto.state == REPORTED, auto.reason
            assert set(auto.hosts) == {f"{JOB}-0", f"{JOB}-1"}

            # Pod 0 completes: its host is marked gone, and says so.
            fake.put(job_pod(0, p0, "aaaaa", phase="Succeeded"))
            Workloads.kill(first)
            wait_until(lambda: any(t.host == f"{JOB}-0" and t.address == NOWHERE
                                   for t in runtime.state.list_targets(RUN)),
                       what="pod 0 marked gone")
            gone = f"gone: pod {NS}/{JOB}-0-aaaaa ended (Succeeded)"
            out = cli(runtime, capsys, "targets", "list", "--run", RUN)
            assert gone in out
            # A capture still expects the whole job: the host without a pod fails with why.
            capsys.readouterr()
            assert main(["profiler-session", "capture", "od2", f"--machine-learning-run={RUN}",
                         "--duration", "1000ms",
                         "--home", str(runtime.services.settings.home)]) == 0
            assert f"target down: {JOB}-0: {gone}" in capsys.readouterr().err
            s = finished(runtime, RUN, "od2")
            assert s.state == REPORTED, s.reason
            assert s.hosts[f"{JOB}-1"].status == "ARRIVED"
            assert s.hosts[f"{JOB}-0"].status == "FAILED" and gone in s.hosts[f"{JOB}-0"].reason
        finally:
            d.stopping.set()
            for t in threads:
                t.join(10)
