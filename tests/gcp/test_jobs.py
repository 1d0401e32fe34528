"""The collect job on Google Cloud: CloudRunJobRunner starts the Cloud Run job through the
real google-cloud-run client (REST transport) against a local stand-in for run.googleapis.com
that records the request, as the Cloud Run Admin API v2 receives it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from mldiag.adapters.gcp.jobs import CloudRunJobRunner
from mldiag.messages import AnalyzeSession, parse


@pytest.fixture
def fake_run_api() -> Any:
    calls: list[tuple[str, dict[str, Any]]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            calls.append((self.path, body))
            answer = json.dumps({"name": "projects/p/locations/l/operations/op-1",
                                 "done": False}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", calls
    server.shutdown()


def test_the_job_is_run_with_the_message_in_its_environment(fake_run_api: Any) -> None:
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import run_v2

    url, calls = fake_run_api
    client = run_v2.JobsClient(transport="rest", credentials=AnonymousCredentials(),
                               client_options=ClientOptions(api_endpoint=url))
    runner = CloudRunJobRunner("p", "l", "mldiag-collect", client=client)
    msg = AnalyzeSession(run="r", session="s", version=3)
    assert runner.run(msg) == "projects/p/locations/l/operations/op-1"
    ((path, body),) = calls
    assert path.split("?")[0] == "/v2/projects/p/locations/l/jobs/mldiag-collect:run"
    (override,) = body["overrides"]["containerOverrides"]
    env = {e["name"]: e["value"] for e in override["env"]}
    assert parse(env["MLDIAG_JOB_MESSAGE"]) == msg
