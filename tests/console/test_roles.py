"""Every route checks the caller's role for that run on the server, and denies by default:
401 with no credentials, 403 for the wrong role or run, 2xx (or the route's own answer) for
the right one."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from tests.console.conftest import HOST, Site

S1 = "/runs/tpu/sessions/s1"
CAPTURE = {"session": "new-one", "duration_s": 1}
ROLES = ("analysis_viewer", "viewer", "editor", "admin", "viewer_other", "editor_other")
BROWSE = {"analysis_viewer", "viewer", "editor", "admin"}
PROFILE = {"viewer", "editor", "admin"}
EDIT = {"editor", "admin"}
ADMIN = {"admin"}
# method, path, body, the roles allowed, the status an allowed caller gets.
ROUTES: list[tuple[str, str, Any, set[str], int]] = [
    ("GET", "/runs/tpu", None, BROWSE, 200),
    ("GET", S1, None, BROWSE, 200),
    ("GET", f"{S1}/report", None, BROWSE, 200),
    ("GET", f"{S1}/hosts/{HOST}/xplane.pb", None, PROFILE, 200),
    ("GET", f"{S1}/xprof/data/plugin/profile/", None, PROFILE, 200),
    ("GET", f"{S1}/xprof/data/plugin/profile/run_tools?run=s1", None, PROFILE, 200),
    ("GET", "/api/v1/runs/tpu", None, BROWSE, 200),
    ("GET", "/api/v1/runs/tpu/targets", None, PROFILE, 200),
    ("GET", "/api/v1/runs/tpu/sessions", None, BROWSE, 200),
    ("GET", "/api/v1/runs/tpu/sessions/s1", None, BROWSE, 200),
    # The run has no profiler target: an allowed caller gets the capture stage's refusal.
    ("POST", "/api/v1/runs/tpu/captures", CAPTURE, EDIT, 409),
    ("POST", "/api/v1/runs/tpu/continuous", {"action": "start"}, EDIT, 409),
    ("POST", "/api/v1/runs/tpu/sessions/s1/share", {}, EDIT, 201),
    # Outside the capture egress policy: an allowed caller gets the refusal, nothing stored.
    ("POST", "/api/v1/runs/tpu/targets", {"address": "203.0.113.7:9999"}, EDIT, 400),
    ("DELETE", "/api/v1/runs/tpu/targets/nobody", None, EDIT, 404),
    # Comparing two sessions reads their analyses only: whoever may read reports.
    ("GET", "/runs/tpu/compare?a=s1&b=s2", None, BROWSE, 200),
    ("GET", "/runs/tpu/compare/diff.html?a=s1&b=s2", None, BROWSE, 200),
    ("GET", "/api/v1/runs/tpu/compare?a=s1&b=s2", None, BROWSE, 200),
    # s1 was not captured on an alert: an allowed caller learns it has no diff.
    ("GET", f"{S1}/diff.html", None, BROWSE, 404),
    ("POST", "/api/v1/runs/tpu/baseline", {"session": "s1"}, EDIT, 200),
    ("GET", "/api/v1/tokens", None, ADMIN, 200),
    ("GET", "/api/v1/grants", None, ADMIN, 200),
    ("POST", "/api/v1/grants", {"principal": "a@b.c", "role": "viewer"}, ADMIN, 201),
    ("GET", "/api/v1/share/nope/access", None, ADMIN, 200),
]


@pytest.mark.parametrize("method,path,body,allowed,ok", ROUTES,
                         ids=[f"{m} {p}" for m, p, *_ in ROUTES])
def test_each_route_allows_exactly_its_roles(site: Site, method: str, path: str, body: Any,
                                             allowed: set[str], ok: int) -> None:
    anonymous = site.client.request(method, path, json=body)
    assert anonymous.status_code == 401, anonymous.text
    forged = site.client.request(method, path, json=body,
                                 headers={"Authorization": "Bearer mldiag_forged"})
    assert forged.status_code == 401
    for role in ROLES:
        r = site.client.request(method, path, json=body, headers=site.auth(role))
        expected = ok if role in allowed else 403
        assert r.status_code == expected, (role, r.status_code, r.text[:300])


def test_the_runs_list_shows_only_the_runs_a_principal_may_see(site: Site) -> None:
    assert site.client.get("/").status_code == 401
    everyone = site.client.get("/api/v1/runs", headers=site.auth("viewer")).json()
    assert sorted(r["name"] for r in everyone) == ["other", "tpu"]
    other = site.client.get("/api/v1/runs", headers=site.auth("viewer_other")).json()
    assert [r["name"] for r in other] == ["other"]
    page = site.client.get("/", headers=site.auth("viewer_other")).text
    assert "/runs/other" in page and "/runs/tpu" not in page


def test_an_analysis_viewer_sees_reports_but_no_profiles_or_targets(site: Site) -> None:
    page = site.client.get(S1, headers=site.auth("analysis_viewer")).text
    assert "Open in XProf" not in page and "xplane.pb" not in page
    assert f"{S1}/report" in page
    full = site.client.get(S1, headers=site.auth("viewer")).text
    assert "Open in XProf" in full and f"{S1}/hosts/{HOST}/xplane.pb" in full
    run = site.client.get("/api/v1/runs/tpu", headers=site.auth("analysis_viewer")).json()
    assert run["targets"] == []


def test_a_revoked_or_expired_token_is_refused(site: Site) -> None:
    import time

    from mldiag.access import create_token

    secret, record = create_token(site.console.access, principal="token:t", role="admin",
                                  now=time.time())
    headers = {"Authorization": f"Bearer {secret}"}
    assert site.client.get("/api/v1/runs", headers=headers).status_code == 200
    site.console.access.revoke_token(record.id, time.time())
    assert site.client.get("/api/v1/runs", headers=headers).status_code == 401
    old, _ = create_token(site.console.access, principal="token:old", role="admin",
                          now=time.time() - 100, expires_s=10)
    assert site.client.get("/api/v1/runs",
                           headers={"Authorization": f"Bearer {old}"}).status_code == 401


def test_only_an_admin_may_create_a_link_anyone_can_open(site: Site) -> None:
    r = site.client.post(f"/api/v1{S1}/share", json={"anyone": True},
                         headers=site.auth("editor"))
    assert r.status_code == 403
    r = site.client.post(f"/api/v1{S1}/share", json={"anyone": True},
                         headers=site.auth("admin"))
    assert r.status_code == 201 and r.json()["anyone"] is True


def test_the_api_refuses_out_of_limit_values_with_the_shared_message(site: Site) -> None:
    editor = site.auth("editor")
    r = site.client.post("/api/v1/runs/tpu/captures", headers=editor,
                         json={**CAPTURE, "duration_s": 301})
    assert r.status_code == 400
    assert r.json()["detail"] == "capture duration must be in (0, 300] s, not 301 s"
    r = site.client.post("/api/v1/runs/tpu/continuous", headers=editor,
                         json={"action": "start", "max_bytes": 10**18})
    assert r.status_code == 400 and r.json()["detail"].startswith(
        "continuous max_bytes must be in [1.0 MiB, 64.00 GiB]")


def test_an_editor_registers_and_deletes_a_plain_profiler_server(site: Site) -> None:
    editor = site.auth("editor")
    r = site.client.post("/api/v1/runs/other/targets", headers=editor,
                         json={"address": "203.0.113.7:9999"})
    assert r.status_code == 400 and "203.0.113.7" in r.json()["detail"]
    assert "outside the allowed networks" in r.json()["detail"]
    # Loopback is allowed locally; nothing listens there, so it is registered and down. The
    # port stays bound (not listening: connections are refused) so that no other process
    # takes it meanwhile (a freed port was, once, under load).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        r = site.client.post("/api/v1/runs/other/targets", headers=editor,
                             json={"address": f"127.0.0.1:{port}", "host_name": "plain-0",
                                   "platform": "cpu"})
    assert r.status_code == 201, r.text
    assert (r.json()["host"], r.json()["status"], r.json()["delivery"]) == (
        "plain-0", "down", "push")
    assert r.json()["down_reason"].startswith("unreachable")
    (listed,) = site.client.get("/api/v1/runs/other/targets", headers=editor).json()
    assert listed["status"] == "down" and listed["address"] == "127.0.0.1"
    page = site.client.get("/runs/other", headers=editor).text
    assert 'id="register-target"' in page and 'data-method="DELETE"' in page
    r = site.client.delete("/api/v1/runs/other/targets/plain-0", headers=editor)
    assert r.status_code == 200 and r.json()["deleted"] == 1
    assert site.client.get("/api/v1/runs/other/targets", headers=editor).json() == []
