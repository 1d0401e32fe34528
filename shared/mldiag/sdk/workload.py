"""What the SDK reads from the workload's environment, as `google_cloud_mldiagnostics` does:
the orchestrator (GKE, Slurm or custom) and its workload details, the host name, and the run
name, sanitised exactly as upstream so that every accepted name is one the pipeline accepts.

Upstream asks the GCE metadata server first (and only then trusts GKE/Slurm variables); mldiag
never calls the metadata server from the workload, so the variables alone decide.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import socket
from collections.abc import Mapping
from typing import Any

from mldiag.model import check_name
from mldiag.sdk.custom_types.exceptions import MLRunConfigurationError
from mldiag.sdk.custom_types.mlrun_types import Orchestrator

log = logging.getLogger(__name__)

_REGION = re.compile(r"[a-z]+(-[a-z]+)*-[a-z]+[0-9]+")
_ZONE = re.compile(r"[a-z]+(-[a-z]+)*-[a-z]+[0-9]+-[a-z]+")
# What the pipeline accepts in a path segment; a session id outside it is rewritten.
_UNSAFE_SEGMENT = re.compile(r"[^A-Za-z0-9._:@+=,-]+")


def sanitize_identifier(identifier: str) -> str:
    """Upstream's run-name rule: lower case, each run of other characters than [a-z0-9]
    becomes one "-", no leading or trailing "-" ("My Run 1" → "my-run-1")."""
    return re.sub(r"[^a-z0-9]+", "-", identifier.lower()).strip("-")


def run_name(name: str) -> str:
    """The run's name in storage and state for the name the user gave; raises
    MLRunConfigurationError when nothing usable is left."""
    sanitized = sanitize_identifier(name)
    if not sanitized:
        raise MLRunConfigurationError(
            f"run name {name!r} has no letter or digit: it would be empty once sanitised to "
            "[a-z0-9-]")
    if len(sanitized) > 255:
        raise MLRunConfigurationError(
            f"run name {name[:40]!r}... is {len(sanitized)} characters once sanitised; "
            "at most 255")
    return check_name("run", sanitized)


def session_name(session_id: str) -> str:
    """A session id the pipeline accepts: runs of characters a storage path segment cannot
    hold become "-" (and a leading symbol is dropped), with a warning when it changes."""
    return safe_segment("session", session_id)


def safe_segment(kind: str, value: str) -> str:
    """`value` as one profile path segment (a session id, a host name): runs of characters
    the pipeline does not accept become "-", a leading symbol is dropped, with a warning when
    it changes; ValueError when nothing is left."""
    safe = _UNSAFE_SEGMENT.sub("-", value).lstrip("._:@+=,-")[:255]
    if not safe:
        raise ValueError(f"{kind} {value!r} has no letter or digit")
    if safe != value:
        log.warning("mldiag: %s %r is stored as %r (profile paths allow [A-Za-z0-9._:@+=,-])",
                    kind, value, safe)
    return check_name(kind, safe)


def validate_region(region: str) -> str:
    """Upstream's region check: `us-central1`, not a zone or anything else."""
    if _REGION.fullmatch(region):
        return region
    if _ZONE.fullmatch(region):
        raise MLRunConfigurationError(
            f"Invalid region {region!r}. Expected a region format like 'us-central1', but "
            "received a zone. Please provide a valid region.")
    raise MLRunConfigurationError(
        f"Invalid region {region!r}. Expected a region format like 'us-central1'. Please "
        "provide a valid region.")


def hostname(env: Mapping[str, str] | None = None) -> str:
    """This process's host name in profile file names: $MLDIAG_HOST_NAME, else $HOSTNAME
    (the pod name on GKE, as upstream reads it), else the machine's host name."""
    env = os.environ if env is None else env
    return env.get("MLDIAG_HOST_NAME") or env.get("HOSTNAME") or socket.gethostname()


def _json_env(env: Mapping[str, str], key: str) -> dict[str, Any]:
    raw = env.get(key)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        log.warning("mldiag: %s is not JSON, ignored: %.80s", key, raw)
        return {}
    return value if isinstance(value, dict) else {}


def _slurm_time(raw: str | None) -> str | None:
    if raw and raw.isdigit():
        return datetime.datetime.fromtimestamp(int(raw), datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ")
    return raw or None


def detect(env: Mapping[str, str] | None = None,
           run_workload_id: str | None = None) -> tuple[Orchestrator, dict[str, Any]]:
    """The orchestrator and its workload details, from the variables upstream reads:
    `GKE_DIAGON_IDENTIFIER` / `GKE_DIAGON_METADATA` (set by the GKE webhook), `SLURM_*`, and
    `RUN_WORKLOAD_ID` (or `run_workload_id`) for any other orchestrator."""
    env = os.environ if env is None else env
    identifier = _json_env(env, "GKE_DIAGON_IDENTIFIER")
    metadata = _json_env(env, "GKE_DIAGON_METADATA")
    if identifier or metadata:
        details: dict[str, Any] = {
            "id": identifier.get("metadata.name", ""),
            "kind": identifier.get("metadata.kind", ""),
            "cluster": identifier.get("clustername", ""),
            "namespace": identifier.get("namespace", ""),
            "parent_workload": metadata.get("parent-workload"),
            "creation-timestamp": metadata.get("creation-timestamp", ""),
        }
        labels = metadata.get("associated-labels")
        if isinstance(labels, str) and labels:
            details["labels"] = dict(
                (k.strip(), v.strip()) for k, _, v in
                (pair.partition("=") for pair in labels.split(",") if "=" in pair))
        return Orchestrator.GKE, details
    if env.get("SLURM_JOB_ID") and env.get("SLURM_CLUSTER_NAME") and (
            env.get("SLURM_NODELIST") or env.get("SLURM_JOB_START_TIME")):
        job = env["SLURM_JOB_ID"]
        return Orchestrator.SLURM, {
            "job_id": job, "cluster": env["SLURM_CLUSTER_NAME"],
            "display_name": env.get("SLURM_JOB_NAME") or f"slurm-job-{job}",
            "submit_time": _slurm_time(env.get("SLURM_JOB_START_TIME")),
        }
    workload_id = run_workload_id or env.get("RUN_WORKLOAD_ID")
    host = hostname(env)
    return Orchestrator.CUSTOM, {
        "id": workload_id or host, "display_name": workload_id or host,
        "create_time": datetime.datetime.now(datetime.UTC).isoformat(),
        "_is_workload_id_set": bool(workload_id), "_hostname": host,
    }
