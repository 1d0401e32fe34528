"""Share links: scoped to one session, refused alike when forged, expired, revoked or used
for another session, restricted to signed-in openers unless `anyone`, logged on every use."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import pytest

from mldiag.access import ACCESS_WRITE_EVERY_S, AccessEntry, create_link, share_path
from tests.console.conftest import HOST, Site

S1 = "/runs/tpu/sessions/s1"


def _link(site: Site, *, anyone: bool, who: str = "admin", session: str = "s1") -> str:
    r = site.client.post(f"/api/v1/runs/tpu/sessions/{session}/share",
                         json={"anyone": anyone}, headers=site.auth(who))
    assert r.status_code == 201, r.text
    return urlsplit(r.json()["url"]).path


def test_an_anyone_link_opens_its_session_page_report_xprof_and_download(site: Site) -> None:
    path = _link(site, anyone=True)
    fresh = site.client  # no credentials are sent below
    page = fresh.get(path)
    assert page.status_code == 200
    assert page.headers["referrer-policy"] == "no-referrer"
    assert "tpu / s1" in page.text and "Open in XProf" in page.text
    assert fresh.get(f"{path}/report").status_code == 200
    assert fresh.get(f"{path}/xprof/data/plugin/profile/runs").json() == ["s1"]
    tools = fresh.get(f"{path}/xprof/data/plugin/profile/run_tools?run=s1").json()
    assert "overview_page" in tools and "trace_viewer@" in tools
    assert fresh.get(f"{path}/hosts/{HOST}/xplane.pb").status_code == 200
    # ... and nothing else: the rest of the console still needs a role.
    assert fresh.get("/runs/tpu").status_code == 401
    assert fresh.get("/runs/tpu/sessions/s2").status_code == 401


def test_a_restricted_link_needs_a_signed_in_opener_who_gets_that_session_only(
        site: Site) -> None:
    path = _link(site, anyone=False, who="editor")
    assert site.client.get(path).status_code == 401
    # Signed in with a role on another run only: the link still opens this session.
    other = site.auth("viewer_other")
    assert site.client.get(path, headers=other).status_code == 200
    assert site.client.get(f"{path}/report", headers=other).status_code == 200
    assert site.client.get(S1, headers=other).status_code == 403


def test_forged_expired_revoked_and_cross_session_links_get_the_same_404(site: Site) -> None:
    now = time.time()
    good = _link(site, anyone=True)
    secret = good.split("/")[2]
    # Expired: made 8 days ago with the default 7-day expiry.
    s1 = site.runtime.state.get_session("tpu", "s1")
    assert s1 is not None
    expired_secret, _ = create_link(site.console.access, "tpu", "s1", created_by="t",
                                    now=now - 8 * 86400, anyone=True,
                                    session_created_at=s1.created_at)
    revoked_path = _link(site, anyone=True)
    link_id = next(li.id for li in site.console.access.list_links(run="tpu", session="s1")
                   if share_path(revoked_path.split("/")[2], "tpu", "s1") == revoked_path)
    assert site.client.get(revoked_path).status_code == 200
    r = site.client.delete(f"/api/v1/share/{link_id}", headers=site.auth("admin"))
    assert r.status_code == 200
    refused = {
        "forged": share_path("A" * 22, "tpu", "s1"),
        "expired": share_path(expired_secret, "tpu", "s1"),
        "revoked": revoked_path,
        "other session": share_path(secret, "tpu", "s2"),
        "other run": share_path(secret, "other", "o1"),
    }
    bodies = set()
    for why, path in refused.items():
        for sub in ("", "/report", "/xprof/data/plugin/profile/runs"):
            r = site.client.get(path + sub, headers={"Accept": "text/html"})
            assert r.status_code == 404, (why, sub, r.status_code)
            bodies.add((sub, r.text))
    # One answer per sub-route, whichever the reason.
    assert len(bodies) == 3


def test_every_use_of_a_link_is_logged_with_its_principal(site: Site) -> None:
    path = _link(site, anyone=True)
    link = next(li for li in site.console.access.list_links(run="tpu", session="s1")
                if share_path(path.split("/")[2], "tpu", "s1") == path)
    site.client.get(path)
    site.client.get(f"{path}/report", headers=site.auth("viewer_other"))
    log = site.client.get(f"/api/v1/share/{link.id}/access", headers=site.auth("admin")).json()
    assert [e["principal"] for e in log][:2] == [site.ids["viewer_other"], "anonymous"]
    assert all(e["link_id"] == link.id and e["at"] for e in log)
    assert log[0]["path"].endswith("/report")


def test_uses_of_an_anyone_link_are_counted_in_one_row_not_appended(
        site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _link(site, anyone=True)
    link = next(li for li in site.console.access.list_links(run="tpu", session="s1")
                if share_path(path.split("/")[2], "tpu", "s1") == path)
    writes: list[AccessEntry] = []
    log_access = site.console.access.log_access
    monkeypatch.setattr(site.console.access, "log_access",
                        lambda e: (writes.append(e), log_access(e)))
    started = time.monotonic()
    for _ in range(300):
        assert site.client.get(f"{path}/state").status_code == 200
    elapsed = time.monotonic() - started
    # A write per row every ACCESS_WRITE_EVERY_S, not one per request.
    assert 1 <= len(writes) <= 2 + elapsed / ACCESS_WRITE_EVERY_S, len(writes)
    log = site.client.get(f"/api/v1/share/{link.id}/access", headers=site.auth("admin")).json()
    assert [(e["principal"], e["count"]) for e in log] == [("anonymous", 300)]
    assert log[0]["first_at"] <= log[0]["at"] and log[0]["path"].endswith("/state")


def test_links_expire_within_30_days_and_revocation_is_for_creator_or_admin(
        site: Site) -> None:
    r = site.client.post(f"/api/v1{S1}/share", json={"expires_s": 31 * 86400},
                         headers=site.auth("admin"))
    assert r.status_code == 422
    path = _link(site, anyone=False, who="admin")
    link = next(li for li in site.console.access.list_links(run="tpu", session="s1")
                if share_path(path.split("/")[2], "tpu", "s1") == path)
    assert round((link.expires_at - link.created_at) / 86400) == 7
    # An editor did not create it: it cannot revoke it (nor learn it exists).
    assert site.client.delete(f"/api/v1/share/{link.id}",
                              headers=site.auth("editor")).status_code == 404
    assert site.client.delete(f"/api/v1/share/{link.id}",
                              headers=site.auth("admin")).status_code == 200
