"""CloudRunJobRunner: starts the collect Cloud Run job on one message (google-cloud-run)."""

from __future__ import annotations

from typing import Any

from mldiag.messages import Message


class CloudRunJobRunner:
    """Runs `projects/P/locations/L/jobs/J` with the message in MLDIAG_JOB_MESSAGE.

    Starting an execution is all the stage waits for: the job reports through the pipeline's
    own state and messages. Accepts an injected `client` (a `run_v2.JobsClient`).
    """

    def __init__(self, project: str, location: str, job: str, client: Any = None) -> None:
        self.name = job if job.startswith("projects/") else (
            f"projects/{project}/locations/{location}/jobs/{job}")
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            from google.cloud import run_v2

            self._client = run_v2.JobsClient()
        return self._client

    def run(self, message: Message) -> str:
        from google.cloud import run_v2

        request = run_v2.RunJobRequest(
            name=self.name,
            overrides=run_v2.RunJobRequest.Overrides(container_overrides=[
                run_v2.RunJobRequest.Overrides.ContainerOverride(env=[
                    run_v2.EnvVar(name="MLDIAG_JOB_MESSAGE", value=message.to_json())])]))
        operation = self.client.run_job(request=request)
        # The long-running operation's name identifies the execution being started.
        return str(getattr(operation, "operation", operation).name)
