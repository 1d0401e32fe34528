"""`mldiag kube-discover` against a fake API server on loopback, through the real
`kubernetes` client: recorded JobSet and Job pods become targets, move, end; bad input is a
log line and a state `targets list` shows, never a second registration."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mldiag.bootstrap import ControlPlane, control_plane
from mldiag.cli.main import main
from mldiag.kube.discover import NOWHERE, Discoverer, connect
from mldiag.model import RunRecord, TargetRecord
from mldiag.settings import Settings
from tests.helpers.fake_kube import FakeKube, pod, recorded
from tests.helpers.wait import wait_until

RUN = "llama-7b-run"
NS = "ml-team"


@pytest.fixture
def plane(tmp_path: Path) -> ControlPlane:
    p = control_plane(Settings(home=tmp_path / "home"))
    p.state.register_run(RunRecord(name=RUN, created_at=1.0))
    return p


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    fake = FakeKube()
    job = recorded("job")
    fake.put_job(job)
    other = recorded("job")
    other["metadata"]["name"] = "llama-train-slice-1"
    fake.put_job(other)
    with fake.serving():
        yield fake


@pytest.fixture
def discoverer(plane: ControlPlane, kube: FakeKube) -> Iterator[Discoverer]:
    d = Discoverer(plane, RUN, [NS], connect(server=kube.url), watch_timeout_s=2,
                   retry_s=0.2)
    threads = d.run_forever()
    yield d
    d.stopping.set()
    for t in threads:
        t.join(10)


def slice_pod(name: str, index: int, ip: str = "", **kw: Any) -> dict[str, Any]:
    return pod(recorded("jobset_pod"), name=name, index=index, ip=ip, **kw)


def targets(plane: ControlPlane) -> dict[str, TargetRecord]:
    found = plane.state.list_targets(RUN)
    assert len({t.host for t in found}) == len(found), found  # one record a host
    return {t.host: t for t in found}


def targets_list(plane: ControlPlane, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(["targets", "list", "--run", RUN, "--home", str(plane.settings.home)]) == 0
    return capsys.readouterr().out


def at(plane: ControlPlane, host: str, address: str, port: int = 9999) -> bool:
    t = targets(plane).get(host)
    return t is not None and (t.address, t.port) == (address, port)


def registrations(caplog: pytest.LogCaptureFixture, host: str) -> int:
    return sum(f"host {host} of run {RUN}: registered" in r.getMessage()
               for r in caplog.records)


def test_a_jobsets_pods_become_targets_with_stable_names_and_the_jobs_hosts(
        plane: ControlPlane, kube: FakeKube, discoverer: Discoverer,
        capsys: pytest.CaptureFixture[str]) -> None:
    kube.put(slice_pod("llama-train-slice-0-0-aaaaa", 0, "127.0.0.2"))
    kube.put(slice_pod("llama-train-slice-0-1-bbbbb", 1, "127.0.0.3"))
    kube.put(slice_pod("llama-train-slice-1-0-ccccc", 0, "127.0.0.4", job_index=1))
    kube.put(slice_pod("llama-train-slice-1-1-ddddd", 1, "", phase="Pending", job_index=1))
    # The four pods' events may come in more than one batch: wait for the last one's.
    wait_until(lambda: at(plane, "llama-train-slice-1-0", "127.0.0.4") and "has no IP yet" in (
        getattr(targets(plane).get("llama-train-slice-1-1"), "last_error", "")),
               what=lambda: f"the third pod registered, the fourth pending: {targets(plane)}")
    found = targets(plane)
    # Two Jobs (replicas) of parallelism 2: four hosts, numbered across the slices.
    assert {h: (t.address, t.process_index) for h, t in found.items()} == {
        "llama-train-slice-0-0": ("127.0.0.2", 0), "llama-train-slice-0-1": ("127.0.0.3", 1),
        "llama-train-slice-1-0": ("127.0.0.4", 2), "llama-train-slice-1-1": (NOWHERE, 3)}
    pending = found["llama-train-slice-1-1"]
    assert "has no IP yet (Pending)" in pending.last_error
    out = targets_list(plane, capsys)
    assert "kubernetes namespace ml-team: watching" in out
    assert "llama-train-slice-1-1-ddddd has no IP yet" in out
    # The pending pod gets its IP: it is registered where it is.
    kube.put(slice_pod("llama-train-slice-1-1-ddddd", 1, "127.0.0.5", job_index=1))
    wait_until(lambda: at(plane, "llama-train-slice-1-1", "127.0.0.5"), what="the fourth")
    assert targets(plane)["llama-train-slice-1-1"].last_error == ""


def test_a_restarted_pod_moves_its_host_and_an_ended_one_is_marked_gone(
        plane: ControlPlane, kube: FakeKube, discoverer: Discoverer,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mldiag.kube")
    host = "llama-train-slice-0-0"
    kube.put(slice_pod("llama-train-slice-0-0-aaaaa", 0, "127.0.0.2"))
    wait_until(lambda: at(plane, host, "127.0.0.2"), what="registered")
    kube.put(slice_pod("llama-train-slice-0-0-aaaaa", 0, "127.0.0.2", phase="Failed"))
    wait_until(lambda: "gone: pod ml-team/llama-train-slice-0-0-aaaaa ended (Failed)"
               in targets(plane)[host].last_error, what="marked gone")
    assert targets(plane)[host].address == NOWHERE
    # JobSet restarts it: a new pod of the same index, on a new IP and a new port.
    kube.delete(NS, "llama-train-slice-0-0-aaaaa")
    kube.put(slice_pod("llama-train-slice-0-0-zzzzz", 0, "127.0.0.9", port=8470))
    wait_until(lambda: at(plane, host, "127.0.0.9", 8470), what="moved")
    assert len([t for t in plane.state.list_targets(RUN) if t.host == host]) == 1
    kube.delete(NS, "llama-train-slice-0-0-zzzzz")
    wait_until(lambda: "gone: pod ml-team/llama-train-slice-0-0-zzzzz deleted"
               in targets(plane)[host].last_error, what="deleted")
    assert registrations(caplog, host) == 2


def test_bad_pods_are_a_log_line_and_a_listed_state_never_a_registration(
        plane: ControlPlane, kube: FakeKube, discoverer: Discoverer,
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mldiag.kube")
    kube.put(slice_pod("llama-train-slice-0-0-aaaaa", 0, "127.0.0.2"))
    kube.put(slice_pod("llama-train-slice-0-0-dupli", 0, "127.0.0.7"))  # the same index
    kube.put(slice_pod("llama-train-slice-0-1-bbbbb", 1, "127.0.0.3", port=0))
    no_index = slice_pod("sidecar-x1", 0, "127.0.0.6")
    for group in (no_index["metadata"]["labels"], no_index["metadata"]["annotations"]):
        del group["batch.kubernetes.io/job-completion-index"]
    kube.put(no_index)
    kube.put(slice_pod("llama-train-slice-1-0-ccccc", 0, "8.8.8.8", job_index=1))
    wait_until(lambda: "refused" in targets(plane).get("llama-train-slice-1-0",
                                                        TargetRecord(RUN, "x")).last_error,
               what=lambda: f"the egress refusal: {targets(plane)}")
    found = targets(plane)
    assert found["llama-train-slice-0-0"].address == "127.0.0.2"
    assert found["llama-train-slice-0-1"].address == NOWHERE  # its only pod is refused
    assert "outside the allowed networks" in found["llama-train-slice-1-0"].last_error
    out = targets_list(plane, capsys)
    for said in ("llama-train-slice-0-0-dupli has completion index 0, which pod "
                 "llama-train-slice-0-0-aaaaa holds as llama-train-slice-0-0 (duplicate)",
                 "mldiag.dev/profiler-port='0' is not a port",
                 "sidecar-x1 has no batch.kubernetes.io/job-completion-index"):
        assert said in out
        assert sum(said in r.getMessage() for r in caplog.records) == 1
    assert registrations(caplog, "llama-train-slice-0-0") == 1


def test_another_runs_pod_and_an_ungranted_namespace_are_never_registered(
        plane: ControlPlane, kube: FakeKube, capsys: pytest.CaptureFixture[str]) -> None:
    kube.forbid("secret-team")
    kube.put(slice_pod("llama-train-slice-0-0-aaaaa", 0, "127.0.0.2",
                       run="", namespace=NS) | {})
    # The product's label selects every opted-in workload; only this run's are its own.
    theirs = slice_pod("other-train-slice-0-0-eeeee", 0, "127.0.0.8")
    theirs["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] = "other-train"
    for p in (kube.pods[NS, "llama-train-slice-0-0-aaaaa"], theirs):
        del p["metadata"]["labels"]["mldiag.dev/run"]
        p["metadata"]["labels"]["managed-mldiagnostics-gke"] = "true"
    kube.put(kube.pods[NS, "llama-train-slice-0-0-aaaaa"])
    kube.put(theirs)
    product = Discoverer(plane, "llama-train", [NS, "secret-team"], connect(server=kube.url),
                         label_selector="managed-mldiagnostics-gke=true", watch_timeout_s=2)
    plane.state.register_run(RunRecord(name="llama-train", created_at=1.0))
    assert product.list_pods(NS) and not product.list_pods("secret-team")
    # A pod of a namespace it was not granted, however it arrives.
    stray = slice_pod("stray-0-0-fffff", 0, "127.0.0.9", namespace="kube-system")
    product.on_event(NS, "ADDED", stray)
    found = {t.host: t for t in plane.state.list_targets("llama-train")}
    assert found["llama-train-slice-0-0"].address == "127.0.0.2"
    assert not any("other" in h or "stray" in h for h in found)
    capsys.readouterr()
    assert main(["targets", "list", "--run", "llama-train",
                 "--home", str(plane.settings.home)]) == 0
    out = capsys.readouterr().out
    assert "labelled for run 'other-train', not 'llama-train'" in out
    assert "namespace secret-team: the API server refused to list pods (403 Forbidden)" in out
    assert "pod kube-system/stray-0-0-fffff is in a namespace this discoverer was not " \
        "granted" in out


@pytest.mark.parametrize("how", ["garble", "drop", "gone"])
def test_a_broken_or_expired_watch_lists_again_and_registers_nothing_twice(
        plane: ControlPlane, kube: FakeKube, discoverer: Discoverer, how: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mldiag.kube")
    kube.put(slice_pod("llama-train-slice-0-0-aaaaa", 0, "127.0.0.2"))
    wait_until(lambda: at(plane, "llama-train-slice-0-0", "127.0.0.2"), what="registered")
    wait_until(lambda: kube.open_watches, what="a watch")
    if how == "gone":
        kube.compact()  # ends the watch; the next one is from too old a version
    else:
        kube.break_watches(how)
    kube.put(slice_pod("llama-train-slice-0-1-bbbbb", 1, "127.0.0.3"))
    wait_until(lambda: at(plane, "llama-train-slice-0-1", "127.0.0.3")
               and registrations(caplog, "llama-train-slice-0-1"),
               what=lambda: f"the pod after the break: {targets(plane)}")
    said = {"garble": "broke mid-event", "drop": "broke:", "gone": "expired (410 Gone)"}[how]
    assert any(said in r.getMessage() and "listing again" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert registrations(caplog, "llama-train-slice-0-0") == 1
    assert registrations(caplog, "llama-train-slice-0-1") == 1


def test_bookmarks_move_the_watchs_resource_version(
        plane: ControlPlane, kube: FakeKube, discoverer: Discoverer) -> None:
    kube.put(slice_pod("llama-train-slice-0-0-aaaaa", 0, "127.0.0.2"))
    wait_until(lambda: at(plane, "llama-train-slice-0-0", "127.0.0.2"), what="registered")
    wait_until(lambda: kube.open_watches, what="a watch")
    kube.bookmark()
    marked = kube.rv
    wait_until(lambda: any(f"resourceVersion={marked}" in r and "watch=true" in r
                           for r in kube.requests),
               what=lambda: f"a watch from the bookmark's version {marked}: {kube.requests}",
               timeout=10)
    assert all("allowWatchBookmarks=true" in r for r in kube.requests if "watch=true" in r)


def test_a_plain_indexed_job_pod_is_named_after_its_job(
        plane: ControlPlane, kube: FakeKube) -> None:
    plane.state.register_run(RunRecord(name="resnet-run", created_at=1.0))
    job_pod = pod(recorded("job_pod"), name="resnet-bench-0-q9w4z", index=0, ip="127.0.0.2")
    kube.put(job_pod)
    d = Discoverer(plane, "resnet-run", [NS], connect(server=kube.url), watch_timeout_s=1)
    assert d.list_pods(NS)
    # No Job to read (404): its expected hosts are the pods seen, and that is said.
    assert [(t.host, t.address, t.process_index) for t in plane.state.list_targets(
        "resnet-run")] == [("resnet-bench-0", "127.0.0.2", 0)]
    assert any("cannot read its parallelism (404" in p for p in d.status()["problems"])


def test_a_failing_state_store_is_logged_and_the_namespace_listed_again(
        plane: ControlPlane, kube: FakeKube, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = plane.state.upsert_target
    failures = iter([RuntimeError("firestore: 503 unavailable")])

    def flaky(target: TargetRecord) -> None:
        for e in failures:
            raise e
        real(target)

    monkeypatch.setattr(plane.state, "upsert_target", flaky)
    kube.put(slice_pod("llama-train-slice-0-0-aaaaa", 0, "127.0.0.2"))
    d = Discoverer(plane, RUN, [NS], connect(server=kube.url), watch_timeout_s=2, retry_s=0.1)
    threads = d.run_forever()
    try:
        wait_until(lambda: at(plane, "llama-train-slice-0-0", "127.0.0.2"),
                   what="registered after the failure")
    finally:
        d.stopping.set()
        for t in threads:
            t.join(10)
    assert any("discovery in ml-team failed" in r.getMessage() for r in caplog.records)


def test_the_command_registers_the_pods_and_refuses_an_unknown_run(
        plane: ControlPlane, kube: FakeKube, capsys: pytest.CaptureFixture[str]) -> None:
    home = str(plane.settings.home)
    assert main(["kube-discover", "--run", "no-such-run", "-n", NS, "--server", kube.url,
                 "--home", home]) == 1
    assert "unknown run 'no-such-run'" in capsys.readouterr().err
    kube.put(slice_pod("llama-train-slice-0-0-aaaaa", 0, "127.0.0.2"))
    for stop in (signal.SIGINT, signal.SIGTERM):
        # Started with SIGINT ignored, as a shell's background job is: the command still
        # stops on it, and on SIGTERM (a pod's end), cleanly (exit status 0).
        beat = Path(home).parent / f"alive-{stop.name}"
        # An ignored SIGINT is inherited through exec (set here, not in a forked child:
        # JAX's threads make fork unsafe).
        parent = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mldiag.cli.main", "kube-discover", "--run", RUN,
                 "-n", NS, "--server", kube.url, "--home", home, "--watch-timeout", "2",
                 "--heartbeat-file", str(beat)],
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                stderr=subprocess.PIPE, text=True)
        finally:
            signal.signal(signal.SIGINT, parent)
        try:
            # The status on the run is written after the registration and its log line; the
            # heartbeat, after this process's first answered list (its signal handlers are
            # set before its threads start).
            wait_until(lambda beat=beat: beat.exists() and at(plane, "llama-train-slice-0-0",
                                                              "127.0.0.2")
                       and "kubernetes" in plane.state.get_run(RUN).configs,  # type: ignore[union-attr]
                       what="the command's registration", timeout=60)
        finally:
            proc.send_signal(stop)
            try:
                _, err = proc.communicate(timeout=30)
            finally:
                proc.kill()
        assert proc.returncode == 0, (stop, err)
        if stop == signal.SIGINT:
            assert ("host llama-train-slice-0-0 of run llama-7b-run: registered at "
                    "127.0.0.2:9999") in err


def test_the_heartbeat_file_is_touched_by_each_answered_list(
        plane: ControlPlane, kube: FakeKube, tmp_path: Path) -> None:
    beat = tmp_path / "alive"
    kube.forbid("secret-team")
    d = Discoverer(plane, RUN, [NS, "secret-team"], connect(server=kube.url),
                   watch_timeout_s=1, retry_s=0.1, heartbeat=str(beat))
    threads = d.run_forever()
    try:
        wait_until(beat.exists, what="the heartbeat file")
        first = beat.stat().st_mtime_ns
        wait_until(lambda: beat.stat().st_mtime_ns > first, what="a later heartbeat")
    finally:
        d.stopping.set()
        for t in threads:
            t.join(10)
