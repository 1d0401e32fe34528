"""LocalProcessJobRunner: the collect job as a separate local process (`python -m mldiag.job`),
the local stand-in for the Cloud Run job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mldiag.messages import Message
from mldiag.settings import Settings


class LocalProcessJobRunner:
    """Starts `python -m mldiag.job` on a message, detached, with the runtime's settings."""

    def __init__(self, settings: Settings, log_dir: Path | None = None) -> None:
        self._settings = settings
        self._log_dir = log_dir

    def run(self, message: Message) -> str:
        """Start the job's tasks (`settings.collect_job_tasks` processes, each with Cloud
        Run's task index and count); returns the first task's name."""
        package_root = str(Path(__file__).resolve().parents[3])
        tasks = max(1, self._settings.collect_job_tasks)
        env = {**os.environ, **self._settings.to_env(),
               "MLDIAG_JOB_MESSAGE": message.to_json(), "MLDIAG_IN_JOB": "1",
               "CLOUD_RUN_TASK_COUNT": str(tasks),
               "PYTHONPATH": os.pathsep.join(
                   [package_root, *filter(None, [os.environ.get("PYTHONPATH")])])}
        log_path = os.devnull
        if self._log_dir is not None:
            self._log_dir.mkdir(parents=True, exist_ok=True)
            log_path = str(self._log_dir / "collect-job.log")
        pids = []
        with open(log_path, "ab") as log:
            for task in range(tasks):
                proc = subprocess.Popen([sys.executable, "-m", "mldiag.job"],
                                        env={**env, "CLOUD_RUN_TASK_INDEX": str(task)},
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                        start_new_session=True)
                pids.append(proc.pid)
        return f"local-process-{pids[0]}" + (f"+{len(pids) - 1}" if len(pids) > 1 else "")
