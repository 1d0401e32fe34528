"""Pods of a labelled JobSet or Job become push targets of their run, and stop being ones,
with no manual step (`mldiag kube-discover`): the part of ML Diagnostics' GKE
connection-operator that finds the workload's profiler servers.

For each granted namespace it lists the run's pods (label `mldiag.dev/run=<run>`, see
`mldiag.kube.pods`) and watches them from the list's resourceVersion, with bookmarks; an
expired watch (410 Gone), a stream that breaks mid-event or a dropped connection lists
again. After every change it works out, from every pod it knows, what each host of the
workload should be, and writes only what changed:

- a running pod with an IP: a push target at `podIP:port`, registered with
  `register_push_target`, so it passes the same egress policy and the same checks as
  `mldiag profiler-target create` (an unknown run is refused; a host name an SDK target
  holds is not taken); its process index from its completion index;
- every other host the workload has (its Jobs' parallelism times its replicated job's
  replicas): a record at `0.0.0.0` (which the egress policy never connects to), down, whose
  `last_error` says why: no pod yet, no IP yet, or its pod ended. These are the session's
  expected hosts too: an on-demand capture names every target, and the capture stage fails
  such a host with that reason (`stages.capture`). A restarted pod of the same index takes
  the host over at its new address.

What belongs to no host (a namespace the API server refuses, a pod without a completion
index or with a bad port annotation, another run's pod, a second pod claiming an index) is
logged once and kept in the run's `configs["kubernetes"]`, which `mldiag targets list` shows.
Pods of namespaces it was not granted are never registered.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mldiag.bootstrap import ControlPlane
from mldiag.capture.requests import register_push_target
from mldiag.errors import MldiagError
from mldiag.kube.pods import NOWHERE, RUN_LABEL, Pod, host_names, process_index
from mldiag.model import TargetRecord

log = logging.getLogger("mldiag.kube")

__all__ = ["NOWHERE", "Discoverer", "Want", "connect", "selector"]

STATUS_KEY = "kubernetes"
GONE = 410


@dataclass(frozen=True)
class Want:
    """What one host of the workload should be: an address to capture, or why not."""

    address: str
    port: int
    process_index: int
    why: str = ""
    pod: str = ""


@dataclass
class _Namespace:
    pods: dict[str, Pod] = field(default_factory=dict)  # uid -> pod
    problem: str = ""
    resource_version: str = ""


def selector(run: str) -> str:
    """The label selector of a run's pods."""
    return f"{RUN_LABEL}={run}"


