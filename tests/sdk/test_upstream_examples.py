"""google-cloud-mldiagnostics 1.0.10's own examples (every ```python block of its README, the
wheel's METADATA, and the Example sections of three docstrings) run against mldiag.sdk with
only the import changed. They are read from the real wheel, which scripts/test downloads into
.venv/upstream/ (PyPI, no dependencies): nothing of upstream's is copied into this repository.

What a user types into a template is filled in (`<run_name>` and friends, and the elided
arguments `# ...` / `...` of a `machinelearning_run(...)` call, which stand for the name),
and names the README leaves to the reader's code (`loss`, `train_model`, a run created before
`metrics.record`) are given. Each example then ends as it does with upstream: it runs and
leaves what a user would look for in mldiag's state store and bucket, or it raises the same
error upstream raises on it. Examples that call no SDK function are skipped, with the reason.
"""

from __future__ import annotations

import ast
import re
import socket
import sys
import textwrap
import types
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mldiag.adapters.local.state import SqliteStateStore
from mldiag.sdk.custom_types.exceptions import MLRunConfigurationError
from mldiag.sdk.metrics import flush_to
from mldiag.sdk.run import current_run

REPO = Path(__file__).resolve().parents[2]
WHEEL = REPO / ".venv" / "upstream" / "google_cloud_mldiagnostics-1.0.10-py3-none-any.whl"
# The README's python blocks, in order, by what each shows.
README_EXAMPLES = (
    "readme-cloud-logging-setup", "readme-cloud-logging-debug", "readme-metrics-exporter-config",
    "readme-full-example", "readme-environment", "readme-configs-from-yaml",
    "readme-record-one", "readme-record-metrics-loop", "readme-record-custom",
    "readme-record-metrics-custom", "readme-xprof-three-ways", "readme-xprof-all-hosts",
    "readme-xprof-session-id", "readme-xprof-process-index-list", "readme-jax-distributed-env",
    "readme-jax-distributed-jobset", "readme-on-demand", "readme-gce-shell")
# The docstrings with an Example section: (module in the wheel, function).
DOCSTRING_EXAMPLES = {
    "docstring-machinelearning-run": ("api/mlrun.py", "machinelearning_run"),
    "docstring-metrics-record": ("api/metrics.py", "record"),
    "docstring-metrics-record-metrics": ("api/metrics.py", "record_metrics"),
}
IMPORT_CHANGE = ("google_cloud_mldiagnostics", "mldiag.sdk")
PLACEHOLDERS = {"<run_name>": "readme-run", "<run_group>": "readme-group",
                "<some_project>": "readme-project", "<some_zone>": "us-central1",
                "<some_bucket>": "readme-bucket", "<bucket>": "readme-bucket"}
# The names the README's fragments take from the reader's code ("User codes").
PRELUDE = """
import os
from mldiag.sdk import machinelearning_run, metrics, xprof, metric_types
from mldiag.sdk.metric_types import MetricType
num_steps, step, step_size, learning_rate = 20, 0, 0.01, 0.001
loss, gradient, total_weights = 0.5, 1.25, 1000
step_time, throughput, latency, tflops, mfu = 0.05, 90.0, 0.02, 11.0, 41.0
per_device_tf_flops = 11.0
"""
SKIPPED = {
    "readme-cloud-logging-setup": "Cloud Logging set-up; no SDK call",
    "readme-cloud-logging-debug": "Cloud Logging set-up; no SDK call",
    "readme-jax-distributed-env": "JAX's multi-host set-up (needs a coordinator); no SDK call",
    "readme-jax-distributed-jobset": "JAX's multi-host set-up (needs a coordinator); no SDK call",
    "readme-gce-shell": "a shell command, not Python",
}


def load() -> dict[str, str]:
    """The examples, read from the real wheel."""
    if not WHEEL.is_file():
        raise FileNotFoundError(
            f"{WHEEL} is missing: scripts/test downloads it (`python -m pip download --no-deps "
            "-d .venv/upstream google-cloud-mldiagnostics==1.0.10`)")
    with zipfile.ZipFile(WHEEL) as wheel:
        meta = wheel.read("google_cloud_mldiagnostics-1.0.10.dist-info/METADATA").decode()
        blocks = [m.group(1) for m in re.finditer(
            r"^[ \t]*```python[ \t]*\n(.*?)^[ \t]*```", meta, re.M | re.S)]
        assert len(blocks) == len(README_EXAMPLES), f"{len(blocks)} python blocks in README"
        examples = dict(zip(README_EXAMPLES, blocks, strict=True))
        for name, (module, function) in DOCSTRING_EXAMPLES.items():
            tree = ast.parse(wheel.read(f"google_cloud_mldiagnostics/{module}").decode())
            node = next(n for n in ast.walk(tree)
                        if isinstance(n, ast.FunctionDef) and n.name == function)
            doc = ast.get_docstring(node, clean=False) or ""
            section = doc.split("Example:\n", 1)[1]
            examples[name] = textwrap.dedent(section).strip("\n") + "\n"
    return examples


