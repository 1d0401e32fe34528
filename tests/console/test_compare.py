"""The console's compare view of two sessions of a run, the link from an alert-triggered
session to its diff, and pinning a run's baseline (editors)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mldiag.access import create_token
from mldiag.bootstrap import ControlPlane, bootstrap
from mldiag.console.app import create_app
from mldiag.console.context import build_console
from mldiag.settings import Settings
from tests.helpers.regression import RUN, report, reported

APP = "http://127.0.0.1:8790"


class Site:
    def __init__(self, client: TestClient, tokens: dict[str, str]) -> None:
        self.client, self.tokens = client, tokens

    def get(self, path: str, who: str = "viewer") -> object:
        return self.client.get(path, headers={"Authorization": f"Bearer {self.tokens[who]}"})

    def post(self, path: str, body: object, who: str) -> object:
        return self.client.post(path, json=body,
                                headers={"Authorization": f"Bearer {self.tokens[who]}"})


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    home: Path = tmp_path_factory.mktemp("compare") / "home"
    settings = Settings(home=home, prebuild_viewer=False)
    rt = bootstrap(settings)
    rt.state.ensure_run(RUN, discovered=False)
    reported(rt, "healthy", "OPTIMAL", 1.0)
    report(rt, "auto-1")
    report(rt, "manual-1", trigger="manual", created_at=6.0)
    plane = ControlPlane(settings=settings, state=rt.state, storage=rt.storage,
                         bus=rt.services.bus)
    console = build_console(settings, plane=plane)
    tokens = {role: create_token(console.access, principal=f"token:{role}", role=role,
                                 now=time.time())[0]
              for role in ("analysis_viewer", "viewer", "editor")}
    with TestClient(create_app(console), base_url=APP) as client:
        yield Site(client, tokens)


def test_an_alert_triggered_session_links_to_its_diff(site: Site) -> None:
    page = site.get(f"/runs/{RUN}/sessions/auto-1", "analysis_viewer").text
    assert 'id="what-changed"' in page and "waits longer for the host" in page
    assert f'href="/runs/{RUN}/sessions/auto-1/diff.html"' in page
    assert f'href="/runs/{RUN}/compare?a=healthy&amp;b=auto-1"' in page
    diff = site.get(f"/runs/{RUN}/sessions/auto-1/diff.html", "analysis_viewer")
    assert diff.status_code == 200 and "<h2>What changed</h2>" in diff.text
    # Served like the report: sandboxed, its one style block by hash, no script.
    assert diff.headers["content-security-policy"].startswith("sandbox; default-src 'none'")
    # A session captured by hand was not compared: no section, and no diff.
    assert 'id="what-changed"' not in site.get(f"/runs/{RUN}/sessions/manual-1").text
    assert site.get(f"/runs/{RUN}/sessions/manual-1/diff.html").status_code == 404


def test_any_two_sessions_of_a_run_can_be_compared(site: Site) -> None:
    run_page = site.get(f"/runs/{RUN}").text
    assert f'action="/runs/{RUN}/compare"' in run_page
    page = site.get(f"/runs/{RUN}/compare?a=healthy&b=manual-1", "analysis_viewer")
    assert page.status_code == 200
    assert "step time rose from 10.00 to 50.00 ms" in page.text
    frame = re.search(r'<iframe class="report" src="([^"]+)"', page.text)
    assert frame is not None
    diff = site.client.get(frame.group(1).replace("&amp;", "&"),
                           headers={"Authorization": f"Bearer {site.tokens['viewer']}"})
    assert diff.status_code == 200 and "healthy → " in diff.text
    api = site.get(f"/api/v1/runs/{RUN}/compare?a=healthy&b=manual-1").json()
    assert api["explanation"][0]["kind"] == "host_wait"
    assert api["a"]["label"] == f"{RUN}/healthy"
    assert site.get(f"/api/v1/runs/{RUN}/compare?a=healthy&b=ghost").status_code == 404


def test_editors_pin_the_baseline_from_the_run_page(site: Site) -> None:
    viewer_page = site.get(f"/runs/{RUN}", "viewer").text
    assert "set as baseline" not in viewer_page
    editor_page = site.get(f"/runs/{RUN}", "editor").text
    assert "set as baseline" in editor_page
    assert f'data-api="/api/v1/runs/{RUN}/baseline"' in editor_page
    assert site.post(f"/api/v1/runs/{RUN}/baseline", {"session": "manual-1"},
                     "viewer").status_code == 403
    r = site.post(f"/api/v1/runs/{RUN}/baseline", {"session": "manual-1"}, "editor")
    assert r.status_code == 200 and r.json()["baseline"] == "manual-1"
    page = site.get(f"/runs/{RUN}", "editor").text
    assert ('manual-1</a> <span class="chip" title="alert-triggered sessions of this run are '
            'compared with it">baseline</span>') in page
    assert site.get(f"/api/v1/runs/{RUN}").json()["baseline"] == "manual-1"
    assert site.post(f"/api/v1/runs/{RUN}/baseline", {"session": "ghost"},
                     "editor").status_code == 404
    assert site.post(f"/api/v1/runs/{RUN}/baseline", {}, "editor").json()["baseline"] == ""
