"""The run's `rl_orchestrator` is stored on the run, not only set on the process's MLRun:
`machinelearning_run(rl_orchestrator=...)` and Tunix's MldiagHooks both save it, so `runs
describe`, the API and the console read it. Runs without google-tunix: the hooks' import
guard is lifted for the one hook that needs no Tunix object (`on_train_start`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from mldiag.adapters.local.state import SqliteStateStore
from mldiag.cli.main import main
from mldiag.sdk import machinelearning_run
from mldiag.sdk.custom_types.mlrun_types import RlOrchestrator
from mldiag.sdk.integrations import tunix as mldiag_tunix


def stored(state: SqliteStateStore, name: str) -> str:
    record = state.get_run(name)
    assert record is not None
    return record.rl_orchestrator


def test_the_registered_orchestrator_is_stored(sdk_state: SqliteStateStore) -> None:
    machinelearning_run(name="rl-run", rl_orchestrator="TUNIX")
    assert stored(sdk_state, "rl-run") == "TUNIX"
    machinelearning_run(name="plain-run")
    assert stored(sdk_state, "plain-run") == ""


def test_tunix_hooks_store_tunix_on_the_run_when_training_starts(
        sdk_home: Path, sdk_state: SqliteStateStore, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    run = machinelearning_run(name="tunix-sft")
    assert stored(sdk_state, "tunix-sft") == ""
    monkeypatch.setattr(mldiag_tunix, "_MISSING", "")
    hooks = mldiag_tunix.MldiagHooks(profile_steps=None)
    hooks.on_train_start(SimpleNamespace(model=None))
    assert run.rl_orchestrator is RlOrchestrator.TUNIX
    assert stored(sdk_state, "tunix-sft") == "TUNIX"
    (target,) = sdk_state.list_targets("tunix-sft")
    assert target.framework == "tunix"
    # A later `runs create` of the same run, which names no orchestrator, keeps it.
    assert main(["runs", "create", "tunix-sft", "--home", str(sdk_home)]) == 0
    assert stored(sdk_state, "tunix-sft") == "TUNIX"
    capsys.readouterr()
    assert main(["runs", "describe", "tunix-sft", "--home", str(sdk_home)]) == 0
    assert "rl orchestrator: TUNIX" in capsys.readouterr().out
