"""`mldiag.sdk.integrations.tunix.MldiagHooks` on Tunix's real PeftTrainer, on the CPU, with a
tiny model defined here. Optional: google-tunix is not a dependency (see docs/porting.md for
what installing it costs); without it these tests are skipped with the reason."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.tunix
pytest.importorskip("tunix.sft.peft_trainer",
                    reason="google-tunix is not installed (pip install google-tunix==0.1.7)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from tunix.sft import peft_trainer  # noqa: E402

from mldiag.adapters.local.state import SqliteStateStore  # noqa: E402
from mldiag.sdk import machinelearning_run  # noqa: E402
from mldiag.sdk.custom_types.mlrun_types import RlOrchestrator  # noqa: E402
from mldiag.sdk.integrations import tunix as mldiag_tunix  # noqa: E402
from mldiag.sdk.integrations.tunix import MldiagHooks  # noqa: E402
from mldiag.sdk.metrics import flush_to  # noqa: E402
from mldiag.settings import Settings  # noqa: E402


class Tiny(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.l1 = nnx.Linear(16, 32, rngs=rngs)
        self.l2 = nnx.Linear(32, 1, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.l2(nnx.relu(self.l1(x)))


def mse(model: Tiny, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


def batches(n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"x": rng.normal(size=(8, 16)).astype(np.float32),
             "y": rng.normal(size=(8, 1)).astype(np.float32)} for _ in range(n)]


def trainer(steps: int, hooks: MldiagHooks) -> peft_trainer.PeftTrainer:
    config = peft_trainer.TrainingConfig(eval_every_n_steps=1000, max_steps=steps,
                                         pbar_description=None)
    t = peft_trainer.PeftTrainer(Tiny(nnx.Rngs(0)), optax.sgd(0.01), config)
    t.with_loss_fn(mse).with_gen_model_input_fn(lambda b: {"x": b["x"], "y": b["y"]})
    t.with_training_hooks(hooks)  # returns None in tunix 0.1.7
    return t


def test_hooks_record_loss_and_step_time_and_profile_the_chosen_steps(
        sdk_home: Path, sdk_state: SqliteStateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    run = machinelearning_run(name="tunix-sft")
    fetched: list[int] = []
    real = mldiag_tunix._record_losses

    def counting(batch: list[tuple[int | None, object]]) -> None:
        fetched.append(len(batch))
        real(batch)

    monkeypatch.setattr(mldiag_tunix, "_record_losses", counting)
    hooks = MldiagHooks(profile_steps=range(3, 5), fetch_every=4)
    trainer(12, hooks).train(batches(12))
    assert hooks.prof is None  # closed after its last step
    # Losses went to the device in batches (Tunix hands them over one step late), not per step.
    assert fetched and max(fetched) == 4 and len(fetched) < 11
    flush_to(run)
    points = sdk_state.list_metrics("tunix-sft")
    losses = [p for p in points if p.name == "loss"]
    step_times = [p for p in points if p.name == "step_time"]
    assert len(losses) == sum(fetched) and all(np.isfinite(p.value) for p in losses)
    # One step time per step after the compile step: steps 1..10 of 12 are timed at 2..11.
    assert sorted(p.step for p in step_times) == list(range(1, 11))
    assert all(0 < p.value < 60 for p in step_times)
    # The chosen steps are one profiled session of the run, uploaded from this process.
    name = hooks.session_id
    assert name == "tunix-steps-3-4"
    deadline = time.monotonic() + 60
    xplane = Settings(home=sdk_home).bucket_dir / "tunix-sft" / "plugins" / "profile" / name
    while not list(xplane.glob("*.xplane.pb")) and time.monotonic() < deadline:
        time.sleep(0.1)
    (trace,) = xplane.glob("*.xplane.pb")
    assert trace.stat().st_size > 0
    session = sdk_state.get_session("tunix-sft", name)
    assert session is not None and session.kind == "programmatic"
    # The run and its target say Tunix.
    assert run.rl_orchestrator is RlOrchestrator.TUNIX
    stored = sdk_state.get_run("tunix-sft")
    assert stored is not None and stored.rl_orchestrator == "TUNIX"
    (target,) = sdk_state.list_targets("tunix-sft")
    assert target.framework == "tunix" and "jax" in target.framework_version


def test_the_compile_step_cannot_be_profiled() -> None:
    with pytest.raises(ValueError, match="step 0"):
        MldiagHooks(profile_steps=range(0, 3))
    with pytest.raises(ValueError, match="consecutive"):
        MldiagHooks(profile_steps=range(2, 8, 2))
