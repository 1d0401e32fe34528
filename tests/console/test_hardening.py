"""Issue 34's console holes: sign-ins revoked by lineage, a private viewer cache, header
timeouts, share links bound to their session, and what analysis_viewer may read."""

from __future__ import annotations

import html
import json
import os
import re
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mldiag.access import ShareLink, create_token, hash_secret, new_id, new_secret, share_path
from mldiag.analysis import render_diff_html, render_summary_html
from mldiag.cli.main import main as cli
from mldiag.console.app import create_app
from mldiag.console.auth import COOKIE
from mldiag.console.context import Console, build_console, ensure_local_admin
from mldiag.console.server import ConsoleServer
from mldiag.model import SessionRecord
from mldiag.settings import Settings
from mldiag.viewer_cache import session_dir
from tests.console.conftest import Site
from tests.helpers.wait import wait_until

XP = "/runs/tpu/sessions/s2/xprof/data/plugin/profile"
S1 = "/runs/tpu/sessions/s1"


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_the_viewer_cache_is_owner_only_whatever_the_umask(site: Site, umask_022: None
                                                           ) -> None:
    viewer = site.auth("viewer")
    tools = site.client.get(f"{XP}/data?tag=overview_page&run=s2&host=tpu_inference_2",
                            headers=viewer)
    assert tools.status_code == 200, tools.text[:300]
    r = site.client.get("/runs/tpu/sessions/s2/hosts/tpu_inference_2/xplane.pb", headers=viewer)
    assert r.status_code == 200
    root = site.console.viewers.root
    # The bucket's own objects, hard-linked in, keep the modes their writer gave them (the
    # fixture's drops are 0644) inside the bucket's 0700 directory.
    bucket = {(p.stat().st_dev, p.stat().st_ino) for p in (site.home / "bucket").rglob("*")}
    paths = [p for p in [root, *root.rglob("*")]
             if (p.stat().st_dev, p.stat().st_ino) not in bucket]
    assert len(paths) > 10
    loose = [f"{oct(stat.S_IMODE(p.stat().st_mode))} {p.relative_to(root.parent)}"
             for p in paths if stat.S_IMODE(p.stat().st_mode) & 0o077]
    assert not loose, loose


@pytest.fixture
def local(tmp_path: Path) -> Iterator[tuple[Console, TestClient]]:
    """A console of its own home (its own admin.token), no pipeline."""
    console = build_console(Settings(home=tmp_path / "home"))
    client = TestClient(create_app(console), base_url="http://127.0.0.1:8790")
    try:
        yield console, client
    finally:
        client.close()


def _cookie(client: TestClient, r: object) -> dict[str, str]:
    cookies = {COOKIE: r.cookies[COOKIE]}  # type: ignore[attr-defined]
    client.cookies.clear()
    return cookies


def test_revoking_the_admin_token_ends_the_sign_ins_made_with_it(
        local: tuple[Console, TestClient], capsys: pytest.CaptureFixture[str]) -> None:
    console, client = local
    _, code = ensure_local_admin(console)
    path = console.settings.home / "admin.token"
    admin = path.read_text().strip()
    record = console.access.find_token(hash_secret(admin))
    assert record is not None and record.principal == "local-admin"
    pasted = _cookie(client, client.post("/login", data={"token": admin},
                                         follow_redirects=False))
    by_url = _cookie(client, client.get(f"/login?code={code}", follow_redirects=False))
    for cookies in (pasted, by_url):
        assert client.get("/api/v1/tokens", cookies=cookies).status_code == 200
    assert cli(["tokens", "revoke", record.id, "--home", str(console.settings.home)]) == 0
    for cookies in (pasted, by_url):
        assert client.get("/api/v1/runs", cookies=cookies).status_code == 401
        # Nor can it mint a token that would outlive it.
        page = client.get("/login", cookies=cookies)
        minted = client.post("/api/v1/tokens", cookies=cookies, json={"role": "admin"},
                             headers={"X-CSRF-Token": "x"})
        assert page.status_code == 200 and minted.status_code == 401, minted.text
    # The next start rotates it: a new admin token in the file, the old sign-ins stay dead.
    created, code = ensure_local_admin(console)
    assert created is not None and path.read_text().strip() == created != admin
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    fresh = _cookie(client, client.get(f"/login?code={code}", follow_redirects=False))
    assert client.get("/api/v1/tokens", cookies=fresh).status_code == 200
    assert client.get("/api/v1/runs", cookies=by_url).status_code == 401
    # A start that finds it valid keeps it.
    assert ensure_local_admin(console)[0] is None and path.read_text().strip() == created


