"""The collect job: `python -m mldiag.job`, the entrypoint of the Cloud Run job (and of its
local stand-in, a separate process) that runs a session too large for the collect function.

It reads the stage's message from `MLDIAG_JOB_MESSAGE`, builds the same services as the
functions (from the same settings, with `MLDIAG_IN_JOB=1` so it never hands the session on
again) and runs the same stage code: claims, state transitions and the messages it publishes
are the pipeline's own. Exit status 0 when the message is handled (a bad session is recorded
FAILED), 1 on a transient error, so Cloud Run retries the task.
"""

from __future__ import annotations

import logging
import os
import sys

from mldiag.errors import PoisonMessage
from mldiag.messages import parse
from mldiag.settings import Settings


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    raw = os.environ.get("MLDIAG_JOB_MESSAGE", "")
    try:
        message = parse(raw)
    except PoisonMessage as e:
        print(f"mldiag job: bad MLDIAG_JOB_MESSAGE: {e}", file=sys.stderr)
        return 2
    settings = Settings.from_env(in_job=True)
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
