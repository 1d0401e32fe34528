"""The run page charts the step time the workload recorded (metrics.record), with the alerts
and captures marked, as inline SVG under the console's CSP (no script, no inline style)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mldiag.access import ALL_RUNS, create_token
from mldiag.bootstrap import control_plane
from mldiag.console.app import create_app
from mldiag.console.charts import MAX_VERTICES, step_time_chart
from mldiag.console.context import build_console
from mldiag.model import CAPTURING, REPORTED, MetricPoint, RunRecord, SessionRecord
from mldiag.settings import Settings

T0 = 1_796_000_000.0


def steps(host: str, n: int, *, start: float = T0, slow_after: int | None = None
          ) -> list[MetricPoint]:
    return [MetricPoint(name="step_time", at=start + 0.1 * i, step=i, host=host,
                        value=0.5 if slow_after is not None and i >= slow_after else 0.1,
                        labels={"unit": "s"}) for i in range(n)]


@pytest.fixture
def page_client(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str], Settings]]:
    settings = Settings(home=tmp_path / "home")
    plane = control_plane(settings)
    console = build_console(settings, plane=plane)
    secret, _ = create_token(console.access, principal="token:viewer", role="viewer",
                             run=ALL_RUNS, now=time.time())
    with TestClient(create_app(console), base_url="http://127.0.0.1:8790") as client:
        yield client, {"Authorization": f"Bearer {secret}"}, settings


def test_the_run_page_charts_step_time_with_alerts_and_captures(
        page_client: tuple[TestClient, dict[str, str], Settings]) -> None:
    client, auth, settings = page_client
    state = control_plane(settings).state
    state.register_run(RunRecord(name="train", created_at=T0))
    state.record_metrics("train", steps("h0", 100, slow_after=60) + steps("h1", 100))
    state.record_metrics("train", [
        MetricPoint(name="mldiag_alert", at=T0 + 7.0, host="h0",
                    body={"summary": "step time 500.0 ms is 400% above the baseline 100.0 ms"}),
        MetricPoint(name="loss", at=T0 + 1, value=2.5, step=10),
        MetricPoint(name="<img src=x>", at=T0 + 2, value=1.0),
    ])
    state.create_session(SessionRecord(run="train", session="auto-1", state=CAPTURING,
                                       kind="snapshot", trigger="alert", created_at=T0 + 7.5,
                                       note="alert mldiag-monitor: step time regressed"))
    state.create_session(SessionRecord(run="train", session="warm", state=REPORTED,
                                       created_at=T0 + 1.0))
    # A Cloud Monitoring incident's capture: no monitor alert before it.
    state.create_session(SessionRecord(run="train", session="cm-1", state=REPORTED,
                                       kind="on_demand", trigger="alert", created_at=T0 + 2.0,
                                       note="incident 0.nxk2p9q: step_time above 0.25 s"))

    r = client.get("/runs/train", headers=auth)
    assert r.status_code == 200
    html = r.text
    chart = html[html.index('<svg class="stepchart"'):html.index("</svg>")]
    assert len(re.findall(r"<polyline ", chart)) == 2  # one line per host
    assert "h0: 100 step(s), median 100.0 ms" in chart and "h1: 100 step(s)" in chart
    # Two alerts: the monitor's own (recorded with the metrics; the snapshot it triggered just
    # after is that alert, not another) and the Cloud Monitoring incident behind cm-1.
    assert chart.count('class="alert"') == 2
    assert "400% above the baseline" in chart and "incident 0.nxk2p9q" in chart
    # Every capture is a link to its session.
    assert chart.count('class="capture"') == 3
    for session in ("auto-1", "warm", "cm-1"):
        assert f'href="/runs/train/sessions/{session}"' in chart
    assert "capture auto-1 at" in chart and "(snapshot, alert): CAPTURING" in chart
    # Under the console's CSP: no script and no style attribute; recorded names escaped.
    assert "<script" not in chart and " style=" not in html.split("<body", 1)[1]
    assert "&lt;img src=x&gt;" in html and "<img src=x>" not in html
    assert re.search(r">loss</td><td data-label=\"Unit\">1</td><td class=\"num\" "
                     r"data-label=\"Points\">1</td>", html)

    # The same points through the API, newest first cut, oldest first in the answer.
    api = client.get("/api/v1/runs/train/metrics?name=step_time&last=3", headers=auth)
    assert api.status_code == 200
    newest = api.json()
    # Both hosts record at the same instants: the newest three are step 99 of each and one
    # step 98.
    assert sorted(p["step"] for p in newest) == [98, 99, 99]
    assert {p["name"] for p in newest} == {"step_time"}
    assert [p["at"] for p in newest] == sorted(p["at"] for p in newest)
    assert client.get("/api/v1/runs/nope/metrics", headers=auth).status_code == 404
    assert client.get("/api/v1/runs/train/metrics?last=0", headers=auth).status_code == 422
    assert client.get("/api/v1/runs/train/metrics").status_code == 401


def test_a_run_without_step_time_says_how_to_record_it(
        page_client: tuple[TestClient, dict[str, str], Settings]) -> None:
    client, auth, settings = page_client
    control_plane(settings).state.register_run(RunRecord(name="quiet", created_at=T0))
    r = client.get("/runs/quiet", headers=auth)
    assert r.status_code == 200 and "stepchart" not in r.text
    assert "metrics.record(MetricType.STEP_TIME, seconds)" in r.text


def test_a_long_run_is_drawn_with_bounded_vertices_and_keeps_its_regression() -> None:
    points = steps("h0", 50_000, slow_after=40_000)
    chart = step_time_chart(points, [])
    assert chart is not None
    (line,) = chart["lines"]
    vertices = [tuple(map(float, v.split(","))) for v in line["points"].split()]
    assert len(vertices) <= MAX_VERTICES
    # The last fifth is five times slower: its points sit far higher (smaller y) on the plot.
    early = [y for x, y in vertices if x < chart["left"] + 0.5 * (chart["right"] - chart["left"])]
    late = [y for x, y in vertices if x > chart["left"] + 0.9 * (chart["right"] - chart["left"])]
    assert max(late) < min(early) - 100
