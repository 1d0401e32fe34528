"""Security headers, the sandboxed report, sign-in, CSRF, and hostile input shown as text."""

from __future__ import annotations

import json
import re
import time

import pytest

from mldiag.console.auth import COOKIE
from mldiag.console.context import ensure_local_admin
from mldiag.model import RunRecord, TargetRecord
from mldiag.viewer import session_dir
from tests.console.conftest import Site

S1 = "/runs/tpu/sessions/s1"
XSS = ['<script>alert("x")</script>', '"><img src=x onerror=alert(1)>',
       "javascript:alert(1)", "</textarea><svg onload=alert(1)>", "{{7*7}}"]


def test_every_response_carries_the_security_headers(site: Site) -> None:
    viewer = site.auth("viewer")
    for path, auth in [("/", viewer), ("/", {}), (S1, viewer), (f"{S1}/report", viewer),
                       ("/api/v1/runs", viewer), ("/api/v1/nothing", viewer),
                       (f"{S1}/xprof/data/plugin/profile/", viewer), ("/static/console.js", {}),
                       ("/login", {})]:
        r = site.client.get(path, headers=auth)
        csp = r.headers.get("content-security-policy", "")
        assert "frame-ancestors" in csp, path
        assert r.headers["x-content-type-options"] == "nosniff", path
        assert r.headers["referrer-policy"] == "no-referrer", path
        # No inline script anywhere but the XProf frontend's own, allowed by hash.
        script_src = re.search(r"script-src ([^;]*)", csp)
        assert (script_src and "'unsafe-inline'" not in script_src.group(1)) or (
            "default-src 'none'" in csp and "script-src" not in csp), path
    page = site.client.get(S1, headers=viewer).text
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page)
    assert not re.search(r"\son[a-z]+=", page)


def test_the_report_is_sandboxed_without_scripts_or_same_origin(site: Site) -> None:
    page = site.client.get(S1, headers=site.auth("viewer")).text
    iframe = re.search(r"<iframe[^>]*>", page)
    assert iframe and re.search(r'\ssandbox(\s|>|="")', iframe.group(0))
    assert "allow-scripts" not in iframe.group(0) and "allow-same-origin" not in iframe.group(0)
    report = site.client.get(f"{S1}/report", headers=site.auth("viewer"))
    csp = report.headers["content-security-policy"]
    assert csp.startswith("sandbox;") and "default-src 'none'" in csp
    assert "frame-ancestors 'self'" in csp
    assert "NEEDS_ATTENTION" in report.text or "OPTIMAL" in report.text


def test_hostile_names_configs_hosts_and_findings_show_as_text(site: Site) -> None:
    state = site.runtime.state
    run = state.get_run("other")
    assert run is not None
    state.register_run(RunRecord(name="other", configs={x: x for x in XSS},
                                 run_group=XSS[1], created_at=run.created_at))
    for i, x in enumerate(XSS):
        # Host names are one safe path segment (the stores refuse others); every other
        # field a workload writes may hold anything.
        with pytest.raises(ValueError, match="bad host name"):
            state.upsert_target(TargetRecord(run="other", host=x, port=9000 + i))
        state.upsert_target(TargetRecord(run="other", host=f"h{i}", port=9000 + i,
                                         last_heartbeat=time.time(), address=x,
                                         framework=x, last_error=x))
    s = state.get_session("other", "o1")
    assert s is not None
    name = f"{session_dir(s)}/analysis/analysis.json"
    analysis = json.loads(site.runtime.storage.read_bytes(name))
    real = json.loads(json.dumps(analysis))
    analysis["summary"] = XSS[0]
    analysis["findings"] = [{"priority": "P0", "category": XSS[3], "title": x, "impact": x,
                             "fix": {"code": x}} for x in XSS]
    site.runtime.storage.write_bytes(name, json.dumps(analysis).encode())
    try:
        admin = site.auth("admin")
        pages = [site.client.get(p, headers=admin).text
                 for p in ("/", "/runs/other", "/runs/other/sessions/o1")]
        for page in pages:
            assert "<script>alert" not in page and "<img src=x" not in page
            assert "<svg onload" not in page
        assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in pages[1]  # a config key
        assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in pages[0]  # the run group
        assert pages[2].count("&lt;/textarea&gt;&lt;svg onload=alert(1)&gt;") >= 2
        assert "49" not in re.findall(r"<td>([^<]*)</td>", pages[2])  # no template injection
        api = site.client.get("/api/v1/runs/other", headers=admin).json()
        assert {t["address"] for t in api["targets"]} == set(XSS)
    finally:
        site.runtime.storage.write_bytes(name, json.dumps(real).encode())
        state.register_run(RunRecord(name="other", created_at=run.created_at))