EXAMPLES = load()


def ported(name: str) -> str:
    """The example as a user runs it on mldiag: the import changed, templates filled in."""
    source = EXAMPLES[name].replace(*IMPORT_CHANGE)
    for placeholder, value in PLACEHOLDERS.items():
        source = source.replace(placeholder, value)
    lines = []
    for line in source.splitlines():
        if re.fullmatch(r"\s*(#\s*)?\.\.\.( .*)?", line) and "machinelearning_run(" in source:
            if "name=" not in source:
                line = re.sub(r"\S.*", 'name="readme-run",', line)
            else:
                continue
        lines.append(line)
    return "\n".join(lines)


def _work() -> None:
    import jax.numpy as jnp

    x = jnp.ones((32, 32))
    (x @ x).block_until_ready()


def execute(name: str, *, run_first: bool) -> dict[str, Any]:
    namespace: dict[str, Any] = {"train_model": _work, "evaluate_model": _work,
                                 "__name__": "readme_example"}
    exec(compile(PRELUDE, "<prelude>", "exec"), namespace)
    if run_first:  # "machinelearning_run should be called" before metrics and xprof
        namespace["machinelearning_run"](name="readme-run")
    exec(compile(ported(name), name, "exec"), namespace)
    return namespace


def uploaded(home: Path, run: str) -> list[str]:
    return sorted(str(p.relative_to(home / "bucket"))
                  for p in (home / "bucket" / run).rglob("*.xplane.pb"))


def stored(state: SqliteStateStore, run: str) -> list[tuple[str, int | None, Any]]:
    active = current_run()
    if active is not None:
        flush_to(active)
    return [(p.name, p.step, p.value if p.value is not None else p.body)
            for p in state.list_metrics(run)]


@pytest.fixture
def free_profiler_port(monkeypatch: pytest.MonkeyPatch) -> int:
    # on_demand_xprof=True starts the profiler server on 9999 as upstream; other test runs
    # on this machine may hold that port, so the examples get a free one through the env.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    monkeypatch.setenv("MLDIAG_PROFILER_PORT", str(port))
    return port


