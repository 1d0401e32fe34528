"""The console's lists for real use (issue 35, items 7 and 8): server-side search, filters,
sort and pages of runs and sessions; the run page leads with its sessions and says why it
cannot capture; a session page says its verdict once, draws inline Markdown and shows no raw
dicts; times carry their UTC value for the browser's script, and read without it."""

from __future__ import annotations

import json
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
from mldiag.model import CAPTURING, FAILED, MetricPoint, SessionRecord, TargetRecord
from mldiag.settings import Settings
from tests.helpers.regression import RUN, report, reported, session_dir

APP = "http://127.0.0.1:8790"
BULK = 62  # more than a page (50)


class Site:
    def __init__(self, client: TestClient, token: str, rt: object) -> None:
        self.client, self.token, self.rt = client, token, rt

    def get(self, path: str) -> object:
        return self.client.get(path, headers={"Authorization": f"Bearer {self.token}"})


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    home: Path = tmp_path_factory.mktemp("lists") / "home"
    settings = Settings(home=home, prebuild_viewer=False)
    rt = bootstrap(settings)
    rt.state.ensure_run(RUN, discovered=False, now=1.0)
    reported(rt, "healthy", "OPTIMAL", 1.0)
    report(rt, "auto-1")
    # A verdict in Markdown, as an investigator may write it.
    doc = json.loads(rt.storage.read_bytes(f"{session_dir('healthy')}/analysis/v1/analysis.json"))
    doc["summary"] = "Use `jax.jit` on **every** step <b>now</b>."
    rt.storage.write_bytes(f"{session_dir('healthy')}/analysis/analysis.json",
                           json.dumps(doc).encode())
    for i in range(BULK):
        rt.state.create_session(SessionRecord(
            run=RUN, session=f"bulk-{i:03d}", state=FAILED if i % 2 else CAPTURING,
            trigger="alert" if i % 3 == 0 else "manual", created_at=100.0 + i,
            updated_at=100.0 + i, reason="no host arrived"))
    for i, run in enumerate(("llama-a", "llama-b", "gemma")):
        rt.state.ensure_run(run, discovered=True, now=10.0 + i)
    rt.state.record_metrics(RUN, [MetricPoint(
        name="mldiag_alert", value=None, at=2.0, host="h0", step=None,
        body={"summary": "step time 102.6 ms is 508% above the baseline 16.9 ms"})])
    plane = ControlPlane(settings=settings, state=rt.state, storage=rt.storage,
                         bus=rt.services.bus)
    console = build_console(settings, plane=plane)
    token = create_token(console.access, principal="token:editor", role="editor",
                         now=time.time())[0]
    with TestClient(create_app(console), base_url=APP) as client:
        yield Site(client, token, rt)


def rows(html: str) -> list[str]:
    return re.findall(r'<tr data-session="([^"]+)"', html)


def test_a_run_s_sessions_come_a_page_at_a_time_newest_first(site: Site) -> None:
    page = site.get(f"/runs/{RUN}").text
    first = rows(page)
    assert len(first) == 50 and first[:2] == ["bulk-061", "bulk-060"]
    nxt = re.search(r'<a href="([^"]+)" rel="next">', page)
    assert nxt is not None
    second = rows(site.get(nxt.group(1).replace("&amp;", "&")).text)
    assert second[-2:] == ["auto-1", "healthy"] and len(first) + len(second) == BULK + 2
    assert not set(first) & set(second)
    api = site.get(f"/api/v1/runs/{RUN}/sessions?limit=5&sort=oldest")
    assert [s["session"] for s in api.json()] == ["healthy", "auto-1", "bulk-000", "bulk-001",
                                                 "bulk-002"]
    link = re.fullmatch(r'<([^>]+)>; rel="next"', api.headers["link"])
    assert link is not None
    more = site.get(link.group(1)).json()
    assert more[0]["session"] == "bulk-003" and len(more) == 5


def test_sessions_are_searched_and_filtered_on_the_server(site: Site) -> None:
    found = rows(site.get(f"/runs/{RUN}?q=auto").text)
    assert found == ["auto-1"]
    failed_alerts = rows(site.get(f"/runs/{RUN}?state=FAILED&trigger=alert").text)
    assert failed_alerts == [f"bulk-{i:03d}" for i in range(BULK - 1, -1, -1)
                             if i % 2 and i % 3 == 0]
    assert rows(site.get(f"/runs/{RUN}?verdict=OPTIMAL").text) == ["healthy"]
    # Created on 1970-01-01 (UTC): everything here; on the 2nd, nothing.
    assert len(rows(site.get(f"/runs/{RUN}?from=1970-01-01&to=1970-01-01&limit=200").text)) \
        == BULK + 2
    empty = site.get(f"/runs/{RUN}?from=1970-01-02").text
    assert rows(empty) == [] and "No session of this run matches" in empty
    # Across runs, with the run as a filter.
    assert rows(site.get("/sessions?q=healthy").text) == ["healthy"]
    assert len(rows(site.get(f"/sessions?run={RUN}&trigger=manual&limit=7").text)) == 7
    for bad in ("sort=size", "state=DONE", "from=yesterday", "limit=0", "cursor=zzz",
                "sort=name&from=2026-01-01"):
        r = site.get(f"/runs/{RUN}?{bad}")
        assert r.status_code == 422, bad
        assert site.get(f"/api/v1/runs/{RUN}/sessions?{bad}").status_code == 422, bad