def test_a_findings_code_spans_show_as_code_and_stay_escaped(site: Site) -> None:
    state = site.runtime.state
    s = state.get_session("other", "o1")
    assert s is not None
    name = f"{session_dir(s)}/analysis/analysis.json"
    real = site.runtime.storage.read_bytes(name)
    analysis = json.loads(real)
    analysis["findings"] = [{"priority": "P0", "category": "host_bound", "title": "t",
                             "impact": "`<img src=x onerror=alert(1)>`",
                             "fix": "feed it from a `queue.Queue`"}]
    site.runtime.storage.write_bytes(name, json.dumps(analysis).encode())
    try:
        page = site.client.get("/runs/other/sessions/o1", headers=site.auth("viewer")).text
        assert "feed it from a <code>queue.Queue</code>" in page
        assert "<code>&lt;img src=x onerror=alert(1)&gt;</code>" in page
        assert "<img src=x" not in page
    finally:
        site.runtime.storage.write_bytes(name, real)


def test_the_login_url_works_once_and_sets_a_strict_http_only_cookie(site: Site) -> None:
    _, code = ensure_local_admin(site.console)
    assert (site.home / "admin.token").stat().st_mode & 0o777 == 0o600
    client = site.client
    first = client.get(f"/login?code={code}", follow_redirects=False)
    assert first.status_code == 303
    cookie = first.headers["set-cookie"]
    assert f"{COOKIE}=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    value = first.cookies[COOKIE]
    again = client.get(f"/login?code={code}", follow_redirects=False)
    assert again.status_code == 401
    page = client.get("/", cookies={COOKIE: value})
    assert page.status_code == 200 and "local-admin" in page.text
    client.cookies.clear()


def test_cookie_posts_need_the_csrf_token_and_bearer_posts_do_not(site: Site) -> None:
    _, code = ensure_local_admin(site.console)
    signed_in = site.client.get(f"/login?code={code}", follow_redirects=False)
    cookies = {COOKIE: signed_in.cookies[COOKIE]}
    site.client.cookies.clear()
    page = site.client.get(S1, cookies=cookies).text
    csrf = re.search(r'name="csrf-token" content="([0-9a-f]+)"', page)
    assert csrf
    url = f"/api/v1{S1}/share"
    assert site.client.post(url, json={}, cookies=cookies).status_code == 403
    assert site.client.post(url, json={}, cookies=cookies,
                            headers={"X-CSRF-Token": "0" * 40}).status_code == 403
    ok = site.client.post(url, json={}, cookies=cookies, headers={"X-CSRF-Token": csrf.group(1)})
    assert ok.status_code == 201
    assert site.client.post(url, json={}, headers=site.auth("editor")).status_code == 201
    # Signing out revokes the cookie's token on the server.
    out = site.client.post("/logout", data={"csrf_token": csrf.group(1)}, cookies=cookies,
                           follow_redirects=False)
    assert out.status_code == 303
    assert site.client.get("/", cookies=cookies).status_code == 401
    site.client.cookies.clear()


def test_signing_in_with_a_pasted_token(site: Site) -> None:
    r = site.client.post("/login", data={"token": site.tokens["viewer"], "next": "/runs/tpu"},
                         follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/runs/tpu"
    bad = site.client.post("/login", data={"token": "mldiag_nope"}, follow_redirects=False)
    assert bad.status_code == 401
    site.client.cookies.clear()
