"""mldiag SDK: register a run, capture profiles, record metrics, from inside the workload.

It mirrors the public API of `google-cloud-mldiagnostics` 1.0.10, so workload code ports by
changing the import (`google_cloud_mldiagnostics` → `mldiag.sdk`, the same for its
submodules `metric_types` and `custom_types.exceptions|metric_types|mlrun_types`)::

    from mldiag.sdk import machinelearning_run, metrics, xprof, metric_types

    run = machinelearning_run(name="my-run", on_demand_xprof=True)
    with xprof(session_id="warm"):
        train_step(...)
    metrics.record(metric_types.MetricType.STEP_TIME, seconds, step=i)

Locally the run lives in `$MLDIAG_HOME` (the embedded bucket and state of `mldiag up`); with
`MLDIAG_BACKEND=gcp` it lives in the project's bucket (`gcs_path`) and Firestore.
"""

from mldiag.sdk import custom_types, metric_types, metrics
from mldiag.sdk.current import current_run
from mldiag.sdk.profiler import Xprof, xprof
from mldiag.sdk.run import MLRun, machinelearning_run

__all__ = ["MLRun", "Xprof", "current_run", "custom_types", "machinelearning_run",
           "metric_types", "metrics", "xprof"]