def _closed(conn: socket.socket) -> bool:
    """Whether the server has closed `conn` (its end read, or the connection reset)."""
    try:
        return conn.recv(4096) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_a_trickling_or_idle_client_is_cut_off(tmp_path: Path) -> None:
    server = ConsoleServer(build_console(Settings(home=tmp_path / "home")), "127.0.0.1", 0,
                           read_timeout_s=1.0, idle_timeout_s=1.0)
    server.start()
    try:
        address = ("127.0.0.1", server.port)
        trickler, silent = socket.create_connection(address), socket.create_connection(address)
        for conn in (trickler, silent):
            conn.setblocking(False)
        trickler.sendall(b"GET /login HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        started = time.monotonic()
        # A header line every 0.1 s, never the blank line that ends them.
        for i in range(300):
            if _closed(trickler):
                break
            try:
                trickler.sendall(f"X-Slow-{i}: a\r\n".encode())
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.1)
        else:
            raise AssertionError("30 s of trickled headers and the connection is still open")
        assert time.monotonic() - started < 5
        wait_until(lambda: _closed(silent), timeout=5, what="the silent connection closed")
        # A client that asks in time is answered, and its idle connection then closed.
        with socket.create_connection(address) as ok:
            ok.sendall(b"GET /login HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert ok.recv(4096).startswith(b"HTTP/1.1 200 ")
            ok.setblocking(False)
            wait_until(lambda: _closed(ok), timeout=5, what="the idle connection closed")
    finally:
        server.stop()


def test_a_share_link_does_not_open_a_session_that_reuses_its_names(
        local: tuple[Console, TestClient]) -> None:
    console, client = local
    state = console.plane.state
    admin = {"Authorization": "Bearer " + create_token(console.access, role="admin",
                                                       now=time.time())[0]}

    def make_session() -> None:
        now = time.time()
        state.ensure_run("r", discovered=False, now=now)
        state.create_session(SessionRecord(run="r", session="s", state="REPORTED",
                                           created_at=now, updated_at=now))

    make_session()
    r = client.post("/api/v1/runs/r/sessions/s/share", json={"anyone": True}, headers=admin)
    assert r.status_code == 201, r.text
    path = r.json()["url"].removeprefix(console.settings.console_url)
    # One made before links recorded their session: it opens a session created before it.
    legacy = new_secret("x")
    console.access.put_link(ShareLink(id=new_id(), token_hash=hash_secret(legacy), run="r",
                                      session="s", anyone=True, created_by="local-admin",
                                      created_at=time.time(), expires_at=time.time() + 3600))
    old = share_path(legacy, "r", "s")
    assert client.get(f"{path}/state").status_code == 200
    assert client.get(f"{old}/state").status_code == 200
    assert cli(["machine-learning-run", "delete", "r", "--home",
                str(console.settings.home)]) == 0
    wait_until(lambda: time.time() > console.access.list_links()[0].created_at, timeout=1)
    make_session()  # the same names, another session
    for link in (path, old):
        r = client.get(f"{link}/state")
        assert r.status_code == 404 and "no such link" in r.text, link


REASON = "capture failed on 127.0.0.1:46115: deadline exceeded"


def test_analysis_viewer_reads_reports_and_diffs_without_addresses_or_paths(
        site: Site) -> None:
    storage, state = site.runtime.storage, site.runtime.state
    s1 = state.get_session("tpu", "s1")
    assert s1 is not None
    # The latest report, and its version's (what compares read).
    bases = [f"{session_dir(s1)}/analysis", f"{session_dir(s1)}/analysis/v{s1.reported_version}"]
    names = ("analysis.json", "health_snapshot.json", "summary.html")
    saved = {f"{b}/{n}": storage.read_bytes(f"{b}/{n}") for b in bases for n in names}
    for base in bases:
        analysis, snapshot = (json.loads(saved[f"{base}/{n}"]) for n in names[:2])
        # A capture that failed on one host, as the analysis stage records it, and a summary
        # that quotes it (as the straggler rule does).
        for doc in (analysis, snapshot):
            doc["session"]["capture"]["failed_hosts"] = {"worker-1": REASON}
        analysis["summary"] = f"Left out: worker-1 ({REASON}). Steps from train.py:183."
        storage.write_bytes(f"{base}/analysis.json", json.dumps(analysis).encode())
        storage.write_bytes(f"{base}/health_snapshot.json", json.dumps(snapshot).encode())
        storage.write_bytes(f"{base}/summary.html",
                            render_summary_html(analysis, snapshot).encode())
    bucket = str(site.home / "bucket")
    # An alert-triggered session's stored diff against its baseline, as the pipeline writes it
    # (its page shows no failure reasons or paths today; the analysis_viewer's is redrawn from
    # diff.json redacted all the same).
    diff = site.client.get("/api/v1/runs/tpu/compare?a=s2&b=s1", headers=site.auth("admin"))
    storage.write_bytes(f"{bases[0]}/diff.json", diff.content)
    storage.write_bytes(f"{bases[0]}/diff.html", render_diff_html(diff.json()).encode())
    try:
        def read(path: str, who: str) -> str:
            r = site.client.get(path, headers=site.auth(who))
            assert r.status_code == 200, (path, who, r.text[:200])
            return html.unescape(r.text).replace("\\/", "/")

        paths = [f"{S1}/report", f"{S1}/diff.html", "/api/v1/runs/tpu/compare?a=s2&b=s1",
                 "/runs/tpu/compare/diff.html?a=s2&b=s1", f"{S1}", "/api/v1/runs/tpu/sessions/s1",
                 "/runs/tpu/compare?a=s2&b=s1"]
        for path in paths:
            hidden = read(path, "analysis_viewer")
            assert "46115" not in hidden and bucket not in hidden, (path, re.findall(
                r".{40}(?:46115|" + re.escape(bucket) + ").{40}", hidden))
        report = read(f"{S1}/report", "analysis_viewer")
        assert "Host worker-1 not analysed: capture failed on [address]: deadline exceeded" \
            in report
        assert "train.py:183" in report  # only the locations the documents hold change
        compare = site.client.get("/api/v1/runs/tpu/compare?a=s2&b=s1",
                                  headers=site.auth("analysis_viewer")).json()
        assert "[address]" in json.dumps(compare) and "[location]" in json.dumps(compare)
        for who in ("viewer", "editor"):
            assert REASON in read(f"{S1}/report", who)
            assert REASON in read("/api/v1/runs/tpu/compare?a=s2&b=s1", who)
            assert bucket in read("/api/v1/runs/tpu/compare?a=s2&b=s1", who)
            assert REASON in read("/api/v1/runs/tpu/sessions/s1", who)
    finally:
        for name, data in saved.items():
            storage.write_bytes(name, data)
        for name in ("diff.json", "diff.html"):
            storage.delete(f"{bases[0]}/{name}")


def test_a_target_registered_without_a_name_is_not_named_by_its_address(
        local: tuple[Console, TestClient]) -> None:
    console, client = local
    console.plane.state.ensure_run("r", discovered=False, now=time.time())
    editor = {"Authorization": "Bearer " + create_token(console.access, role="editor",
                                                        now=time.time())[0]}
    with socket.socket() as bound:  # bound, not listening: registered and down
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        names = [client.post("/api/v1/runs/r/targets", headers=editor,
                             json={"address": f"127.0.0.1:{port}"}) for _ in range(2)]
    assert all(r.status_code == 201 for r in names), names[0].text
    name = names[0].json()["host"]
    assert re.fullmatch(r"target-[0-9a-f]{8}", name) and str(port) not in name
    assert names[1].json()["host"] == name  # registered again: the same target
    assert [t.host for t in console.plane.state.list_targets("r")] == [name]
