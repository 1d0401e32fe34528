"""Security headers, the sandboxed report, sign-in, CSRF, hostile input shown as text, and
the red-team findings of issue 20 (sessions of revoked tokens, unbounded bodies, open
redirects, leaky failure reasons, bare 500s, shared principals, login codes, file modes)."""

from __future__ import annotations

import asyncio
import html
import json
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from mldiag.access import ShareLink, create_token, hash_secret, new_id, new_secret
from mldiag.console.app import create_app
from mldiag.console.auth import COOKIE
from mldiag.console.context import build_console, ensure_local_admin
from mldiag.console.guard import MAX_BODY
from mldiag.model import HostRecord, RunRecord, SessionRecord, TargetRecord
from mldiag.settings import Settings
from mldiag.viewer_cache import session_dir
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


# The red-team findings (issue 20): each test reproduces the attack.


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[Site]:
    """A console of its own (empty state, no pipeline), for tests that add runs or sessions
    the shared site's other tests would see."""
    settings = Settings(home=tmp_path / "home")
    console = build_console(settings)
    client = TestClient(create_app(console), base_url="http://127.0.0.1:8790")
    s = Site(home=settings.home, runtime=None, console=console,  # type: ignore[arg-type]
             client=client)
    for role in ("analysis_viewer", "viewer", "editor"):
        s.token(role, key=role)
    try:
        yield s
    finally:
        client.close()