def test_runs_are_searched_sorted_and_paged(site: Site) -> None:
    runs = site.get("/api/v1/runs?sort=name&limit=2")
    assert [r["name"] for r in runs.json()] == ["gemma", "llama-a"]
    assert "rel=\"next\"" in runs.headers["link"]
    assert [r["name"] for r in site.get("/api/v1/runs?q=llama").json()] == ["llama-b",
                                                                          "llama-a"]
    page = site.get("/?q=train").text
    assert re.findall(r'<tr data-run="([^"]+)"', page) == [RUN]
    # The newest session and the last verdict, read with one-row queries.
    (row,) = site.get(f"/api/v1/runs?q={RUN}").json()
    assert row["latest"]["session"] == "bulk-061" and row["last_verdict"] == "NEEDS_ATTENTION"


def test_the_run_page_leads_with_its_sessions_and_says_why_it_cannot_capture(
        site: Site) -> None:
    page = site.get(f"/runs/{RUN}").text
    assert page.index('id="sessions"') < page.index('id="step-time"') < page.index(
        'id="actions"')
    capture = re.search(r'<button type="submit"( disabled[^>]*)?>Capture</button>', page)
    assert capture is not None and capture.group(1)
    assert "No live target" in page
    now = time.time()
    site.rt.state.upsert_target(TargetRecord(  # type: ignore[attr-defined]
        run=RUN, host="h0", address="127.0.0.1", port=9, delivery="pull",
        last_heartbeat=now, registered_at=now))
    try:
        page = site.get(f"/runs/{RUN}").text
        assert '<button type="submit">Capture</button>' in page and "No live target" not in page
    finally:
        site.rt.state.delete_target(RUN, "h0")  # type: ignore[attr-defined]


def test_a_session_page_says_its_verdict_once_and_draws_markdown(site: Site) -> None:
    page = site.get(f"/runs/{RUN}/sessions/auto-1").text
    doc = json.loads(site.rt.storage.read_bytes(  # type: ignore[attr-defined]
        f"{session_dir('auto-1')}/analysis/analysis.json"))
    headline = doc["regression"]["headline"]
    assert doc["summary"].startswith(headline)  # the analysis leads with it ...
    assert page.count(headline.split(";")[0]) == 1  # ... the page says it once
    assert 'id="what-changed"' in page and 'id="verdict"' in page
    # The report stays one click away, folded.
    assert re.search(r'<details class="report">\s*<summary>', page)

    healthy = site.get(f"/runs/{RUN}/sessions/healthy").text
    verdict = healthy[healthy.index('id="verdict"'):healthy.index('id="hosts"')]
    assert "<code>jax.jit</code>" in verdict and "<b>every</b>" in verdict
    assert "`" not in verdict and "**" not in verdict
    assert "&lt;b&gt;now&lt;/b&gt;" in verdict  # escaped first: markup in text stays text


def test_pages_show_no_raw_dicts_and_times_read_without_scripts(site: Site) -> None:
    page = site.get(f"/runs/{RUN}").text
    assert "step time 102.6 ms is 508% above the baseline 16.9 ms" in page
    for raw in ("{&#34;", "{&#39;", "{'", '{"', "False", "True", "None"):
        assert raw not in page, raw
    assert "Off: an alert on this run" in page
    # Sessions nothing asked for (their files created them) say so, not "programmatic".
    bulk = page[page.index('data-session="bulk-061"'):]
    assert "dropped in the bucket" in bulk[:bulk.index("</tr>")]
    assert "programmatic" not in page
    when = re.search(r'<time class="when" datetime="([^"]+)">([^<]+)</time>', page)
    assert when is not None
    assert when.group(1) == "1970-01-01T00:00:01+00:00" and when.group(2).endswith(" UTC")
    session = site.get(f"/runs/{RUN}/sessions/healthy").text
    for raw in ("{&#34;", "{&#39;", "False", "True"):
        assert raw not in session, raw
    assert "Analysis: <b>v1</b>" in session


def test_messages_draw_their_code_spans(site: Site) -> None:
    page = site.client.get("/login?code=login_used")
    assert page.status_code == 401
    message = re.search(r'<p class="err">(.*?)</p>', page.text)
    assert message is not None and "<code>mldiag up</code>" in message.group(1)
    assert "`" not in message.group(1)