class Discoverer:
    """Keeps the run's targets equal to its pods in `namespaces` (see the module).

    `api` is a `kubernetes.client.ApiClient` (in-cluster, a kubeconfig, or a test's fake
    server); `label_selector` defaults to `mldiag.dev/run=<run>`."""

    def __init__(self, plane: ControlPlane, run: str, namespaces: Sequence[str], api: Any, *,
                 label_selector: str = "", watch_timeout_s: int = 60, retry_s: float = 30.0,
                 heartbeat: str = "", clock: Callable[[], float] = time.time) -> None:
        from kubernetes import client

        if not namespaces:
            raise MldiagError("kube-discover needs at least one --namespace to watch")
        self.plane, self.run, self.clock = plane, run, clock
        self.label_selector = label_selector or selector(run)
        self.watch_timeout_s, self.retry_s = watch_timeout_s, retry_s
        # A file touched after every answered list and every watch that ended in time: its
        # age is the liveness probe's (deploy/gke/discover.yaml).
        self.heartbeat = Path(heartbeat) if heartbeat else None
        self.core, self.batch = client.CoreV1Api(api), client.BatchV1Api(api)
        self.namespaces = {ns: _Namespace() for ns in dict.fromkeys(namespaces)}
        self._jobs: dict[tuple[str, str], int] = {}
        self._applied: dict[str, Want] = {}
        self._problems: dict[str, str] = {}
        self._published: Any = None
        self._ended: dict[str, str] = {}  # host -> why its last pod is gone
        self._logged: set[str] = set()
        self._lock = threading.RLock()
        self.stopping = threading.Event()

    # The list/watch loop

    def list_pods(self, namespace: str) -> bool:
        """List the namespace's pods of the run and reconcile; False when the API server
        refuses (recorded on the run)."""
        from kubernetes.client.rest import ApiException

        state = self.namespaces[namespace]
        try:
            # The raw JSON: the typed view reads it (no model round trip).
            resp: Any = self.core.list_namespaced_pod(
                namespace, label_selector=self.label_selector, _preload_content=False)
            body = json.loads(resp.data)
        except ApiException as e:
            why = (f"namespace {namespace}: the API server refused to list pods ({e.status} "
                   f"{e.reason}): grant this discoverer get/list/watch on pods there")
            with self._lock:
                if state.problem != why:
                    log.warning("%s", why)
                state.problem = why
                self._reconcile()
            return False
        items = body.get("items") if isinstance(body, dict) else None
        with self._lock:
            state.problem = ""
            state.pods = {}
            for obj in items if isinstance(items, list) else []:
                pod = self._admit(namespace, obj)
                if pod is not None:
                    state.pods[pod.uid] = pod
            state.resource_version = str((body.get("metadata") or {}).get("resourceVersion")
                                         or "")
            self._reconcile()
        return True

    def watch_pods(self, namespace: str) -> str:
        """Follow the namespace's pods from its resourceVersion until the watch ends; why
        it must list again ('' when the watch merely timed out)."""
        from kubernetes import watch
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        state = self.namespaces[namespace]
        w = watch.Watch()
        try:
            for event in w.stream(self.core.list_namespaced_pod, namespace,
                                  label_selector=self.label_selector,
                                  resource_version=state.resource_version,
                                  allow_watch_bookmarks=True,
                                  timeout_seconds=self.watch_timeout_s):
                if event is None:
                    # The client yields None for a line that is not JSON: a cut stream.
                    return f"the watch of {namespace} broke mid-event"
                self.on_event(namespace, event.get("type", ""), event.get("raw_object"))
                if self.stopping.is_set():
                    w.stop()
        except ApiException as e:
            if e.status == GONE:
                return f"the watch of {namespace} expired (410 Gone)"
            return f"the watch of {namespace} failed ({e.status} {e.reason})"
        except (HTTPError, OSError, ValueError) as e:
            return f"the watch of {namespace} broke: {e}"
        return ""

    def on_event(self, namespace: str, kind: str, obj: Any) -> None:
        """One watch event: ADDED, MODIFIED, DELETED or BOOKMARK."""
        if not isinstance(obj, Mapping):
            return
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        with self._lock:
            state = self.namespaces[namespace]
            if kind == "BOOKMARK":
                state.resource_version = rv or state.resource_version
                return
            pod = self._admit(namespace, obj)
            if pod is None:
                self._publish()
                return
            state.resource_version = rv or state.resource_version
            if kind == "DELETED":
                state.pods.pop(pod.uid, None)
                self._note_gone(pod, "deleted")
            else:
                state.pods[pod.uid] = pod
            self._reconcile()

    def follow(self, namespace: str) -> None:
        """List, then watch, and list again whenever the watch cannot go on, until
        `stopping` is set."""
        listed = False
        while not self.stopping.is_set():
            try:
                if not listed:
                    listed = self.list_pods(namespace)
                    self._beat()  # answered, if only with a refusal
                    if not listed:
                        self.stopping.wait(self.retry_s)
                        continue
                why = self.watch_pods(namespace)
                self._beat()
            except Exception:
                # A transient failure (the state store, the API server's answer): this
                # namespace's loop must outlive it, or discovery would stop unseen.
                log.exception("discovery in %s failed; listing again in %g s", namespace,
                              self.retry_s)
                listed = False
                self.stopping.wait(self.retry_s)
                continue
            if why and not self.stopping.is_set():
                log.warning("%s: listing again", why)
                listed = False

    def _beat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.touch()

    def stop(self, grace_s: float = 30.0) -> bool:
        """Stop following, and wait (at most `grace_s`) for a registration in flight: its
        one check is a gRPC call, which the interpreter's exit must not cut. Whether it
        is done. The namespaces' threads may still wait on the API server's watch."""
        self.stopping.set()
        if not self._lock.acquire(timeout=grace_s):
            return False
        self._lock.release()
        return True

    def run_forever(self) -> list[threading.Thread]:
        """Follow every namespace in a thread of its own; set `stopping` to end them."""
        threads = [threading.Thread(target=self.follow, args=(ns,), daemon=True,
                                    name=f"kube-discover-{ns}") for ns in self.namespaces]
        for t in threads:
            t.start()
        return threads

    # Deciding

    def _admit(self, namespace: str, obj: Mapping[str, Any]) -> Pod | None:
        pod = Pod.from_object(obj)
        if pod.namespace != namespace or namespace not in self.namespaces:
            self._problem(f"ns:{pod.namespace}", f"pod {pod.ref} is in a namespace this "
                          "discoverer was not granted: not registered")
            return None
        if not pod.uid or not pod.name:
            return None
        return pod

    def _problem(self, key: str, why: str) -> None:
        if self._problems.get(key) != why:
            log.warning("%s", why)
        self._problems[key] = why

    def _note_gone(self, pod: Pod, how: str) -> None:
        host = pod.host_name()
        if host and pod.run == self.run:
            self._ended[host] = f"gone: pod {pod.ref} {how}"

    def _per_job(self, pod: Pod) -> int:
        """The pods each of the workload's Jobs runs (its parallelism)."""
        from kubernetes.client.rest import ApiException

        key = (pod.namespace, pod.job)
        if key not in self._jobs and pod.job:
            try:
                resp: Any = self.batch.read_namespaced_job(pod.job, pod.namespace,
                                                           _preload_content=False)
                spec = json.loads(resp.data).get("spec") or {}
                value = spec.get("parallelism", 1)
                self._jobs[key] = value if isinstance(value, int) and value > 0 else 1
            except ApiException as e:
                self._problem(f"job:{pod.namespace}/{pod.job}", (
                    f"job {pod.namespace}/{pod.job}: cannot read its parallelism ({e.status} "
                    f"{e.reason}): the expected hosts are the pods seen"))
        seen = 1 + max((p.completion_index or 0) for ns in self.namespaces.values()
                       for p in ns.pods.values() if (p.namespace, p.job) == key)
        return max(self._jobs.get(key, 0), seen)

    def desired(self) -> dict[str, Want]:
        """What every host of the run's workloads should be, from the pods known now."""
        problems: dict[str, str] = {}
        by_host: dict[str, list[Pod]] = {}
        wants: dict[str, Want] = {}
        for state in self.namespaces.values():
            for pod in sorted(state.pods.values(), key=lambda p: p.name):
                if pod.run != self.run:
                    problems[f"pod:{pod.uid}"] = (
                        f"pod {pod.ref} is labelled for run {pod.run or '(none)'!r}, not "
                        f"{self.run!r}: not registered")
                    continue
                host = pod.host_name()
                if not host:
                    problems[f"pod:{pod.uid}"] = (
                        f"pod {pod.ref} has no batch.kubernetes.io/job-completion-index: "
                        "only Indexed Jobs and JobSets get stable host names; not registered")
                    continue
                if pod.port() is None:
                    problems[f"pod:{pod.uid}"] = (
                        f"pod {pod.ref}: annotation mldiag.dev/profiler-port="
                        f"{pod.annotations.get('mldiag.dev/profiler-port')!r} is not a port; "
                        "not registered")
                    continue
                per_job = self._per_job(pod)
                for i, name in enumerate(host_names(pod, per_job)):
                    held = self._applied.get(name)
                    wants.setdefault(name, Want(NOWHERE, held.port if held else pod.port() or 0,
                                                i, "no pod yet"))
                by_host.setdefault(host, []).append(pod)
                wants[host] = replace(wants[host], process_index=process_index(pod, per_job))
        for host, pods in by_host.items():
            live = [p for p in pods if not p.ended]
            held = self._applied.get(host)
            live.sort(key=lambda p: (held is None or p.name != held.pod, p.name))
            for extra in live[1:]:
                problems[f"pod:{extra.uid}"] = (
                    f"pod {extra.ref} has completion index {extra.completion_index}, which "
                    f"pod {live[0].name} holds as {host} (duplicate): not registered")
            base = wants.get(host) or Want(NOWHERE, 0, 0)
            if not live:
                ended = pods[-1]
                how = ended.phase or "deleting"
                wants[host] = replace(base, address=NOWHERE, port=ended.port() or 0,
                                      why=f"gone: pod {ended.ref} ended ({how})",
                                      pod=ended.name)
                continue
            pod = live[0]
            if not pod.ip:
                wants[host] = replace(base, address=NOWHERE, port=pod.port() or 0,
                                      why=f"pod {pod.ref} has no IP yet ({pod.phase or 'Pending'})",
                                      pod=pod.name)
                continue
            wants[host] = replace(base, address=pod.ip, port=pod.port() or 0, why="",
                                  pod=pod.name)
        for host, held in self._applied.items():
            # A host of a workload whose pods are all gone from the list.
            wants.setdefault(host, replace(held, address=NOWHERE, why="no pod any more"))
        for host, want in wants.items():
            if want.why in ("no pod yet", "no pod any more") and host in self._ended:
                wants[host] = replace(want, why=self._ended[host])
        self._problems = {k: v for k, v in self._problems.items()
                          if not k.startswith("pod:")} | problems
        for key, why in problems.items():
            if key not in self._logged:
                log.warning("%s", why)
        self._logged = set(problems)
        return wants

    # Writing

    def _reconcile(self) -> None:
        if self.stopping.is_set():
            return  # stopping: write nothing more (`stop` waits for a write in flight)
        wants = self.desired()
        for host, want in sorted(wants.items()):
            if self._applied.get(host) != want:
                self._apply(host, want)
        self._publish()

    def _apply(self, host: str, want: Want) -> None:
        state = self.plane.state
        if want.why:
            existing = [t for t in state.list_targets(self.run) if t.host == host]
            if any(t.pulls for t in existing):
                self._problems[f"host:{host}"] = (f"host {host} is an SDK target of run "
                                                  f"{self.run}: discovery leaves it alone")
                self._applied[host] = want
                return
            for t in existing:
                if t.port != want.port:
                    state.delete_target(self.run, host, t.port)
            state.upsert_target(TargetRecord(
                run=self.run, host=host, port=want.port or 9999, address=NOWHERE,
                process_index=want.process_index, registered_at=self.clock(),
                last_error=want.why))
            log.info("host %s of run %s: %s", host, self.run, want.why)
            self._applied[host] = want
            return
        try:
            register_push_target(self.plane, self.run, f"{want.address}:{want.port}",
                                 host_name=host, process_index=want.process_index)
        except MldiagError as e:
            why = f"pod {want.pod}: {e}"
            log.warning("host %s of run %s not registered: %s", host, self.run, why)
            self._apply(host, replace(want, why=why))
            self._applied[host] = want  # tried: not again until the pod changes
            return
        self._problems.pop(f"host:{host}", None)
        self._ended.pop(host, None)
        log.info("host %s of run %s: registered at %s:%d (pod %s)", host, self.run,
                 want.address, want.port, want.pod)
        self._applied[host] = want

    def status(self) -> dict[str, Any]:
        """What `targets list` shows of discovery: namespaces, hosts and problems."""
        return {
            "label_selector": self.label_selector,
            "namespaces": {ns: "not listed (refused: see below)" if s.problem else "watching"
                           for ns, s in self.namespaces.items()},
            "hosts": len(self._applied),
            "problems": sorted(set(self._problems.values())
                               | {s.problem for s in self.namespaces.values() if s.problem}),
        }

    def _publish(self) -> None:
        status = self.status()
        if status == self._published:
            return
        run = self.plane.state.get_run(self.run)
        if run is None:
            return
        configs = dict(run.configs)
        configs[STATUS_KEY] = {**status, "updated_at": self.clock()}
        self.plane.state.register_run(replace(run, configs=configs))
        self._published = status


def connect(kubeconfig: str = "", context: str = "", server: str = "") -> Any:
    """An ApiClient: in the cluster (its service account), else a kubeconfig, else `server`
    (plain HTTP, for a local fake API server or `kubectl proxy`)."""
    import os

    from kubernetes import client, config

    if server:
        conf = client.Configuration()
        conf.host = server
        return client.ApiClient(conf)
    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        return client.ApiClient()
    return config.new_client_from_config(config_file=kubeconfig or None,
                                         context=context or None)