def _sign_in(site: Site, token: str) -> dict[str, str]:
    r = site.client.post("/login", data={"token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text
    cookies = {COOKIE: r.cookies[COOKIE]}
    site.client.cookies.clear()
    return cookies


def test_revoking_a_token_ends_every_browser_session_made_from_it(site: Site) -> None:
    secret, record = create_token(site.console.access, role="admin", now=time.time())
    first, second = _sign_in(site, secret), _sign_in(site, secret)
    for cookies in (first, second):
        assert site.client.get("/api/v1/runs", cookies=cookies).status_code == 200
        assert site.client.get("/runs/tpu", cookies=cookies).status_code == 200
    listed = site.client.get("/api/v1/tokens", headers=site.auth("admin")).json()
    browsers = [t for t in listed if t["kind"] == "browser" and t["parent"] == record.id]
    assert len(browsers) == 2 and not any("hash" in k for t in listed for k in t)
    r = site.client.delete(f"/api/v1/tokens/{record.id}", headers=site.auth("admin"))
    assert r.status_code == 200
    for cookies in (first, second):
        assert site.client.get("/api/v1/runs", cookies=cookies).status_code == 401
        assert site.client.get("/runs/tpu", cookies=cookies).status_code == 401
    site.client.cookies.clear()


def test_a_token_that_expires_ends_its_browser_sessions(site: Site,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    secret, _ = create_token(site.console.access, role="viewer", now=time.time(),
                             expires_s=3600)
    cookies = _sign_in(site, secret)
    assert site.client.get("/api/v1/runs", cookies=cookies).status_code == 200
    later = time.time() + 3601
    monkeypatch.setattr(site.console, "clock", lambda: later)
    assert site.client.get("/api/v1/runs", cookies=cookies).status_code == 401
    site.client.cookies.clear()


def test_a_login_url_session_survives_its_spent_code_and_ends_on_revocation(
        site: Site) -> None:
    _, code = ensure_local_admin(site.console)
    r = site.client.get(f"/login?code={code}", follow_redirects=False)
    cookies = {COOKIE: r.cookies[COOKIE]}
    site.client.cookies.clear()
    assert site.client.get("/api/v1/runs", cookies=cookies).status_code == 200
    browser = site.console.access.find_token(hash_secret(cookies[COOKIE]))
    assert browser is not None and browser.kind == "browser"
    site.console.access.revoke_token(browser.id, time.time())
    assert site.client.get("/api/v1/runs", cookies=cookies).status_code == 401
    site.client.cookies.clear()


def test_a_login_code_must_be_a_login_code_before_anything_is_consumed(site: Site) -> None:
    secret, _ = create_token(site.console.access, role="viewer", now=time.time())
    r = site.client.get(f"/login?code={secret}", follow_redirects=False)
    assert r.status_code == 401 and COOKIE not in r.cookies
    # The API token pasted as a code still works.
    ok = site.client.get("/api/v1/runs", headers={"Authorization": f"Bearer {secret}"})
    assert ok.status_code == 200
    site.client.cookies.clear()


REDIRECTS = ["/\\evil.example/", "/%09/evil.example/", "/\t/evil.example/", "//evil.example/",
             "/%2F/evil.example/", "/%5Cevil.example/", "https://evil.example/",
             "javascript:alert(1)", "evil.example", "/%0d%0aSet-Cookie:x=1", "/\u2215evil",
             " //evil.example/", ""]


@pytest.mark.parametrize("target", REDIRECTS)
def test_next_after_sign_in_stays_on_this_console(site: Site, target: str) -> None:
    r = site.client.post("/login", data={"token": site.tokens["viewer"], "next": target},
                         follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"
    form = site.client.get("/login", params={"next": target})
    assert 'name="next" value="/"' in form.text
    site.client.cookies.clear()


def test_next_after_sign_in_keeps_a_path_of_this_console(site: Site) -> None:
    for target in ("/runs/tpu", "/runs/tpu/sessions/s1?x=1", "/runs/a%20b"):
        r = site.client.post("/login", data={"token": site.tokens["viewer"], "next": target},
                             follow_redirects=False)
        assert r.headers["location"] == target
    site.client.cookies.clear()


def test_unlabeled_tokens_of_one_role_are_different_principals(site: Site) -> None:
    made = [site.client.post("/api/v1/tokens", json={"role": "editor"},
                             headers=site.auth("admin")).json() for _ in range(2)]
    a, b = ({"Authorization": f"Bearer {m['token']}"} for m in made)
    assert made[0]["principal"] != made[1]["principal"]
    link = site.client.post(f"/api/v1{S1}/share", json={}, headers=a).json()
    mine = [li["id"] for li in site.client.get("/api/v1/share", headers=a).json()]
    theirs = [li["id"] for li in site.client.get("/api/v1/share", headers=b).json()]
    assert link["id"] in mine and link["id"] not in theirs
    assert site.client.delete(f"/api/v1/share/{link['id']}", headers=b).status_code == 404
    # Signed in with token a, the browser acts as a: it owns a's link.
    cookies = _sign_in(site, made[0]["token"])
    page = site.client.get("/api/v1/share", cookies=cookies).json()
    assert link["id"] in [li["id"] for li in page]
    # The access log tells openers apart, by id.
    path = link["url"].split("8790", 1)[-1]
    site.client.get(path, headers=a)
    site.client.get(path, headers=b)
    log = site.client.get(f"/api/v1/share/{link['id']}/access",
                          headers=site.auth("admin")).json()
    assert [e["principal"] for e in log][:2] == [made[1]["principal"], made[0]["principal"]]
    assert site.client.delete(f"/api/v1/share/{link['id']}", headers=a).status_code == 200
    site.client.cookies.clear()


def test_tokens_of_one_label_are_different_principals_and_the_label_is_shown(
        site: Site) -> None:
    records = [create_token(site.console.access, principal="token:ci", role="editor",
                            now=time.time(), label="ci")[1] for _ in range(2)]
    assert records[0].principal_id != records[1].principal_id
    assert all(r.principal_id == f"token:{r.id}" for r in records)
    page = site.client.get("/", headers={"Authorization": "Bearer " + create_token(
        site.console.access, role="viewer", now=time.time(), label="night-ci")[0]}).text
    assert "night-ci (token:" in page


def test_a_link_made_before_principal_ids_stays_readable(site: Site) -> None:
    legacy = ShareLink(id=new_id(), token_hash=hash_secret(new_secret("x")), run="tpu",
                       session="s1", created_by="token:editor", created_at=time.time(),
                       expires_at=time.time() + 3600)
    site.console.access.put_link(legacy)
    listed = site.client.get("/api/v1/share", headers=site.auth("admin")).json()
    assert legacy.id in [li["id"] for li in listed]
    assert legacy.id not in [li["id"] for li in site.client.get(
        "/api/v1/share", headers=site.auth("editor")).json()]
    assert site.client.delete(f"/api/v1/share/{legacy.id}",
                              headers=site.auth("admin")).status_code == 200


LEAKY = ("another profiling session is active on 127.0.0.1:9012; "
         "/home/ada/.mldiag/bucket/tpu/plugins/profile/f1/h.xplane.pb is a symlink to "
         "/etc/shadow, outside the bucket gs://acme-profiles/tpu: refused; "
         "tpu-vm-3.internal:8466 and [fe80::1]:9012 and 10.0.0.7 did not answer")
SECRETS = ("127.0.0.1", "9012", "/home/ada", "/etc/shadow", "gs://", "acme-profiles",
           "tpu-vm-3", "8466", "fe80", "10.0.0.7")


def test_analysis_viewer_reads_failure_reasons_without_addresses_or_paths(
        fresh: Site) -> None:
    state = fresh.console.plane.state
    state.ensure_run("tpu", discovered=True, now=time.time())
    host = HostRecord(object_name="tpu/plugins/profile/f1/h.xplane.pb", generation="1",
                      size=10, arrived_at=time.time(), status="FAILED", reason=LEAKY)
    state.create_session(SessionRecord(run="tpu", session="f1", state="FAILED",
                                       reason=LEAKY, hosts={"h": host},
                                       created_at=time.time(), updated_at=time.time()))
    views = {
        "list": lambda who: json.dumps(fresh.client.get(
            "/api/v1/runs/tpu/sessions", headers=fresh.auth(who)).json()),
        "run": lambda who: json.dumps(fresh.client.get(
            "/api/v1/runs/tpu", headers=fresh.auth(who)).json()),
        "json": lambda who: json.dumps(fresh.client.get(
            "/api/v1/runs/tpu/sessions/f1", headers=fresh.auth(who)).json()),
        "page": lambda who: html.unescape(fresh.client.get(
            "/runs/tpu/sessions/f1", headers=fresh.auth(who)).text),
    }
    for name, read in views.items():
        hidden = read("analysis_viewer")
        assert "did not answer" in hidden and "[address]" in hidden, name
        for secret in SECRETS:
            assert secret not in hidden, (name, secret)
        for who in ("viewer", "editor"):
            assert LEAKY in read(who).replace("\\/", "/"), (name, who)


@pytest.mark.parametrize("text,shown", [
    ("capture failed on 192.168.1.20:8466: deadline exceeded",
     "capture failed on [address]: deadline exceeded"),
    ("no xplane from host-0 (localhost:9999)", "no xplane from host-0 ([address])"),
    ("cannot read /var/lib/mldiag/bucket/r/s.pb", "cannot read [path]"),
    ("gs://b/r/plugins/profile/s/h.xplane.pb is truncated", "[location] is truncated"),
    ("3 of 4 hosts failed in tpu/s1: 1/2 steps", "3 of 4 hosts failed in tpu/s1: 1/2 steps"),
    ("profile is 0 bytes, gave up at 12:30:45", "profile is 0 bytes, gave up at 12:30:45"),
])
def test_the_reason_an_analysis_viewer_reads(text: str, shown: str) -> None:
    from mldiag.console.views import without_locations

    assert without_locations(text) == shown


def _asgi_post(app: Any, path: str, headers: list[tuple[bytes, bytes]], chunk: int,
               total: int) -> tuple[int, int, bytes, dict[bytes, bytes]]:
    """POST a chunked body of `total` bytes to `app` directly: (status, bytes the app
    read, response body, response headers)."""
    read = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        if read >= total:
            return {"type": "http.disconnect"}
        read += chunk
        return {"type": "http.request", "body": b"{" * chunk, "more_body": read < total}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5000),
             "server": ("127.0.0.1", 8790),
             "headers": [(b"host", b"127.0.0.1:8790"), (b"transfer-encoding", b"chunked"),
                         *headers]}
    # In a thread of its own: the browser tests' session-wide playwright keeps an event loop
    # running in this thread, and asyncio.run refuses to nest in it.
    worker = threading.Thread(target=lambda: asyncio.run(app(scope, receive, send)))
    worker.start()
    worker.join()
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], read, body, dict(start["headers"])


@pytest.mark.parametrize("path,who,content_type", [
    ("/api/v1/runs/tpu/captures", "", b"application/json"),
    ("/api/v1/runs/tpu/baseline", "viewer", b"application/json"),
    ("/login", "", b"application/x-www-form-urlencoded"),
])
def test_a_large_chunked_body_is_refused_reading_at_most_the_cap(
        site: Site, path: str, who: str, content_type: bytes) -> None:
    chunk, total = 64 * 1024, 200 * 1024**2
    headers = [(b"content-type", content_type)]
    if who:
        headers.append((b"authorization", f"Bearer {site.tokens[who]}".encode()))
    status, read, body, response_headers = _asgi_post(site.client.app, path, headers, chunk,
                                                      total)
    assert status == 413
    assert read <= MAX_BODY + chunk
    assert b"request body over 1 MiB" in body
    assert response_headers[b"x-content-type-options"] == b"nosniff"


def test_a_body_over_the_cap_by_its_length_is_refused_before_auth(site: Site) -> None:
    big = b'{"session": "x", "targets": ["' + b"a" * (2 * 1024**2) + b'"]}'
    for headers in ({}, site.auth("viewer")):
        r = site.client.post("/api/v1/runs/tpu/captures", content=big,
                             headers={**headers, "Content-Type": "application/json"})
        assert r.status_code == 413, r.text
        assert r.json() == {"detail": "request body over 1 MiB"}
        assert "frame-ancestors" in r.headers["content-security-policy"]
    page = site.client.post("/login", content=b"token=" + b"a" * (2 * 1024**2),
                            headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert page.status_code == 413 and "request body over 1 MiB" in page.text


def test_the_largest_legitimate_body_fits_under_the_cap(site: Site) -> None:
    body = {"session": "many-targets", "targets": ["h" * 255] * 1024, "duration_s": 1}
    assert len(json.dumps(body)) < MAX_BODY
    r = site.client.post("/api/v1/runs/tpu/captures", json=body, headers=site.auth("editor"))
    assert r.status_code not in (413, 500), r.text


def test_an_unhandled_error_is_a_short_500_with_the_headers(
        site: Site, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(site.console)

    @app.get("/boom")
    @app.get("/api/v1/boom")
    def boom() -> None:
        raise RuntimeError("secret detail at /srv/mldiag/state.db")

    client = TestClient(app, base_url="http://127.0.0.1:8790")
    with caplog.at_level(logging.ERROR):
        for path in ("/boom", "/api/v1/boom"):
            r = client.get(path, headers=site.auth("viewer"))
            assert r.status_code == 500, path
            assert "frame-ancestors" in r.headers["content-security-policy"], path
            assert r.headers["x-content-type-options"] == "nosniff", path
            assert r.headers["referrer-policy"] == "no-referrer", path
            assert "secret detail" not in r.text and "Traceback" not in r.text, path
            assert len(r.content) < 4000, path
        assert r.json() == {"detail": "internal error (logged on the server)"}
    logged = [rec for rec in caplog.records if rec.exc_info]
    assert len(logged) == 2
    assert all("secret detail" in str(rec.exc_info[1]) for rec in logged if rec.exc_info)
    client.close()


def test_state_files_and_the_bucket_are_owner_only_whatever_the_umask(
        tmp_path: Path) -> None:
    from mldiag.adapters.local.access import SqliteAccessStore
    from mldiag.adapters.local.state import SqliteStateStore
    from mldiag.adapters.local.storage import LocalDirStorage

    home = tmp_path / "new" / "home"
    old = os.umask(0o002)
    try:
        state = SqliteStateStore(home / "state.db")
        access = SqliteAccessStore(home / "state.db")
        state.ensure_run("r", discovered=True)
        create_token(access, role="viewer", now=time.time())
        storage = LocalDirStorage(home / "bucket")
        storage.write_bytes("r/plugins/profile/s/a.xplane.pb", b"x")
        src = tmp_path / "outside.pb"
        src.write_bytes(b"y")
        storage.put_file("r/plugins/profile/s2/b.xplane.pb", src)
    finally:
        os.umask(old)
    dirs = [home, home / "bucket", *(p for p in (home / "bucket").rglob("*") if p.is_dir())]
    files = [p for p in home.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"state.db", "state.db-wal", "state.db-shm",
                                       "a.xplane.pb", "b.xplane.pb"}
    for d in dirs:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def test_a_state_db_made_readable_by_others_is_made_owner_only(tmp_path: Path) -> None:
    from mldiag.adapters.local.state import SqliteStateStore

    path = tmp_path / "state.db"
    path.touch(mode=0o644)
    os.chmod(path, 0o644)
    SqliteStateStore(path).list_runs()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
