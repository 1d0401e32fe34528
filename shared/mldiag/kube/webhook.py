"""A mutating admission webhook (AdmissionReview v1, over TLS) that gives labelled pods the
SDK's settings: the part of ML Diagnostics' GKE injection-webhook that mldiag needs.

A pod selected by `mldiag.dev/run=<run>` (or the product's `managed-mldiagnostics-gke=true`,
on the pod or its namespace: the run is then its JobSet's or Job's name) gets, in each of its
containers, unless the container sets them itself:

| variable | value |
|---|---|
| `MLDIAG_RUN` | the run's name, for `machinelearning_run(name=os.environ["MLDIAG_RUN"])` |
| `MLDIAG_HOST_NAME` | the stable host name of `mldiag.kube.pods` (from the completion index) |
| `MLDIAG_REGISTRATION_URL` | the `register` function's URL (`--registration-url`) |
| `MLDIAG_BACKEND` | `gcp`, with a registration URL |

The webhook never refuses a pod: every answer is `allowed`, a pod it cannot name a run for
passes unchanged with a warning, and the configuration's `failurePolicy: Ignore` lets pods
through while the webhook is down (docs/deploy-gke.md).
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from mldiag.errors import MldiagError
from mldiag.kube.pods import JOBSET_NAME, Pod

log = logging.getLogger("mldiag.kube")
MAX_BODY = 4 * 1024 * 1024  # an AdmissionReview of a pod is a few KiB; the API server caps 3 MiB


class BadReview(MldiagError):
    """The request is not an AdmissionReview v1 of a pod. Permanent: answered 400."""


@dataclass(frozen=True)
class Injection:
    """What the webhook adds: the registration URL and the backend it implies."""

    registration_url: str = ""


def env_of(pod: Pod, injection: Injection) -> dict[str, str]:
    """The variables a pod gets ({} when no run can be named for it)."""
    run = pod.run or pod.labels.get(JOBSET_NAME, "") or pod.job
    if not run:
        return {}
    env = {"MLDIAG_RUN": run}
    host = pod.host_name()
    if host:
        env["MLDIAG_HOST_NAME"] = host
    if injection.registration_url:
        env["MLDIAG_REGISTRATION_URL"] = injection.registration_url
        env["MLDIAG_BACKEND"] = "gcp"
    return env


def patch_for(obj: Mapping[str, Any], injection: Injection) -> tuple[list[dict[str, Any]], str]:
    """The JSON patch (RFC 6902) for a pod object, and a warning when there is none."""
    pod = Pod.from_object(obj)
    env = env_of(pod, injection)
    if not env:
        return [], (f"mldiag: pod {pod.name or '(generated)'} names no run (no mldiag.dev/run "
                    "label, JobSet or Job): nothing injected")
    spec = obj.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    if not isinstance(containers, list):
        return [], "mldiag: the pod has no containers: nothing injected"
    ops: list[dict[str, Any]] = []
    for i, container in enumerate(containers):
        if not isinstance(container, Mapping):
            continue
        present = container.get("env")
        names = {e.get("name") for e in present if isinstance(e, Mapping)} \
            if isinstance(present, list) else set()
        new = [{"name": k, "value": v} for k, v in env.items() if k not in names]
        if not new:
            continue
        if not isinstance(present, list):
            ops.append({"op": "add", "path": f"/spec/containers/{i}/env", "value": new})
        else:
            ops += [{"op": "add", "path": f"/spec/containers/{i}/env/-", "value": e}
                    for e in new]
    return ops, ""


def review(body: bytes, injection: Injection) -> dict[str, Any]:
    """The AdmissionReview answer to one request body; BadReview when it is not one."""
    try:
        data = json.loads(body)
    except ValueError as e:
        raise BadReview(f"not JSON: {e}") from e
    if not isinstance(data, dict) or data.get("kind") != "AdmissionReview" or \
            data.get("apiVersion") != "admission.k8s.io/v1":
        raise BadReview("expected an admission.k8s.io/v1 AdmissionReview")
    request = data.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        raise BadReview("the AdmissionReview has no request with a uid")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    obj = request.get("object")
    kind = request.get("kind") if isinstance(request.get("kind"), dict) else {}
    if (kind or {}).get("kind") != "Pod" or not isinstance(obj, dict):
        response["warnings"] = ["mldiag: only pods are mutated"]
    else:
        ops, warning = patch_for(obj, injection)
        if ops:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
        if warning:
            response["warnings"] = [warning]
            log.warning("%s", warning)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": response}


def server(host: str, port: int, cert: str, key: str, injection: Injection
           ) -> ThreadingHTTPServer:
    """An HTTPS server answering `POST /mutate` (not yet serving: `serve_forever()`)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 10  # a client that never finishes its handshake or request lets go

        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, code: int, body: Mapping[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            if self.path == "/healthz":
                self._answer(200, {"ok": True})
            else:
                self._answer(404, {"error": "POST an AdmissionReview to /mutate"})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            if self.path.split("?")[0] != "/mutate":
                self._answer(404, {"error": "POST an AdmissionReview to /mutate"})
                return
            if not 0 < length <= MAX_BODY:
                self._answer(413 if length else 400, {"error": "bad Content-Length"})
                return
            try:
                self._answer(200, review(self.rfile.read(length), injection))
            except BadReview as e:
                log.warning("admission request refused: %s", e)
                self._answer(400, {"error": str(e)})

    httpd = ThreadingHTTPServer((host, port), Handler)
    httpd.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    # The handshake happens in the request's thread (on its first read), so a client that
    # connects and says nothing holds no other request up.
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True,
                                       do_handshake_on_connect=False)
    return httpd


def serve_in_thread(httpd: ThreadingHTTPServer) -> threading.Thread:
    """Serve `httpd` on a daemon thread (tests; the CLI serves in the foreground)."""
    thread = threading.Thread(target=httpd.serve_forever, daemon=True, name="kube-webhook")
    thread.start()
    return thread