@pytest.fixture
def cloud_logging(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A stand-in for the google-cloud-logging client the README's full example sets up
    (a third-party client: mldiag does not use it)."""
    import google.cloud

    calls: list[str] = []

    class Client:
        def setup_logging(self) -> None:
            calls.append("setup_logging")

    stub = types.ModuleType("google.cloud.logging")
    stub.Client = Client  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "google.cloud.logging", stub)
    monkeypatch.setattr(google.cloud, "logging", stub, raising=False)
    return calls


def test_upstreams_examples_are_all_accounted_for() -> None:
    assert len(EXAMPLES) == 21
    covered = {n for n, *_ in CASES} | set(SKIPPED)
    assert covered == set(EXAMPLES)
    # Only the import changes: no example mentions mldiag before porting.
    assert not any("mldiag.sdk" in source for source in EXAMPLES.values())
    assert "from google_cloud_mldiagnostics import" in EXAMPLES["readme-full-example"]


def _full_example(home: Path, state: SqliteStateStore, ns: dict[str, Any],
                  calls: list[str]) -> None:
    assert calls == ["setup_logging"]
    run = ns["run"]
    assert (run.name, run.display_name) == ("readme-run", "readme-run")
    assert state.get_run("readme-run").configs == {"epochs": 100, "batch_size": 32}
    assert ("loss", 1, 0.123) in stored(state, "readme-run")
    run.wait_uploads(timeout=60)
    assert len(uploaded(home, "readme-run")) == 1  # `with xprof():`, a session of its own


def _yaml(home: Path, state: SqliteStateStore, ns: dict[str, Any], calls: list[str]) -> None:
    assert state.get_run("readme-run").configs == {"model": {"layers": 4}, "lr": 0.01}


def _loop(home: Path, state: SqliteStateStore, ns: dict[str, Any], calls: list[str]) -> None:
    points = stored(state, "readme-run")
    assert {(n, s) for n, s, _ in points} == {
        (m, s) for m in ("learning_rate", "loss", "gradient_norm", "total_weights",
                         "step_time", "throughput", "latency", "tflops", "mfu")
        for s in (10, 20)}


def _sessions(expected: list[str]) -> Callable[..., None]:
    def check(home: Path, state: SqliteStateStore, ns: dict[str, Any], calls: list[str]) -> None:
        current_run().wait_uploads(timeout=60)
        got = uploaded(home, "readme-run")
        assert len(got) == len(expected)
        for name, want in zip(got, expected, strict=True):
            assert want == "*" or f"/profile/{want}/" in name
        for s in state.list_sessions(run="readme-run"):
            assert s.kind == "programmatic" and s.state == "CAPTURING"

    return check


def _docstring_run(home: Path, state: SqliteStateStore, ns: dict[str, Any],
                   calls: list[str]) -> None:
    # Upstream's ConfigDict.update then calls a control-plane client it does not have and
    # raises AttributeError; here the update is saved, as its docstring says it should be.
    assert ns["my_run"].name == "experiment-1"
    assert state.get_run("experiment-1").configs == {"epochs": 300, "batch_size": 64,
                                                     "optimizer": "adam"}


def _stored(*expected: tuple[str, int | None, Any]) -> Callable[..., None]:
    def check(home: Path, state: SqliteStateStore, ns: dict[str, Any], calls: list[str]) -> None:
        assert list(expected) == stored(state, "readme-run")

    return check


def _run_made(home: Path, state: SqliteStateStore, ns: dict[str, Any], calls: list[str]) -> None:
    run = current_run()
    assert run is not None and run.name == "readme-run"
    assert run.metrics_exporter_config == {"mode": ["otel", "cloud_logging"],
                                           "userConfig": ["otel", "cloud_logging"]}


def _on_demand(home: Path, state: SqliteStateStore, ns: dict[str, Any], calls: list[str]) -> None:
    run = current_run()
    assert run is not None and run.profiler_server is not None
    (target,) = state.list_targets("readme-run")
    with socket.create_connection(("127.0.0.1", target.port), timeout=5):
        pass  # the profiler server listens, as on_demand_xprof=True promises


# (example, creates its own run, what upstream raises on it or None, what to check after)
CASES: list[tuple[str, bool, type[BaseException] | None, Callable[..., None] | None]] = [
    ("readme-metrics-exporter-config", True, None, _run_made),
    ("readme-full-example", True, None, _full_example),
    ("readme-environment", True, MLRunConfigurationError, None),  # "env": not a known one
    ("readme-configs-from-yaml", True, None, _yaml),
    ("readme-record-one", False, None, _stored(("loss", 1, 0.123))),
    ("readme-record-metrics-loop", False, None, _loop),
    ("readme-record-custom", False, None, _stored(("custom_metrics_1", 1, 0.01))),
    ("readme-record-metrics-custom", False, SyntaxError, None),  # `{"a", "value":<value>}`
    ("readme-xprof-three-ways", False, None, _sessions(["*", "*"])),
    ("readme-xprof-all-hosts", False, None, _sessions(["*"])),
    ("readme-xprof-session-id", False, None, _sessions(["profiling_session"])),
    ("readme-xprof-process-index-list", False, None, _sessions(["*"])),  # process 0 of [0, 2]
    ("readme-on-demand", True, None, _on_demand),
    ("docstring-machinelearning-run", True, None, _docstring_run),
    ("docstring-metrics-record", False, AttributeError, None),  # MetricType has no TF_FLOPS
    ("docstring-metrics-record-metrics", False, AttributeError, None),
]


@pytest.mark.parametrize("name,own_run,raises,check", CASES, ids=[c[0] for c in CASES])
def test_an_upstream_example_runs_with_only_the_import_changed(
        name: str, own_run: bool, raises: type[BaseException] | None,
        check: Callable[..., None] | None, sdk_home: Path, sdk_state: SqliteStateStore,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free_profiler_port: int,
        cloud_logging: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text("model:\n  layers: 4\nlr: 0.01\n")
    if name == "readme-full-example":
        # The example catches every exception and logs it: a failure must not hide there.
        import logging

        errors: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = errors.append  # type: ignore[method-assign]
        handler.setLevel(logging.ERROR)
        logging.getLogger().addHandler(handler)
        monkeypatch.setattr(logging.getLogger(), "level", logging.INFO)
    if raises is not None:
        with pytest.raises(raises):
            execute(name, run_first=not own_run)
        return
    namespace = execute(name, run_first=not own_run)
    if name == "readme-full-example":
        logging.getLogger().removeHandler(handler)
        assert not errors, [r.getMessage() for r in errors]
    assert check is not None
    check(sdk_home, sdk_state, namespace, cloud_logging)
