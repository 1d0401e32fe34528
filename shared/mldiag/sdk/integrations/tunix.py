"""Tunix: `MldiagHooks`, a `tunix.sft.hooks.TrainingHooks` for Tunix's trainers.

    from mldiag.sdk import machinelearning_run
    from mldiag.sdk.integrations.tunix import MldiagHooks

    run = machinelearning_run(name="sft-gemma")
    trainer = peft_trainer.PeftTrainer(model, optimizer, config)
    trainer.with_training_hooks(MldiagHooks(profile_steps=range(10, 13)))
    trainer.train(train_ds)

What it does:

- **loss** (`MetricType.LOSS`): Tunix hands each step's loss to `on_train_step_end` as a device
  array. The hook keeps the arrays and fetches them `fetch_every` at a time, in a background
  thread, so the training thread never waits for a value.
- **step time** (`MetricType.STEP_TIME`, also fed to the run's degradation monitor): the host
  interval between two `on_train_step_start` calls. With Tunix's throttler (at most
  `max_inflight_computations` steps in flight) it follows the device's step time, and it
  needs no sync. The first interval holds the compilation and is not recorded.
- **profiles**: `xprof()` opens at the start of the first step of `profile_steps` and closes at
  the start of the step after the last one (or at the end of training), after one wait for
  the model's state, so the device work of the last profiled step is inside the trace.
  Step 0, which compiles, is refused. Tunix's own `jax.profiler.StepTraceAnnotation("train")`
  marks every step in the trace.
- **the run's fields**: `run.rl_orchestrator = RlOrchestrator.TUNIX`, and this process's target
  reads `tunix <version>` as its framework.

Steps are counted from 0 at each `train()` call (Tunix's iterations, with gradient
accumulation each micro-batch is one).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import metadata
from typing import Any

from mldiag.sdk import metrics
from mldiag.sdk.custom_types.exceptions import ProfilingError
from mldiag.sdk.custom_types.mlrun_types import RlOrchestrator
from mldiag.sdk.metric_types import MetricType
from mldiag.sdk.profiler import Xprof
from mldiag.sdk.run import MLRun, current_run

log = logging.getLogger(__name__)

try:
    from tunix.sft.hooks import TrainingHooks
except ImportError as e:
    # Importable without Tunix (docs, type checks); making the hooks says what is missing.
    TrainingHooks = object
    _MISSING = f"MldiagHooks needs google-tunix (pip install google-tunix): {e}"
else:
    _MISSING = ""


class MldiagHooks(TrainingHooks):
    """Records loss and step time into the run, and profiles `profile_steps`.

    `run`: the run (default: the current one, when training starts). `profile_steps`: a
    `range` of steps (from 1: step 0 compiles) to capture as one session, `session_id`
    (default `tunix-steps-<first>-<last>`); None captures nothing. `fetch_every`: how many
    losses are fetched from the device at once.
    """

    def __init__(self, run: MLRun | None = None, *, profile_steps: range | None = None,
                 session_id: str | None = None, fetch_every: int = 16) -> None:
        if _MISSING:
            raise ImportError(_MISSING)
        if profile_steps is not None:
            if profile_steps.step != 1 or len(profile_steps) == 0:
                raise ValueError(f"profile_steps must be a non-empty range of consecutive steps, "
                                 f"not {profile_steps!r}")
            if profile_steps.start < 1:
                raise ValueError("profile_steps cannot include step 0: it compiles the train "
                                 "step, and its trace would be the compiler's, not training's")
        if fetch_every < 1:
            raise ValueError(f"fetch_every must be at least 1, not {fetch_every}")
        self._run = run
        self.profile_steps = profile_steps
        self.session_id = session_id or (
            f"tunix-steps-{profile_steps.start}-{profile_steps[-1]}" if profile_steps else None)
        self.fetch_every = fetch_every
        self.prof: Xprof | None = None
        self._step = 0
        self._last_start: float | None = None
        self._losses: list[tuple[int | None, Any]] = []
        self._fetcher = ThreadPoolExecutor(1, thread_name_prefix="mldiag-tunix-loss")
        self._fetches: list[Future[None]] = []

    @property
    def run(self) -> MLRun:
        run = self._run or current_run()
        if run is None:
            raise ProfilingError("MldiagHooks needs a run: call machinelearning_run(...) "
                                 "before training, or pass run=")
        return run

    # TrainingHooks

    def on_train_start(self, train_ctx: Any) -> None:
        run = self.run
        self._step, self._last_start = 0, None
        run.set_rl_orchestrator(RlOrchestrator.TUNIX)
        try:
            version = metadata.version("google-tunix")
        except metadata.PackageNotFoundError:
            version = ""
        framework_version = f"{version} (jax {run.target.framework_version})".strip()
        run.target.framework, run.target.framework_version = "tunix", framework_version
        if not run.metric_only_run:
            try:
                run.plane.state.update_target(run.name, run.host, run.target.port,
                                              framework="tunix",
                                              framework_version=framework_version)
            except Exception as e:  # noqa: BLE001 - a label must not stop training
                log.warning("mldiag: could not label target %s as tunix: %s", run.host, e)

    def on_train_step_start(self, train_ctx: Any) -> None:
        now = time.perf_counter()
        step = self._step
        if self._last_start is not None and step >= 2:
            # The interval of step-1; that of step 0 (the compile) is not a step time.
            metrics.record(MetricType.STEP_TIME, now - self._last_start, step=step - 1)
        self._last_start = now
        steps = self.profile_steps
        if steps is not None:
            if self.prof is not None and step == steps.stop:
                self._close(train_ctx)
            if step == steps.start:
                self.prof = Xprof(self.run, session_id=self.session_id)
                self.prof.start()
        self._step = step + 1

    def on_train_step_end(self, train_ctx: Any, train_step: int, train_loss: Any) -> None:
        if train_loss is None:
            return
        self._losses.append((train_step, train_loss))
        if len(self._losses) >= self.fetch_every:
            self._fetch()

    def on_train_end(self, train_ctx: Any) -> None:
        if self.prof is not None:
            self._close(train_ctx)
        self._fetch()
        self.wait()

    def on_eval_step_start(self, train_ctx: Any) -> None:
        pass

    def on_eval_step_end(self, train_ctx: Any, eval_loss: Any) -> None:
        pass

    # Helpers

    def wait(self, timeout: float | None = 60.0) -> None:
        """Wait until every loss handed over so far is recorded (raises a fetch's error)."""
        pending, self._fetches = self._fetches, []
        for f in pending:
            f.result(timeout=timeout)

    def _fetch(self) -> None:
        batch, self._losses = self._losses, []
        if batch:
            self._fetches = [f for f in self._fetches if not f.done()] + [
                self._fetcher.submit(_record_losses, batch)]

    def _close(self, train_ctx: Any) -> None:
        prof, self.prof = self.prof, None
        assert prof is not None
        _wait_for_model(train_ctx)
        prof.stop()


def _record_losses(batch: list[tuple[int | None, Any]]) -> None:
    """Fetch a batch of device losses in one transfer and record them (background thread)."""
    import jax

    values = jax.device_get([loss for _, loss in batch])
    metrics.record_metrics([{"metric_name": MetricType.LOSS, "value": value, "step": step}
                            for (step, _), value in zip(batch, values, strict=True)])


def _wait_for_model(train_ctx: Any) -> None:
    """Block until the model's state holds every dispatched step (once per profile)."""
    import jax
    from flax import nnx

    model = getattr(train_ctx, "model", None)
    if model is None:
        return
    jax.block_until_ready(nnx.state(model))
