"""The collect job: `python -m mldiag.job`, the entrypoint of the Cloud Run job (and of its
local stand-in, a separate process) that runs a session too large for the collect function.

It reads the stage's message from `MLDIAG_JOB_MESSAGE`, builds the same services as the
functions (from the same settings, with `MLDIAG_IN_JOB=1` so it never hands the session on
again) and runs the same stage code: claims, state transitions and the messages it publishes
are the pipeline's own. Exit status 0 when the message is handled (a bad session is recorded
FAILED), 1 on a transient error, so Cloud Run retries the task.

A job of several tasks (Cloud Run's `CLOUD_RUN_TASK_INDEX` and `CLOUD_RUN_TASK_COUNT`; the
local runner sets the same) shares a large host's time windows: task 0 runs the stage, the
others `stages.collect_windows`, their share of the windows
(analysis/collection/hosts/window_tasks).
A viewer prebuild's windowed hosts are shared the same way: the others run
`stages.prebuild_viewer_share` (`viewer_prebuild`'s notes).
"""

from __future__ import annotations

import logging
import os
import sys

from mldiag.errors import PoisonMessage
from mldiag.messages import AnalyzeSession, PrebuildViewer, parse
from mldiag.settings import Settings


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    raw = os.environ.get("MLDIAG_JOB_MESSAGE", "")
    try:
        message = parse(raw)
    except PoisonMessage as e:
        print(f"mldiag job: bad MLDIAG_JOB_MESSAGE: {e}", file=sys.stderr)
        return 2
    try:
        task = int(os.environ.get("CLOUD_RUN_TASK_INDEX") or 0)
        tasks = int(os.environ.get("CLOUD_RUN_TASK_COUNT") or 0) or None
    except ValueError as e:
        print(f"mldiag job: bad CLOUD_RUN_TASK_INDEX or CLOUD_RUN_TASK_COUNT: {e}",
              file=sys.stderr)
        return 2
    settings = Settings.from_env(in_job=True, job_task=task, collect_job_tasks=tasks)
    from mldiag import stages

    if settings.backend == "gcp":
        from mldiag.bootstrap import gcp_services

        services = gcp_services(settings)
    else:
        from mldiag.bootstrap import bootstrap

        # The local runtime's bus keeps its queue in state.db: what this process publishes is
        # delivered by the `mldiag up` that started it. No worker thread runs here.
        services = bootstrap(settings).services
    try:
        if settings.job_task > 0:
            if isinstance(message, PrebuildViewer):
                stages.prebuild_viewer_share(message, services)
                return 0
            if not isinstance(message, AnalyzeSession):
                print(f"mldiag job task {task}: nothing to share in {type(message).__name__}",
                      file=sys.stderr)
                return 0
            stages.collect_windows(message, services)
        else:
            stages.handle(message, services)
    except PoisonMessage as e:
        print(f"mldiag job: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a transient error: exit non-zero, to be retried
        logging.exception("mldiag job failed: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
