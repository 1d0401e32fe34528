"""A fake Kubernetes API server on loopback, real HTTP, for the real `kubernetes` client.

It serves pods and Jobs per namespace as the API server does for these calls:

- `GET /api/v1/namespaces/NS/pods?labelSelector=...`: a PodList with the list's
  resourceVersion;
- the same with `watch=true&resourceVersion=RV`: a chunked stream of JSON lines (ADDED,
  MODIFIED, DELETED, and BOOKMARK when `allowWatchBookmarks=true`) of every change after RV,
  held open until `timeoutSeconds`; an RV older than the last `compact()` gets a 410 Gone
  ERROR event, as etcd compaction gives;
- `GET /apis/batch/v1/namespaces/NS/jobs/NAME`;
- 403 Forbidden (a `Status`) for every request in a namespace `forbid()` names.

Tests change the world with `put` (add or modify), `delete`, `compact`, `bookmark` and
`break_watches` (the next pod event a watch sends is cut in half: `"garble"` sends the half
line, `"drop"` closes the connection in the middle of its chunk).
"""

from __future__ import annotations

import copy
import json
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

RECORDED = Path(__file__).resolve().parent.parent / "events" / "kube"


def recorded(name: str) -> dict[str, Any]:
    """A recorded object of tests/events/kube/ (`jobset_pod`, `job_pod`, `job`)."""
    data: dict[str, Any] = json.loads((RECORDED / f"{name}.json").read_text())
    return data


