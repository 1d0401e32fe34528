"""Every gcloud command line of the product's documentation (gcloud_doc_snippets.json, with
only `gcloud alpha mldiagnostics` replaced by `mldiag`) runs in bash against a local runtime
and a JAX workload that only called `jax.profiler.start_server`, and does what its page says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mldiag.bootstrap import LocalRuntime, bootstrap
from mldiag.messages import DegradationDetected
from mldiag.model import FAILED, REPORTED
from mldiag.settings import Settings
from tests.helpers.net import free_port
from tests.helpers.pipeline import FAST
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SNIPPETS = json.loads(Path(__file__).with_name("gcloud_doc_snippets.json").read_text())
WORKLOAD = REPO / "tests" / "e2e" / "plain_workload.py"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalRuntime, dict]]:
    tmp = tmp_path_factory.mktemp("docs")
    rt = bootstrap(Settings(home=tmp / "home", **FAST))
    rt.start()
    port = free_port()
    server = subprocess.Popen([sys.executable, str(WORKLOAD), "--port", str(port)],
                              env={**os.environ, "JAX_PLATFORMS": "cpu",
                                   "TF_CPP_MIN_LOG_LEVEL": "3"},
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "mldiag").write_text(f"#!/bin/sh\nexec {sys.executable} -m mldiag.cli.main "
                                    "\"$@\"\n")
    (bin_dir / "mldiag").chmod(0o755)
    env = {**os.environ, "MLDIAG_HOME": str(rt.services.settings.home),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(REPO / "shared"), str(REPO)])}
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        address = f"127.0.0.1:{port}"
        # The documentation's runs and targets, registered the way a user without the SDK
        # does: from the CLI.
        setup = [f"mldiag machine-learning-run create {run}"
                 for run in ("my-ml-run", "my-run", "my-run-123")]
        setup += [f"mldiag profiler-target create {run} --address {address} --host-name {host}"
                  for run, host in (("my-ml-run", "mldiag-prod-demo-jobset-tpu-slice-0-0-qmx7s"),
                                    ("my-ml-run", "my-target-1"), ("my-run", "node-0"),
                                    ("my-run-123", "node-0"))]
        setup.append("mldiag autocapture set --run my-run-123 --enable --kind on-demand "
                     "--duration 500ms")
        for line in setup:
            done = subprocess.run(line, shell=True, env=env, capture_output=True, text=True,
                                  timeout=120)
            assert done.returncode == 0, (line, done.stderr)
        # The event the monitored-events example describes.
        rt.services.bus.publish(DegradationDetected(alert_id="abc-123-def-456", run="my-run-123",
                                                    source="workload-monitoring",
                                                    summary="performance degradation"))
        wait_until(lambda: any(
            s.trigger == "alert" and s.state in (REPORTED, FAILED)
            for s in rt.state.list_sessions(run="my-run-123")),
            what="the alert's session", timeout=120, interval=0.1)
        yield rt, env
    finally:
        os.killpg(server.pid, 9)
        server.wait()
        rt.stop()


@pytest.mark.parametrize("snippet", SNIPPETS["snippets"],
                         ids=[f"{i:02d}-{s['command'].split()[1]}-{s['command'].split()[2]}"
                              if s["command"].startswith("mldiag") else f"{i:02d}-pipeline"
                              for i, s in enumerate(SNIPPETS["snippets"])])
def test_a_documented_command_does_what_its_page_says(
        world: tuple[LocalRuntime, dict], snippet: dict) -> None:
    rt, env = world
    done = subprocess.run(["bash", "-o", "pipefail", "-c", snippet["command"]], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{snippet['source']}: {done.stderr}"
    for text in snippet.get("stdout", ()):
        assert text in done.stdout + done.stderr, (text, done.stdout)
    if "lines_at_most" in snippet:
        assert 1 < len(done.stdout.splitlines()) <= snippet["lines_at_most"]
    if "json_keys" in snippet:
        assert set(snippet["json_keys"]) <= set(json.loads(done.stdout))
    if "run" in snippet:
        assert rt.state.get_run(snippet["run"]) is not None
    if "session" in snippet:
        run, name, hosts = snippet["session"]
        s = rt.state.get_session(run, name)
        assert s is not None and s.state == REPORTED, s
        assert sum(h.status == "ARRIVED" for h in s.hosts.values()) == hosts
    if "gone" in snippet:
        assert rt.state.get_run(snippet["gone"]) is None
        assert rt.state.list_targets(snippet["gone"]) == []
