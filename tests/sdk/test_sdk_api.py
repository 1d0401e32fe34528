"""The SDK behaves as google-cloud-mldiagnostics 1.0.10 does where a workload would notice:
argument order and checks, run names, the MLRun's attributes, lenient profiling, metric values.

Each test registers a real run in a local mldiag home (JAX on CPU) and reads back what the
pipeline, the CLI and the console would read.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from mldiag import stages
from mldiag.adapters.local.state import SqliteStateStore
from mldiag.bootstrap import bootstrap
from mldiag.messages import ProfileObjectFinalized
from mldiag.model import CAPTURED, FAILED, parse_object_name
from mldiag.sdk import machinelearning_run, metric_types, metrics, xprof
from mldiag.sdk.custom_types import exceptions
from mldiag.sdk.custom_types.mlrun_types import ConfigDict, Orchestrator
from mldiag.sdk.metrics import flush_to
from mldiag.settings import Settings

MetricType = metric_types.MetricType


def _work() -> None:
    x = jnp.ones((64, 64))
    for _ in range(3):
        x = (x @ x) / 64.0
    x.block_until_ready()


# Arguments


def test_positional_arguments_follow_upstreams_order(sdk_home: Path,
                                                     sdk_state: SqliteStateStore) -> None:
    run = machinelearning_run("r", "g", {"lr": 0.1}, "gs://b/p")
    assert (run.run_group, dict(run.configs), run.gcs_path) == ("g", {"lr": 0.1}, "gs://b/p")
    assert run.project != "gs://b/p" and run.location == "us-central1"
    stored = sdk_state.get_run("r")
    assert stored is not None and stored.storage_prefix == "p" and stored.run_group == "g"


@pytest.mark.parametrize("kwargs,error", [
    ({"environment": "env"}, "environment must be one of"),
    ({"region": "us-central1-a"}, "received a zone"),
    ({"region": "<some_zone>"}, "Invalid region"),
    ({"application_framework": "keras"}, "Invalid application_framework"),
    ({"rl_orchestrator": "ray"}, "Invalid rl_orchestrator"),
    ({"name": ""}, "name is required"),
    ({"name": "!!!"}, "has no letter or digit"),
])
def test_bad_arguments_raise_upstreams_configuration_error(
        sdk_home: Path, kwargs: dict[str, str], error: str) -> None:
    with pytest.raises(exceptions.MLRunConfigurationError, match=error) as caught:
        machinelearning_run(**{"name": "r", **kwargs})  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)  # upstream's base class, for `except`s
    assert not (sdk_home / "state.db").exists() or not SqliteStateStore(
        sdk_home / "state.db").list_runs()


def test_an_unknown_keyword_is_a_type_error_not_swallowed(sdk_home: Path) -> None:
    with pytest.raises(TypeError, match="projet"):
        machinelearning_run(name="r", projet="p")  # type: ignore[call-arg]


def test_enum_arguments_take_names_as_upstream(sdk_home: Path) -> None:
    run = machinelearning_run(name="r", application_framework="maxtext",
                              rl_orchestrator=None)  # type: ignore[arg-type]
    assert run.application_framework.value == "MAXTEXT"
    assert run.rl_orchestrator.value == "NONE"


# Names


def test_a_run_name_is_sanitised_and_a_capture_under_it_reaches_the_pipeline(
        sdk_home: Path, sdk_state: SqliteStateStore) -> None:
    run = machinelearning_run(name="My Run 1", host_name="worker 0")
    assert (run.name, run.display_name, run.host) == ("my-run-1", "My Run 1", "worker-0")
    with xprof(session_id="s 1/x"):
        _work()
    (name,) = run.wait_uploads(timeout=60)
    assert name == "my-run-1/plugins/profile/s-1-x/worker-0.xplane.pb"
    assert parse_object_name(name) is not None

    # The pipeline's own stage registers the file and completes the session.
    runtime = bootstrap(Settings(home=sdk_home))
    info = runtime.storage.stat(name)
    assert info is not None
    stages.handle(ProfileObjectFinalized(bucket=runtime.storage.bucket, name=name,
                                         generation=info.generation, size=info.size),
                  runtime.services)
    session = sdk_state.get_session("my-run-1", "s-1-x")
    assert session is not None and session.state == CAPTURED
    assert set(session.hosts) == {"worker-0"}


# MLRun


def test_configs_are_a_config_dict_whose_changes_are_saved(sdk_home: Path,
                                                           sdk_state: SqliteStateStore) -> None:
    run = machinelearning_run(name="experiment_1", run_group="training_set_v1",
                              configs={"epochs": 100, "batch_size": 32, "shape": jnp.ones(2)})
    assert isinstance(run.configs, ConfigDict) and run.configs.epochs == 100
    run.configs.update({"epochs": 300, "optimizer": "adam"})
    run.configs.batch_size = 64
    del run.configs.shape
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        _ = run.configs.missing
    stored = sdk_state.get_run("experiment-1")  # sanitised as upstream: "_" → "-"
    assert stored is not None
    assert stored.configs == {"epochs": 300, "batch_size": 64, "optimizer": "adam"}


def test_the_run_has_upstreams_attributes(sdk_home: Path) -> None:
    run = machinelearning_run(name="Attr Run", region="europe-west4", on_demand_xprof=False)
    for attribute in ("name", "run_group", "configs", "gcs_path", "location", "project",
                      "run_phase", "created_at", "workload_details", "workload_targets",
                      "orchestrator", "display_name", "on_demand_xprof", "log_system_metrics",
                      "metric_only_run", "environment", "framework", "serving_engine",
                      "metrics_exporter_config", "accelerator_orchestrator",
                      "application_framework", "rl_orchestrator", "control_plane_url",
                      "ml_run_id", "cluster_id", "workload_id", "namespace"):
        assert hasattr(run, attribute), attribute
    assert run.location == run.region == "europe-west4"
    assert run.run_phase.value == "ACTIVE" and run.created_at


def test_workload_variables_are_read_as_upstream_reads_them(
        sdk_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "a3")
    monkeypatch.setenv("SLURM_NODELIST", "a3-[0-1]")
    monkeypatch.setenv("SLURM_JOB_START_TIME", "1795953600")
    monkeypatch.setenv("SLURM_JOB_NAME", "pretrain")
    run = machinelearning_run(name="r")
    assert run.orchestrator == Orchestrator.SLURM
    assert run.workload_details == {"job_id": "4242", "cluster": "a3",
                                    "display_name": "pretrain",
                                    "submit_time": "2026-11-29T12:00:00Z"}
    run.close()

    for key in ("SLURM_JOB_ID", "SLURM_CLUSTER_NAME", "SLURM_NODELIST"):
        monkeypatch.delenv(key)
    monkeypatch.delenv("MLDIAG_HOST_NAME")
    monkeypatch.setenv("HOSTNAME", "pod-7")
    monkeypatch.setenv("GKE_DIAGON_IDENTIFIER", '{"metadata.name": "job", "metadata.kind": '
                       '"JobSet", "clustername": "c", "namespace": "ns"}')
    run = machinelearning_run(name="r", run_workload_id="w-1")
    assert run.orchestrator == Orchestrator.GKE and run.host == "pod-7"
    assert run.workload_details is not None and run.workload_details["kind"] == "JobSet"
    assert run.workload_id == "w-1"


# Profiling is lenient


def test_start_twice_and_stop_without_start_warn(sdk_home: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    run = machinelearning_run(name="r")
    prof = xprof()
    with caplog.at_level(logging.WARNING):
        prof.stop()
        prof.start(session_id="twice")
        prof.start(session_id="twice")
        _work()
        prof.stop()
    assert "No active profiling session to stop." in caplog.text
    assert "Profiling is already active" in caplog.text
    assert run.wait_uploads(timeout=60) == ["r/plugins/profile/twice/h0.xplane.pb"]


def test_a_busy_profiler_fails_the_session_with_its_reason_and_training_goes_on(
        sdk_home: Path, sdk_state: SqliteStateStore, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    machinelearning_run(name="r")
    jax.profiler.start_trace(str(tmp_path / "someone-else"))
    try:
        with caplog.at_level(logging.ERROR):
            with xprof(session_id="busy"):
                _work()
    finally:
        jax.profiler.stop_trace()
    session = sdk_state.get_session("r", "busy")
    assert session is not None and session.state == FAILED
    assert "h0: the profiler did not start" in session.reason
    assert session.hosts["h0"].status == "FAILED"
    assert "the profiler did not start" in caplog.text


def test_xprof_without_a_run_raises_profiling_error(sdk_home: Path) -> None:
    with pytest.raises(exceptions.ProfilingError, match="No active ML run"):
        xprof().start()


def test_a_metric_only_run_does_not_profile(sdk_home: Path,
                                            sdk_state: SqliteStateStore) -> None:
    run = machinelearning_run(name="r", metric_only_run=True)
    with xprof(session_id="nothing"):
        _work()
    assert run.wait_uploads(timeout=10) == []
    assert sdk_state.get_session("r", "nothing") is None
    # Nothing to capture from: no target for on-demand captures to pick or sessions to wait on.
    assert sdk_state.list_targets("r") == [] and run.puller is None
    metrics.record(MetricType.LOSS, 0.25, step=3)
    flush_to(run)
    assert [(p.name, p.value) for p in sdk_state.list_metrics("r")] == [("loss", 0.25)]


# Metrics


def test_metric_values_are_taken_as_upstream_takes_them(sdk_home: Path,
                                                        sdk_state: SqliteStateStore) -> None:
    run = machinelearning_run(name="r")
    metrics.record(MetricType.LOSS, [1.0, 2.0], step=1)     # the mean
    metrics.record(MetricType.LOSS, None, step=2)           # dropped
    metrics.record("phase", "eval", step=3)                 # a log entry
    metrics.record("notes", {"lr_schedule": "cosine"})      # a log entry
    metrics.record(MetricType.LOSS, object())               # dropped with a warning
    metrics.record(MetricType.HBM_UTILIZATION, 50.0)        # a system metric: not logged
    metrics.record_metrics([{"metric_name": MetricType.LEARNING_RATE, "value": 0.1},
                            {"metric_name": "custom", "value": 3, "step": 9},
                            {"metric_name": "stepless", "value": 1.0, "step": None}], step=4)
    flush_to(run)
    got = {(p.name, p.step): p for p in sdk_state.list_metrics("r")}
    assert set(got) == {("loss", 1), ("phase", 3), ("notes", None), ("learning_rate", 4),
                        ("custom", 9), ("stepless", None)}
    assert got["loss", 1].value == 1.5 and got["loss", 1].labels == {"unit": "1"}
    assert got["phase", 3].value is None and got["phase", 3].body == "eval"
    assert got["phase", 3].labels == {"unit": "1", "namespace": "phase"}
    assert got["notes", None].body == {"lr_schedule": "cosine"}
    assert all(p.host == "h0" for p in got.values())


def test_metrics_are_written_in_batches_in_the_background(sdk_home: Path,
                                                          sdk_state: SqliteStateStore) -> None:
    run = machinelearning_run(name="r")
    # The loop never waits on the store: with the store's writes held back, all 2000 records
    # still return, and the points land once the writer may go on. (Its speed, a few µs a
    # record, is bench/metrics.py's to measure, not a timed test's.)
    gate = threading.Event()
    write = run.plane.state.record_metrics

    def held(*args: Any, **kwargs: Any) -> Any:
        gate.wait(30)
        return write(*args, **kwargs)

    run.plane.state.record_metrics = held  # type: ignore[method-assign]
    try:
        for i in range(2000):
            metrics.record(MetricType.STEP_TIME, 0.01, step=i)
        assert sdk_state.list_metrics("r", "step_time") == []  # none written yet
    finally:
        gate.set()
    deadline = time.monotonic() + 15
    while len(sdk_state.list_metrics("r", "step_time")) < 2000:
        assert time.monotonic() < deadline, "the background writer did not store the points"
        time.sleep(0.05)
    assert [p.step for p in sdk_state.list_metrics("r", "step_time")] == list(range(2000))


def test_a_jax_array_is_read_on_the_sdks_thread_not_the_training_thread(
        sdk_home: Path, sdk_state: SqliteStateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # float() or int() of a JAX array waits for the device (a sync of JAX's async dispatch):
    # `record` hands the array to the SDK's metrics thread, which reads it.
    run = machinelearning_run(name="r")
    loss, step = jnp.asarray(0.25) * 2, jnp.asarray(3) + 0
    cls = type(loss)
    read_on: list[str] = []

    def spy(method: str) -> Any:
        real = getattr(cls, method)

        def read(self: Any) -> Any:
            read_on.append(threading.current_thread().name)
            return real(self)
        return read

    for method in ("__float__", "__int__", "__index__"):
        monkeypatch.setattr(cls, method, spy(method))
    metrics.record(MetricType.LOSS, loss, step=step)
    metrics.record(MetricType.STEP_TIME, jnp.asarray(0.125) + 0, step=3)
    metrics.record("losses", [loss, jnp.asarray(1.5) + 0], step=4)

    def wait_for(name: str) -> None:
        deadline = time.monotonic() + 15
        while not metrics.history(name):
            assert time.monotonic() < deadline, f"{name} was never read"
            time.sleep(0.01)

    wait_for(MetricType.LOSS)
    assert read_on and "MainThread" not in read_on
    wait_for("losses")
    # Every read (the values, the list's elements, the step) on the metrics thread.
    assert len(read_on) >= 5 and set(read_on) == {"mldiag-metrics"}
    flush_to(run)
    got = {p.name: (p.step, p.value) for p in sdk_state.list_metrics("r")}
    assert got == {"loss": (3, 0.5), "step_time": (3, 0.125), "losses": (4, 1.0)}
    assert [s.value for s in metrics.history(MetricType.STEP_TIME)] == [0.125]


def test_points_recorded_before_the_run_go_to_it(sdk_home: Path,
                                                 sdk_state: SqliteStateStore) -> None:
    metrics.record(MetricType.LOSS, 0.5, step=0)
    run = machinelearning_run(name="late")
    flush_to(run)
    assert [(p.name, p.value) for p in sdk_state.list_metrics("late")] == [("loss", 0.5)]


def test_close_writes_what_is_left(sdk_home: Path, sdk_state: SqliteStateStore) -> None:
    run = machinelearning_run(name="r")
    metrics.record(MetricType.STEP_TIME, 0.2, step=7)
    run.close()
    assert [(p.step, p.value) for p in sdk_state.list_metrics("r")] == [(7, 0.2)]
