"""A GKE job's degradation as Cloud Monitoring reports it (an incident on the TPU duty cycle
of the job's containers, recorded) names the run and the host kube-discover registered."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from mldiag.capture.alerts import parse_alert
from mldiag.errors import PoisonMessage
from tests.helpers.fake_kube import RECORDED


def incident() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDED / "duty_cycle_incident.json").read_text())
    return data


def test_the_pods_labels_name_the_run_and_the_host() -> None:
    alert = parse_alert(json.dumps(incident()).encode())
    assert alert is not None
    assert (alert.run, alert.targets, alert.source) == (
        "llama-7b-run", ["llama-train-slice-0-1"], "cloud-monitoring")
    assert alert.alert_id == "incident:0.nbcd6wmcqfos" and "duty cycle" in alert.summary.lower()
    assert alert.detected_at == 1796539920.0


def test_the_products_label_names_the_jobset_as_the_run() -> None:
    data = incident()
    labels = data["incident"]["metadata"]["user_labels"]
    del labels["mldiag.dev/run"]
    labels["managed-mldiagnostics-gke"] = "true"
    alert = parse_alert(data)
    assert alert is not None and alert.run == "llama-train"


def test_a_policy_label_still_wins_and_a_closed_incident_asks_nothing() -> None:
    data = incident()
    data["incident"]["policy_user_labels"]["run"] = "chosen-run"
    alert = parse_alert(data)
    assert alert is not None and alert.run == "chosen-run"
    closed = copy.deepcopy(incident())
    closed["incident"]["state"] = "closed"
    assert parse_alert(closed) is None


def test_a_container_metric_of_an_unlabelled_pod_is_refused_with_the_reason() -> None:
    data = incident()
    data["incident"]["metadata"]["user_labels"] = {"app": "train"}
    with pytest.raises(PoisonMessage, match="pods labelled mldiag.dev/run"):
        parse_alert(data)
