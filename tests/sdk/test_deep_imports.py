"""Upstream's deep imports (`core.xprof`, `api.mlrun`, `api.metrics`, `commands.run_vllm`,
`commands.collect_profile`) under `mldiag.sdk`, with upstream's names and signatures read from
the real google-cloud-mldiagnostics 1.0.10 wheel that scripts/test downloads."""

from __future__ import annotations

import argparse
import ast
import inspect
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mldiag.capture import remote
from mldiag.sdk.run import current_run
from tests.helpers.net import free_port
from tests.helpers.wait import wait_until

REPO = Path(__file__).resolve().parents[2]
STANDIN = Path(__file__).with_name("vllm_standin.py")
WHEEL = REPO / ".venv" / "upstream" / "google_cloud_mldiagnostics-1.0.10-py3-none-any.whl"


def upstream(module: str) -> ast.Module:
    if not WHEEL.is_file():
        raise FileNotFoundError(f"{WHEEL} is missing: scripts/test downloads it")
    with zipfile.ZipFile(WHEEL) as wheel:
        return ast.parse(wheel.read(f"google_cloud_mldiagnostics/{module}").decode())


def upstream_params(module: str, function: str) -> list[tuple[str, object]]:
    node = next(n for n in ast.walk(upstream(module))
                if isinstance(n, ast.FunctionDef) and n.name == function)
    args = node.args.args
    defaults = [None] * (len(args) - len(node.args.defaults)) + list(node.args.defaults)
    return [(a.arg, ast.unparse(d) if d is not None else None)
            for a, d in zip(args, defaults, strict=True)]


def upstream_flags(module: str) -> set[str]:
    """The flags of the module-level `parser` (not of helpers' own parsers)."""
    calls = [s.value for s in upstream(module).body
             if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)]
    return {c.args[0].value for c in calls
            if isinstance(c.func, ast.Attribute) and c.func.attr == "add_argument"
            and ast.unparse(c.func.value) == "parser" and isinstance(c.args[0], ast.Constant)}


def our_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


def our_params(function: object) -> list[tuple[str, object]]:
    params = inspect.signature(function).parameters.values()  # type: ignore[arg-type]
    out = []
    for p in params:
        if p.kind is not p.POSITIONAL_OR_KEYWORD:
            continue
        default = None if p.default is p.empty else p.default
        out.append((p.name, default))
    return out


def test_core_xprof_has_upstreams_on_demand_functions_and_xprof() -> None:
    from mldiag.sdk.core import xprof as core_xprof
    from mldiag.sdk.core.xprof import (  # noqa: F401 - the import is the test
        Xprof,
        start_on_demand_xprof,
        stop_on_demand_xprof,
        xprof,
    )

    assert our_params(start_on_demand_xprof) == [("port", 9999)]
    assert upstream_params("core/xprof.py", "start_on_demand_xprof") == [("port", "9999")]
    assert our_params(stop_on_demand_xprof) == upstream_params(
        "core/xprof.py", "stop_on_demand_xprof") == []
    assert core_xprof.xprof is xprof


def test_api_mlrun_machinelearning_run_takes_upstreams_arguments_in_order() -> None:
    from mldiag.sdk import api
    from mldiag.sdk.api import mlrun
    from mldiag.sdk.api.metrics import record, record_metrics  # noqa: F401

    assert api.machinelearning_run is mlrun.machinelearning_run
    theirs = [name for name, _ in upstream_params("api/mlrun.py", "machinelearning_run")]
    ours = [name for name, _ in our_params(mlrun.machinelearning_run)]
    assert ours == theirs


@pytest.mark.parametrize("module", ["run_vllm", "collect_profile"])
def test_commands_take_upstreams_flags(module: str) -> None:
    import importlib

    ours = importlib.import_module(f"mldiag.sdk.commands.{module}")
    theirs = upstream_flags(f"commands/{module}.py")
    assert theirs and theirs <= our_flags(ours.parser)
    assert callable(ours.main)


def test_the_on_demand_server_starts_and_stops(sdk_home: Path) -> None:
    from mldiag.sdk.core.xprof import start_on_demand_xprof, stop_on_demand_xprof

    assert current_run() is None  # as upstream: JAX's server when no run is registered
    port = free_port()
    start_on_demand_xprof(port)
    try:
        assert wait_until(lambda: remote.accepts_connections(f"127.0.0.1:{port}"),
                          what="the server", timeout=120, interval=0.1)
        start_on_demand_xprof(port)  # a second start warns, and changes nothing
    finally:
        stop_on_demand_xprof()
    assert wait_until(lambda: not remote.accepts_connections(f"127.0.0.1:{port}"),
                      what="the server to stop", timeout=10, interval=0.1)


def test_collect_profile_traces_a_profiler_server_into_a_logdir(tmp_path: Path) -> None:
    from mldiag.sdk.commands import collect_profile

    port, stop = free_port(), tmp_path / "stop"
    # A workload with only `jax.profiler.start_server(port)` (the vLLM stand-in's server).
    env = {**os.environ, "USE_JAX_PROFILER_SERVER": "True",
           "JAX_PROFILER_SERVER_PORT": str(port), "JAX_PLATFORMS": "cpu"}
    env.pop("PHASED_PROFILING_DIR", None)
    proc = subprocess.Popen([sys.executable, str(STANDIN), "--stop-file", str(stop)], env=env)
    try:
        wait_until(lambda: remote.accepts_connections(f"127.0.0.1:{port}"),
                   what="the server", timeout=120, interval=0.1)
        assert collect_profile.main([
            "--hosts", "127.0.0.1", "--port", str(port), "--duration_in_ms", "500",
            "--log_dir", str(tmp_path / "logs"), "--session_name", "s1",
            "--override_hostnames", "worker-0"]) == 0
    finally:
        stop.touch()
        proc.wait(timeout=60)
    xplane = tmp_path / "logs" / "plugins" / "profile" / "s1" / "worker-0.xplane.pb"
    assert xplane.stat().st_size > 0
    # Upstream's check on the names, and a bucket path, fail with one line.
    assert collect_profile.main(["--hosts", "a,b", "--port", "1", "--duration_in_ms", "1",
                                 "--log_dir", str(tmp_path), "--override_hostnames", "x"]) == 1
    assert collect_profile.main(["--hosts", "a", "--port", "1", "--duration_in_ms", "1",
                                 "--log_dir", "gs://b/p"]) == 1
