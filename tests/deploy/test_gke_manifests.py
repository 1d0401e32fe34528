"""deploy/gke/ checked against the Kubernetes API's own schema, as the `kubernetes` client
ships it (kubeconform is a Go binary of GitHub releases, out of reach of the registries the
tests install from): every document deserialises into its model class, every field is one
the model has, every required field is there; and the RBAC is least privilege."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

client = pytest.importorskip("kubernetes.client")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "gke"
KINDS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "Service"): "V1Service",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"):
        "V1MutatingWebhookConfiguration",
}
PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object,
              "datetime": str, "date": str}


def unknown_fields(value: Any, kind: str, where: str) -> list[str]:
    """Every field of `value` that the schema type `kind` does not have, by path."""
    if kind in PRIMITIVES:
        ok = isinstance(value, PRIMITIVES[kind]) and not (kind == "int" and isinstance(
            value, bool))
        return [] if ok else [f"{where}: {value!r} is not a {kind}"]
    if m := re.fullmatch(r"[Ll]ist\[(.+)\]", kind):
        if not isinstance(value, list):
            return [f"{where}: not a list"]
        return [e for i, v in enumerate(value) for e in unknown_fields(v, m[1], f"{where}[{i}]")]
    if m := re.fullmatch(r"(?:dict\(str, (.+)\)|Dict\[str, (.+)\])", kind):
        if not isinstance(value, dict):
            return [f"{where}: not a map"]
        inner = m[1] or m[2]
        return [e for k, v in value.items() for e in unknown_fields(v, inner, f"{where}.{k}")]
    model = getattr(client, kind)
    if not isinstance(value, dict):
        return [f"{where}: not an object ({kind})"]
    by_json = {json_name: attr for attr, json_name in model.attribute_map.items()}
    problems = []
    for key, v in value.items():
        if key not in by_json:
            problems.append(f"{where}.{key}: no such field in {kind}")
        else:
            problems += unknown_fields(v, model.openapi_types[by_json[key]], f"{where}.{key}")
    return problems


def documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [(f"{path.name}#{i}", d) for i, d in enumerate(yaml.safe_load_all(
            path.read_text())) if d]
    return docs


def check(doc: dict[str, Any], where: str) -> list[str]:
    kind = KINDS.get((doc.get("apiVersion"), doc.get("kind")))
    if kind is None:
        return [f"{where}: no schema for {doc.get('apiVersion')} {doc.get('kind')}"]
    problems = unknown_fields(doc, kind, where)
    if not problems:
        # Required fields: the model's constructor refuses None for them.
        api = client.ApiClient()
        try:
            api._ApiClient__deserialize(doc, kind)
        except ValueError as e:
            problems.append(f"{where}: {e}")
    return problems


@pytest.mark.parametrize(("where", "doc"), documents(), ids=[w for w, _ in documents()])
def test_each_manifest_fits_the_kubernetes_schema(where: str, doc: dict[str, Any]) -> None:
    assert check(doc, where) == []


def test_the_check_finds_a_misspelt_field_a_wrong_type_and_a_missing_required_one() -> None:
    deployment = next(d for w, d in documents() if d["kind"] == "Deployment")
    bad = yaml.safe_load(yaml.safe_dump(deployment))
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    bad["spec"]["replicas"] = "two"
    assert len(check(bad, "bad")) == 2
    del deployment["spec"]["selector"]
    assert any("selector" in p for p in check(deployment, "missing"))


def test_kustomize_lists_every_manifest() -> None:
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in DEPLOY.glob("*.yaml")
                                    if p.name != "kustomization.yaml")


def test_rbac_is_read_only_on_pods_jobs_and_jobsets_in_the_workload_namespace() -> None:
    docs = [d for _, d in documents()]
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert role["metadata"]["namespace"] != "mldiag"  # the workloads', not its own
    assert {(tuple(r["apiGroups"]), tuple(r["resources"])) for r in role["rules"]} == {
        (("",), ("pods",)), (("batch",), ("jobs",)), (("jobset.x-k8s.io",), ("jobsets",))}
    assert all(set(r["verbs"]) <= {"get", "list", "watch"} for r in role["rules"])
    accounts = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceAccount"}
    assert accounts["mldiag-discover"]["metadata"]["annotations"][
        "iam.gke.io/gcp-service-account"].endswith(".iam.gserviceaccount.com")
    assert accounts["mldiag-webhook"]["automountServiceAccountToken"] is False


def test_the_webhook_never_blocks_a_pod_and_speaks_v1() -> None:
    (config,) = [d for _, d in documents() if d["kind"] == "MutatingWebhookConfiguration"]
    hooks = config["webhooks"]
    for hook in hooks:
        assert hook["failurePolicy"] == "Ignore" and hook["admissionReviewVersions"] == ["v1"]
        assert hook["sideEffects"] == "None"
        assert hook["clientConfig"]["service"]["path"] == "/mutate"
        assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"],
                                  "operations": ["CREATE"], "resources": ["pods"],
                                  "scope": "Namespaced"}]
    # Selected by the run's label, or the product's on the pod or its namespace.
    assert [h.get("objectSelector") or h.get("namespaceSelector") for h in hooks] == [
        {"matchExpressions": [{"key": "mldiag.dev/run", "operator": "Exists"}]},
        {"matchLabels": {"managed-mldiagnostics-gke": "true"}},
        {"matchLabels": {"managed-mldiagnostics-gke": "true"}}]
