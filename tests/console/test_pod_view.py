"""A pod's session page shows its hosts side by side, as summary.html does: the per-host
table worst first with the straggler marked, and the host × step lateness map, drawn from the
same geometry under the console's CSP (no script, no inline style); the JSON API's session
stays plain data."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mldiag.access import ALL_RUNS, create_token
from mldiag.bootstrap import control_plane
from mldiag.console.app import create_app
from mldiag.console.context import build_console
from mldiag.model import REPORTED, HostRecord, RunRecord, SessionRecord
from mldiag.settings import Settings

T0 = 1_796_000_000.0
POD = Path(__file__).parents[1] / "unit" / "report" / "goldens" / "planted_pod_straggler"


@pytest.fixture
def pod_site(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str], dict]]:
    settings = Settings(home=tmp_path / "home")
    plane = control_plane(settings)
    console = build_console(settings, plane=plane)
    secret, _ = create_token(console.access, principal="token:analyst",
                             role="analysis_viewer", run=ALL_RUNS, now=time.time())
    analysis = json.loads((POD / "analysis.json").read_text())
    prefix = "train/plugins/profile/pod"
    plane.state.register_run(RunRecord(name="train", created_at=T0))
    plane.state.create_session(SessionRecord(
        run="train", session="pod", state=REPORTED, created_at=T0,
        verdict=analysis["status"],
        hosts={f"host{i}": HostRecord(f"{prefix}/host{i}.xplane.pb", "1", 100, T0)
               for i in range(4)}))
    plane.storage.write_bytes(f"{prefix}/analysis/analysis.json",
                              json.dumps(analysis).encode())
    with TestClient(create_app(console), base_url="http://127.0.0.1:8790") as client:
        yield client, {"Authorization": f"Bearer {secret}"}, analysis


def test_the_session_page_shows_the_pods_hosts_and_heat_map(
        pod_site: tuple[TestClient, dict[str, str], dict]) -> None:
    client, auth, analysis = pod_site
    r = client.get("/runs/train/sessions/pod", headers=auth)
    assert r.status_code == 200
    html = r.text
    pod = html[html.index('<section id="pod">'):].split("</section>", 1)[0]
    assert "<h2>Hosts side by side</h2>" in pod
    # The per-host table, worst first, the straggler marked; the report's own figures.
    body = pod.split("<tbody>", 1)[1]
    hosts = ("host2", "host3", "host1", "host0")
    assert [body.index(f">{h}<") for h in hosts] == sorted(body.index(f">{h}<") for h in hosts)
    assert '<span class="chip">straggler</span>' in body.split("</tr>", 1)[0]
    assert "+40.27 ms" in body and "41.18 ms" in body
    # The heat map: 4 hosts × 12 steps, with its legend; the straggler's line.
    svg = pod[pod.index('<svg class="heatmap"'):pod.index("</svg>")]
    assert svg.count("<title>host2, step ") == 12 and "lateness per step" in svg
    assert "pod_workload.py:35" in pod
    # The console's own list of uploaded xplanes keeps its place and anchor.
    assert html.count('<section id="hosts">') == 1
    assert " style=" not in html.split("<body", 1)[1] and "<script>" not in html

    api = client.get("/api/v1/runs/train/sessions/pod", headers=auth)
    assert api.status_code == 200 and "pod" not in api.json()


def test_a_session_without_a_pod_has_no_such_section(
        pod_site: tuple[TestClient, dict[str, str], dict], tmp_path: Path) -> None:
    client, auth, analysis = pod_site
    del analysis["hosts"]
    settings = Settings(home=tmp_path / "home")
    control_plane(settings).storage.write_bytes(
        "train/plugins/profile/pod/analysis/analysis.json", json.dumps(analysis).encode())
    html = client.get("/runs/train/sessions/pod", headers=auth).text
    assert 'id="pod"' not in html and "<h2>Verdict</h2>" in html
