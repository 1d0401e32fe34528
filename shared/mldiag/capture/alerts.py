"""Degradation alerts: every payload shape on `degradation-alerts`, as one message.

Three shapes arrive:

- a workload-monitoring event (ML Diagnostics "monitored event"): `type:
  PERFORMANCE_DEGRADATION`, `analyzerReports[].detectionState: DETECTED`, the run in `name`
  (`projects/P/locations/L/machineLearningRuns/RUN/monitoredEvents/ID`) or in `labels`;
- a Cloud Monitoring incident notification (`{"incident": {...}, "version": "1.2"}`), the run
  in a metric, resource or policy user label named `run` / `machine_learning_run`, or (a GKE
  container metric such as the TPU duty cycle) in its pod's `mldiag.dev/run` label, which
  the incident carries as a metadata user label (docs/deploy-gke.md);
- mldiag's own `DegradationDetected` (the SDK's step-time monitor), with `kind`, or without it
  when another tool publishes one (`alert_id` and `run`).

The Cloud Function and the local bus's `degradation-alerts` topic both parse with
`parse_alert`, so every shape is accepted on every path.

Anything else is a PoisonMessage with the reason. Alerts that say nothing is wrong (no analyzer
DETECTED, a closed incident) parse to None: they are acknowledged and ignored.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from mldiag.errors import PoisonMessage
from mldiag.kube.pods import Pod
from mldiag.messages import DegradationDetected, parse

RUN_LABELS = ("run", "machine_learning_run", "machinelearningrun", "mldiag_run", "ml_run")
TARGET_LABELS = ("target", "host", "hostname", "node", "instance")


def alert_session(alert_id: str) -> str:
    """The session an alert's capture gets. Named after the alert alone, so a redelivery
    after a lost publish asks for the same session (the capture stage then treats it as a
    duplicate), and `mldiag alerts publish` can say which session to look for."""
    return f"auto-{hashlib.sha256(alert_id.encode()).hexdigest()[:10]}"


def _object(payload: bytes | str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(payload, bytes | str):
        try:
            data = json.loads(payload)
        except (UnicodeDecodeError, ValueError) as e:
            raise PoisonMessage(f"alert is not JSON: {e}") from e
    else:
        data = dict(payload)
    if not isinstance(data, dict):
        raise PoisonMessage(f"alert must be a JSON object, got {type(data).__name__}")
    return data


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _label(labels: Sequence[Mapping[str, Any] | None], keys: tuple[str, ...]) -> str:
    for group in labels:
        for key, value in (group or {}).items():
            if str(key).lower() in keys and isinstance(value, str) and value:
                return value
    return ""


def _epoch(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return 0.0
    return 0.0


def _monitored_event(data: dict[str, Any],
                     attributes: Mapping[str, str]) -> DegradationDetected | None:
    if data.get("type") != "PERFORMANCE_DEGRADATION":
        raise PoisonMessage(f"workload-monitoring event of type {data.get('type')!r}: only "
                            "PERFORMANCE_DEGRADATION starts a capture")
    reports = data.get("analyzerReports") or []
    if not isinstance(reports, list):
        raise PoisonMessage("workload-monitoring event: analyzerReports is not a list")
    detected = [r for r in reports if isinstance(r, dict) and r.get("detectionState") == "DETECTED"]
    if not detected:
        return None
    name = str(data.get("name") or "")
    parts = name.split("/")
    labels = _dict(data.get("labels"))
    run = ""
    if "machineLearningRuns" in parts and parts.index("machineLearningRuns") + 1 < len(parts):
        run = parts[parts.index("machineLearningRuns") + 1]
    run = _label([labels, attributes], RUN_LABELS) or run
    if not run:
        raise PoisonMessage("workload-monitoring event names no run (no machineLearningRuns/ "
                            "in name, no run label)")
    event_id = parts[-1] if "monitoredEvents" in parts else str(data.get("id") or name)
    if not event_id:
        raise PoisonMessage("workload-monitoring event has no name or id to dedupe on")
    target = _label([labels, attributes], TARGET_LABELS)
    summary = "; ".join(
        f"{r.get('analyzer', 'analyzer')}: {r.get('details', 'DETECTED')}" for r in detected)
    return DegradationDetected(alert_id=f"monitored-event:{event_id}", run=run,
                               source="workload-monitoring", summary=summary[:2000],
                               targets=[target] if target else [],
                               detected_at=_epoch(data.get("startTime")))


def _incident(data: dict[str, Any], attributes: Mapping[str, str]) -> DegradationDetected | None:
    incident = data["incident"]
    if not isinstance(incident, dict):
        raise PoisonMessage("Cloud Monitoring notification: incident is not an object")
    incident_id = incident.get("incident_id")
    if not isinstance(incident_id, str) or not incident_id:
        raise PoisonMessage("Cloud Monitoring notification: incident_id missing")
    if str(incident.get("state", "open")).lower() != "open":
        return None
    metric, resource = _dict(incident.get("metric")), _dict(incident.get("resource"))
    metadata = _dict(incident.get("metadata"))
    groups = [_dict(metric.get("labels")), _dict(resource.get("labels")),
              _dict(metadata.get("user_labels")), _dict(metadata.get("system_labels")),
              _dict(incident.get("policy_user_labels")), attributes]
    # A GKE container's metric carries its pod's Kubernetes labels as metadata user labels:
    # the run's label (mldiag.dev/run, or the product's, naming the JobSet) and the stable
    # host name of its completion index, as kube-discover registered it.
    pod = Pod.from_object({"metadata": {"labels": _dict(metadata.get("user_labels"))}})
    run = _label(groups, RUN_LABELS) or pod.run
    if not run:
        raise PoisonMessage("Cloud Monitoring incident names no run: add a `run` user label "
                            "to the alert policy or a `run` metric label, or alert on a GKE "
                            "container metric of pods labelled mldiag.dev/run")
    target = _label(groups, TARGET_LABELS) or pod.host_name()
    summary = str(incident.get("summary") or incident.get("condition_name") or "")
    return DegradationDetected(alert_id=f"incident:{incident_id}", run=run,
                               source="cloud-monitoring", summary=summary[:2000],
                               targets=[target] if target else [],
                               detected_at=_epoch(incident.get("started_at")))


def parse_alert(payload: bytes | str | Mapping[str, Any],
                attributes: Mapping[str, str] | None = None) -> DegradationDetected | None:
    """Normalise any alert payload; None for an alert that asks for nothing."""
    data = _object(payload)
    attributes = attributes or {}
    if "kind" in data or "alert_id" in data:
        # Ours; a tool publishing it on the alerts topic may leave out `kind`.
        message = parse(data, "degradation-alerts")
        if not isinstance(message, DegradationDetected):
            raise PoisonMessage(f"{message.kind} is not an alert")
        return message
    if "incident" in data:
        return _incident(data, attributes)
    if "analyzerReports" in data or "type" in data:
        return _monitored_event(data, attributes)
    raise PoisonMessage("unrecognised alert: expected a workload-monitoring event "
                        "(type, analyzerReports), a Cloud Monitoring incident (incident), or a "
                        "DegradationDetected message (kind, or alert_id and run)")
