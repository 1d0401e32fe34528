"""The admission webhook over real TLS (a certificate made here): a recorded AdmissionReview
of a JobSet pod in, the JSON patch out, applied as the API server would."""

from __future__ import annotations

import base64
import copy
import datetime
import http.client
import ipaddress
import json
import ssl
from collections.abc import Iterator
from typing import Any

import pytest

from mldiag.kube import webhook
from tests.helpers.fake_kube import RECORDED

crypto = pytest.importorskip("cryptography")
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

URL = "https://register-abc123-uc.a.run.app"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mldiag-webhook.mldiag.svc")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("mldiag-webhook.mldiag.svc"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    d = tmp_path_factory.mktemp("tls")
    (d / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "tls.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return str(d / "tls.crt"), str(d / "tls.key")


@pytest.fixture(scope="module")
def server(tls: tuple[str, str]) -> Iterator[int]:
    httpd = webhook.server("127.0.0.1", 0, *tls, webhook.Injection(registration_url=URL))
    thread = webhook.serve_in_thread(httpd)
    yield int(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def post(port: int, cert: str, body: bytes) -> tuple[int, dict[str, Any]]:
    context = ssl.create_default_context(cafile=cert)  # verifies the chain and the name
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request("POST", "/mutate", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def recorded_review() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDED / "admission_review_pod.json").read_text())
    return data


def apply(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 `add`, the only op the webhook sends, as the API server applies it."""
    out = copy.deepcopy(obj)
    for op in ops:
        assert op["op"] == "add", op
        *parents, last = op["path"].lstrip("/").split("/")
        node: Any = out
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if last == "-":
            node.append(op["value"])
        else:
            node[last] = op["value"]
    return out


def patched(response: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    assert response["patchType"] == "JSONPatch"
    return apply(obj, json.loads(base64.b64decode(response["patch"])))


def env(pod: dict[str, Any], i: int = 0) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][i].get("env", [])}


def test_a_labelled_jobset_pod_gets_the_sdks_settings_over_tls(
        server: int, tls: tuple[str, str]) -> None:
    review = recorded_review()
    status, answer = post(server, tls[0], json.dumps(review).encode())
    assert status == 200 and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == review["request"]["uid"] and response["allowed"] is True
    pod = patched(response, review["request"]["object"])
    # The container's own variable stays; ours follow it.
    assert env(pod) == {"JAX_COORDINATOR_PORT": "8476", "MLDIAG_RUN": "llama-7b-run",
                        "MLDIAG_HOST_NAME": "llama-train-slice-0-1",
                        "MLDIAG_REGISTRATION_URL": URL, "MLDIAG_BACKEND": "gcp"}


def test_a_container_without_env_and_one_that_sets_its_own_run(
        server: int, tls: tuple[str, str]) -> None:
    review = recorded_review()
    containers = review["request"]["object"]["spec"]["containers"]
    containers[0]["env"] = [{"name": "MLDIAG_RUN", "value": "chosen-by-user"}]
    containers.append({"name": "sidecar", "image": "busybox"})
    _, answer = post(server, tls[0], json.dumps(review).encode())
    pod = patched(answer["response"], review["request"]["object"])
    assert env(pod, 0)["MLDIAG_RUN"] == "chosen-by-user"
    assert env(pod, 1)["MLDIAG_RUN"] == "llama-7b-run"
    assert env(pod, 1)["MLDIAG_HOST_NAME"] == "llama-train-slice-0-1"


def test_a_pod_that_names_no_run_passes_unchanged_with_a_warning(
        server: int, tls: tuple[str, str]) -> None:
    review = recorded_review()
    labels = review["request"]["object"]["metadata"]["labels"]
    for key in [k for k in labels if k.startswith(("mldiag", "jobset", "batch", "job-name"))]:
        del labels[key]
    _, answer = post(server, tls[0], json.dumps(review).encode())
    response = answer["response"]
    assert response["allowed"] is True and "patch" not in response
    assert "names no run" in response["warnings"][0]


@pytest.mark.parametrize("body", [b"{not json", b'{"kind": "Pod"}',
                                  b'{"kind": "AdmissionReview", "apiVersion": '
                                  b'"admission.k8s.io/v1beta1", "request": {"uid": "x"}}'])
def test_what_is_not_an_admission_review_v1_is_a_400(
        server: int, tls: tuple[str, str], body: bytes) -> None:
    status, answer = post(server, tls[0], body)
    assert status == 400 and answer["error"]


def test_the_server_speaks_only_tls(server: int, tls: tuple[str, str]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server, timeout=5)
    with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
        conn.request("POST", "/mutate", json.dumps(recorded_review()).encode())
        conn.getresponse().read()
    conn.close()
    # And it still answers over TLS afterwards.
    assert post(server, tls[0], json.dumps(recorded_review()).encode())[0] == 200


def test_the_recorded_review_is_what_the_module_reads() -> None:
    review = recorded_review()
    answer = webhook.review(json.dumps(review).encode(), webhook.Injection())
    pod = patched(answer["response"], review["request"]["object"])
    # Without a registration URL only the names are injected.
    assert set(env(pod)) == {"JAX_COORDINATOR_PORT", "MLDIAG_RUN", "MLDIAG_HOST_NAME"}
