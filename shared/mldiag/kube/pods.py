"""A pod object read once into what mldiag needs of it, and the labels that select it.

A pod is selected by the label naming its run, `mldiag.dev/run=<run>`. The product's opt-in
label, `managed-mldiagnostics-gke=true` (on the workload or its namespace, as ML Diagnostics'
GKE guide has it), is accepted too: such a pod's run is its JobSet's name, else its Job's.

Its host name is stable across restarts, built from what JobSet and an Indexed Job put on
each pod, never the pod's random suffix:

| workload | host name | process index |
|---|---|---|
| JobSet | `<jobset>-<rjob>-<job index>-<completion index>` | job index x parallelism + c. index |
| Indexed Job | `<job>-<completion index>` | completion index |

(`<rjob>`: the replicated job's name; parallelism: the pods of each of its Jobs.)

The profiler port is 9999 (the product's connection-operator's port), or the one named in
the pod's `mldiag.dev/profiler-port` annotation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RUN_LABEL = "mldiag.dev/run"
PRODUCT_LABEL = "managed-mldiagnostics-gke"
PORT_ANNOTATION = "mldiag.dev/profiler-port"
DEFAULT_PORT = 9999
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOB_NAME = "batch.kubernetes.io/job-name"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
REPLICATED_JOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
ENDED_PHASES = ("Succeeded", "Failed")
# The address of a job's host that has no pod to capture (kube-discover records it with the
# reason in `last_error`): the egress policy never connects to it.
NOWHERE = "0.0.0.0"


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, str)}


def _index(text: str) -> int | None:
    return int(text) if re.fullmatch(r"\d{1,9}", text or "") else None


def _segment(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", text).strip("-.")


@dataclass(frozen=True)
class Pod:
    """What discovery and the webhook read of one pod object (the API's JSON, as a dict)."""

    namespace: str
    name: str
    uid: str
    labels: dict[str, str]
    annotations: dict[str, str]
    ip: str
    phase: str
    deleting: bool
    resource_version: str

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Pod:
        """The view of a pod object; missing parts read as empty."""
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
        status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
        assert isinstance(meta, Mapping) and isinstance(status, Mapping)
        return cls(namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""),
                   uid=str(meta.get("uid") or ""), labels=_str_map(meta.get("labels")),
                   annotations=_str_map(meta.get("annotations")),
                   ip=str(status.get("podIP") or ""), phase=str(status.get("phase") or ""),
                   deleting=bool(meta.get("deletionTimestamp")),
                   resource_version=str(meta.get("resourceVersion") or ""))

    @property
    def ref(self) -> str:
        """`namespace/name`, as a log line names the pod."""
        return f"{self.namespace}/{self.name}"

    @property
    def run(self) -> str:
        """The run this pod's label names ('' when it names none)."""
        if self.labels.get(RUN_LABEL):
            return self.labels[RUN_LABEL]
        if self.labels.get(PRODUCT_LABEL) == "true":
            return self.labels.get(JOBSET_NAME) or self.job
        return ""

    @property
    def job(self) -> str:
        """The pod's Job (a JobSet makes one Job per replica)."""
        return self.labels.get(JOB_NAME) or self.labels.get("job-name", "")

    @property
    def completion_index(self) -> int | None:
        text = self.labels.get(COMPLETION_INDEX) or self.annotations.get(COMPLETION_INDEX, "")
        return _index(text)

    @property
    def job_index(self) -> int:
        """The Job's index in its replicated job (0 for a plain Job)."""
        return _index(self.labels.get(JOB_INDEX, "")) or 0

    @property
    def replicas(self) -> int:
        """How many Jobs its replicated job has (1 for a plain Job)."""
        text = self.annotations.get(REPLICATED_JOB_REPLICAS) or self.labels.get(
            REPLICATED_JOB_REPLICAS, "")
        return _index(text) or 1

    @property
    def ended(self) -> bool:
        """Whether the pod will run no more (finished, failed, or being deleted)."""
        return self.phase in ENDED_PHASES or self.deleting

    def port(self) -> int | None:
        """The profiler port: the annotation's, else 9999; None when the annotation is not a
        port."""
        text = self.annotations.get(PORT_ANNOTATION)
        if text is None:
            return DEFAULT_PORT
        value = _index(text.strip())
        return value if value is not None and 1 <= value <= 65535 else None

    def host_name(self) -> str:
        """The stable host name (see the module's table); '' without a completion index."""
        index = self.completion_index
        if index is None:
            return ""
        jobset = self.labels.get(JOBSET_NAME, "")
        if jobset:
            rjob = self.labels.get(REPLICATED_JOB, "")
            return _segment(f"{jobset}-{rjob}-{self.job_index}-{index}")
        return _segment(f"{self.job or self.name}-{index}")


def host_names(pod: Pod, per_job: int) -> list[str]:
    """Every host name of the pod's workload: each Job of its replicated job, `per_job` pods
    each (the Job's parallelism)."""
    jobset = pod.labels.get(JOBSET_NAME, "")
    if jobset:
        rjob = pod.labels.get(REPLICATED_JOB, "")
        return [_segment(f"{jobset}-{rjob}-{j}-{i}")
                for j in range(pod.replicas) for i in range(per_job)]
    return [_segment(f"{pod.job or pod.name}-{i}") for i in range(per_job)]


def process_index(pod: Pod, per_job: int) -> int:
    """The pod's process index in the whole workload (a JAX multi-slice job numbers its
    processes across the slices' Jobs)."""
    return pod.job_index * max(per_job, 1) + (pod.completion_index or 0)