def _matches(labels: Mapping[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key) != value.lstrip("="):
                return False
        elif labels.get(term) is None:
            return False
    return True


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class FakeKube:
    """The fake API server's world and its HTTP front (see the module)."""

    def __init__(self) -> None:
        self.rv = 1000
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[tuple[int, str, str, dict[str, Any]]] = []
        self.compacted = 0
        self.forbidden: set[str] = set()
        self.cut = ""
        self.epoch = 0
        self.requests: list[str] = []
        self.open_watches = 0
        self.closed = False
        self.cond = threading.Condition()
        self._server: ThreadingHTTPServer | None = None

    # The world

    def _next(self) -> int:
        self.rv += 1
        return self.rv

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Add or change a pod; the stored copy, with its new resourceVersion."""
        pod = copy.deepcopy(dict(obj))
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        with self.cond:
            kind = "MODIFIED" if key in self.pods else "ADDED"
            meta["resourceVersion"] = str(self._next())
            self.pods[key] = pod
            self.events.append((self.rv, key[0], kind, copy.deepcopy(pod)))
            self.cond.notify_all()
        return pod

    def delete(self, namespace: str, name: str) -> None:
        with self.cond:
            pod = self.pods.pop((namespace, name))
            pod["metadata"]["resourceVersion"] = str(self._next())
            self.events.append((self.rv, namespace, "DELETED", copy.deepcopy(pod)))
            self.cond.notify_all()

    def put_job(self, obj: Mapping[str, Any]) -> None:
        with self.cond:
            job = copy.deepcopy(dict(obj))
            self.jobs[(job["metadata"]["namespace"], job["metadata"]["name"])] = job

    def compact(self) -> None:
        """Forget the history and end the open watches: a watch from an older
        resourceVersion gets 410 Gone."""
        with self.cond:
            self.compacted = self._next()
            self.epoch += 1
            self.events.clear()
            self.cond.notify_all()

    def bookmark(self) -> None:
        """Move the resourceVersion on (another object changed) and send open watches a
        BOOKMARK with it."""
        with self.cond:
            self.events.append((self._next(), "", "BOOKMARK", {}))
            self.cond.notify_all()

    def break_watches(self, how: str = "garble") -> None:
        """Cut the next pod event a watch sends in half (`garble` or `drop`)."""
        with self.cond:
            self.cut = how
            self.cond.notify_all()

    def forbid(self, namespace: str) -> None:
        with self.cond:
            self.forbidden.add(namespace)

    # HTTP

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @contextmanager
    def serving(self) -> Iterator[FakeKube]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                fake.handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            with self.cond:
                self.closed = True
                self.cond.notify_all()
            self._server.shutdown()
            self._server.server_close()
            thread.join(5)

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urlparse(h.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.requests.append(h.path)
        pods = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", url.path)
        job = re.fullmatch(r"/apis/batch/v1/namespaces/([^/]+)/jobs/([^/]+)", url.path)
        namespace = (pods or job).group(1) if (pods or job) else ""
        if namespace in self.forbidden:
            resource = "pods" if pods else "jobs.batch"
            self._json(h, 403, _status(403, "Forbidden", (
                f'{resource} is forbidden: User "system:serviceaccount:mldiag:discover" '
                f'cannot list resource "{resource}" in API group "" in the namespace '
                f'"{namespace}"')))
        elif job:
            found = self.jobs.get((job.group(1), job.group(2)))
            if found is None:
                self._json(h, 404, _status(404, "NotFound",
                                           f'jobs.batch "{job.group(2)}" not found'))
            else:
                self._json(h, 200, found)
        elif pods and query.get("watch") == "true":
            self._watch(h, namespace, query)
        elif pods:
            selector = query.get("labelSelector", "")
            with self.cond:
                items = [copy.deepcopy(p) for (ns, _), p in sorted(self.pods.items())
                         if ns == namespace
                         and _matches(p["metadata"].get("labels") or {}, selector)]
                rv = self.rv
            self._json(h, 200, {"kind": "PodList", "apiVersion": "v1",
                                "metadata": {"resourceVersion": str(rv)}, "items": items})
        else:
            self._json(h, 404, _status(404, "NotFound", f"no route {url.path}"))

    @staticmethod
    def _json(h: BaseHTTPRequestHandler, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    @staticmethod
    def _chunk(h: BaseHTTPRequestHandler, data: bytes) -> None:
        h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        h.wfile.flush()

    def _watch(self, h: BaseHTTPRequestHandler, namespace: str, query: dict[str, str]) -> None:
        selector = query.get("labelSelector", "")
        bookmarks = query.get("allowWatchBookmarks") == "true"
        since = int(query.get("resourceVersion") or 0)
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 30)
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        with self.cond:
            self.open_watches += 1
            epoch = self.epoch
            self.cond.notify_all()
        try:
            if since and since < self.compacted:  # (the ERROR event etcd's compaction gives)
                gone = _status(410, "Expired", f"too old resource version: {since} "
                               f"({self.compacted})")
                self._chunk(h, json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                self._chunk(h, b"")
                return
            while True:
                with self.cond:
                    if epoch != self.epoch:
                        break  # compacted: this watch ends, the client's next one is too old
                    pending = [e for e in self.events if e[0] > since]
                    while not pending and not self.closed and epoch == self.epoch:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self.cond.wait(left)
                        pending = [e for e in self.events if e[0] > since]
                    if not pending or epoch != self.epoch:
                        break
                for rv, ns, kind, obj in pending:
                    since = rv
                    if kind == "BOOKMARK":
                        if bookmarks:
                            self._chunk(h, json.dumps({"type": "BOOKMARK", "object": {
                                "kind": "Pod", "apiVersion": "v1",
                                "metadata": {"resourceVersion": str(rv)}}}).encode() + b"\n")
                        continue
                    if ns != namespace or not _matches(obj["metadata"].get("labels") or {},
                                                       selector):
                        continue
                    line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                    with self.cond:
                        cut, self.cut = self.cut, ""
                    if cut:
                        half = line[: len(line) // 2]
                        if cut == "drop":
                            h.wfile.write(f"{len(line):x}\r\n".encode() + half)
                            h.wfile.flush()
                            h.connection.shutdown(socket.SHUT_RDWR)
                            h.close_connection = True
                            return
                        self._chunk(h, half + b"\n")
                        self._chunk(h, b"")
                        return
                    self._chunk(h, line)
            self._chunk(h, b"")
        except (BrokenPipeError, ConnectionResetError):
            h.close_connection = True
        finally:
            with self.cond:
                self.open_watches -= 1
                self.cond.notify_all()


def pod(template: Mapping[str, Any], *, name: str, index: int, ip: str = "",
        phase: str = "Running", run: str | None = None, port: int | None = None,
        namespace: str | None = None, job_index: int | None = None,
        uid: str | None = None) -> dict[str, Any]:
    """A recorded pod made into another pod of the same workload: its name, completion
    index, IP, phase, run label, profiler port annotation and Job index."""
    p = copy.deepcopy(dict(template))
    meta, status = p["metadata"], p.setdefault("status", {})
    meta["name"] = name
    meta["uid"] = uid or f"uid-{name}"
    if namespace is not None:
        meta["namespace"] = namespace
    for group in (meta["labels"], meta.setdefault("annotations", {})):
        group["batch.kubernetes.io/job-completion-index"] = str(index)
        if job_index is not None and "jobset.sigs.k8s.io/job-index" in group:
            group["jobset.sigs.k8s.io/job-index"] = str(job_index)
    if job_index is not None and "jobset.sigs.k8s.io/jobset-name" in meta["labels"]:
        job = f"{meta['labels']['jobset.sigs.k8s.io/jobset-name']}-" \
            f"{meta['labels']['jobset.sigs.k8s.io/replicatedjob-name']}-{job_index}"
        meta["labels"]["batch.kubernetes.io/job-name"] = meta["labels"]["job-name"] = job
    if run is not None:
        meta["labels"]["mldiag.dev/run"] = run
    if port is not None:
        meta["annotations"]["mldiag.dev/profiler-port"] = str(port)
    status["phase"] = phase
    if ip:
        status["podIP"], status["podIPs"] = ip, [{"ip": ip}]
    else:
        status.pop("podIP", None)
        status.pop("podIPs", None)
    return p
