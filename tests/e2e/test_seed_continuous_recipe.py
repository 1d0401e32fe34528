"""The seed's own continuous-profiling recipe runs verbatim (issue 34, item 16).

A workload starts xprof's native continuous profiling itself, with the Python the product's
docs show (`continuous_profiling_snapshot.start_continuous_profiling(ADDRESS, {})`), and
nobody runs `continuous start` through mldiag. The documented snapshot command then takes a
snapshot, through the CLI and a running local pipeline (not the stage alone): mldiag decides
whether continuous profiling is on by asking the target (the snapshot itself), not by its own
record, which says OFF. When it really is off, the host fails with the target's own answer.

The profiler server is the stand-in of tests/sdk/profiler_standin.py (xprof's native session
records device traces on TPU only; the stand-in's buffer is a real CPU trace), reached by
xprof's own client as a TPU workload's would be.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from mldiag.bootstrap import LocalRuntime, bootstrap
from mldiag.cli.main import main
from mldiag.model import FAILED, REPORTED
from mldiag.settings import Settings
from tests.helpers.pipeline import FAST, finished
from tests.sdk.profiler_standin import StandInProfiler

pytestmark = pytest.mark.slow
RUN = "seed-recipe"


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[LocalRuntime]:
    rt = bootstrap(Settings(home=tmp_path / "home", **FAST))
    rt.start()
    yield rt
    rt.stop()


@pytest.fixture
def profiler() -> Iterator[StandInProfiler]:
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            jax.block_until_ready(jnp.ones((64, 64)) @ jnp.ones((64, 64)))
        (found,) = Path(tmp).glob("plugins/profile/*/*.xplane.pb")
        server = StandInProfiler(buffer=found.read_bytes(), native=False).start()
    yield server
    server.stop()


def cli(runtime: LocalRuntime, capsys: pytest.CaptureFixture[str], *argv: str
        ) -> tuple[int, str]:
    capsys.readouterr()
    code = main([*argv, "--home", str(runtime.services.settings.home)])
    out, err = capsys.readouterr()
    return code, out + err


def test_a_workloads_own_continuous_profiling_is_snapshotted_with_the_documented_command(
        runtime: LocalRuntime, profiler: StandInProfiler,
        capsys: pytest.CaptureFixture[str]) -> None:
    from xprof.api import continuous_profiling_snapshot

    # The workload, verbatim (its own profiler server's address).
    continuous_profiling_snapshot.start_continuous_profiling(f"localhost:{profiler.port}", {})
    assert cli(runtime, capsys, "machine-learning-run", "create", RUN,
               "--location=us-central1")[0] == 0
    code, out = cli(runtime, capsys, "profiler-target", "create", RUN, "--address",
                    profiler.address, "--platform", "tpu")
    assert code == 0, out
    (target,) = runtime.state.list_targets(RUN)
    assert target.continuous == "OFF", "mldiag was told nothing"
    # The documented line (docs/capture.md), and nothing else.
    code, out = cli(runtime, capsys, "capture", "s2", "--run", RUN, "--kind", "snapshot",
                    "--duration", "4s")
    assert code == 0, out
    assert "continuous profiling is off" not in out
    s = finished(runtime, RUN, "s2")
    assert s.state == REPORTED, s.reason
    assert "GetSnapshot" in profiler.calls
    # The gcloud-style line too.
    code, out = cli(runtime, capsys, "profiler-session", "capture", "s3",
                    f"--machine-learning-run={RUN}", f"--targets={target.host}",
                    "--duration", "4000ms", "--kind", "snapshot", "--location=us-central1")
    assert code == 0, out
    assert finished(runtime, RUN, "s3").state == REPORTED

    # Really off: the snapshot is still asked for, and the host fails with the target's own
    # answer (not mldiag's record).
    continuous_profiling_snapshot.stop_continuous_profiling(f"localhost:{profiler.port}")
    code, out = cli(runtime, capsys, "capture", "s4", "--run", RUN, "--kind", "snapshot",
                    "--duration", "4s")
    s = finished(runtime, RUN, "s4")
    assert s.state == FAILED
    assert "native continuous profiling is not running" in s.reason or \
        "continuous profiling is off" in s.reason, s.reason
    assert code != 0 and "continuous profiling is off" in out
