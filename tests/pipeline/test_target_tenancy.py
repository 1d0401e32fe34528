"""A profiler address belongs to one run (issue 34, item 2), on the local backend (SQLite).

An editor scoped to run B must not register run A's workload address as a target of run B
(and so capture, download or hold run A's profiler); an admin may. Captures are claimed by the
target's identity, so a run holds only its own targets' profilers. Targets per run are capped.
The same rules on Firestore and through the `register` function: tests/gcp/
test_target_tenancy_gcp.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mldiag.access import ALL_RUNS, create_token
from mldiag.bootstrap import ControlPlane, control_plane
from mldiag.capture.requests import register_push_target
from mldiag.console.app import create_app
from mldiag.console.context import build_console
from mldiag.messages import CaptureProfile
from mldiag.model import RunRecord
from mldiag.settings import Settings
from mldiag.stages import Services
from mldiag.stages.capture import _profiler_turn
from tests.helpers.net import free_port
from tests.helpers.pipeline import FAST


@dataclass
class Site:
    plane: ControlPlane
    client: TestClient
    tokens: dict[str, str]

    def post(self, who: str, run: str, address: str) -> tuple[int, dict[str, object]]:
        r = self.client.post(f"/api/v1/runs/{run}/targets", json={"address": address},
                             headers={"Authorization": f"Bearer {self.tokens[who]}"})
        return r.status_code, r.json()


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    settings = Settings(home=tmp_path / "home", probe_timeout_s=0.1, max_targets_per_run=3,
                        **FAST)
    plane = control_plane(settings)
    for run in ("run-a", "run-b"):
        plane.state.register_run(RunRecord(name=run, created_at=time.time()))
    console = build_console(settings, plane=plane)
    tokens = {}
    for key, role, run in (("editor_b", "editor", "run-b"), ("editor_a", "editor", "run-a"),
                           ("admin", "admin", ALL_RUNS)):
        tokens[key], _ = create_token(console.access, role=role, run=run, now=time.time(),
                                      label=key)
    with TestClient(create_app(console), base_url="http://127.0.0.1:8790") as client:
        yield Site(plane=plane, client=client, tokens=tokens)


def test_a_run_scoped_editor_cannot_take_another_runs_profiler_address(site: Site) -> None:
    port = free_port()
    # Run A's workload address, registered by its own editor.
    code, _ = site.post("editor_a", "run-a", f"127.0.0.1:{port}")
    assert code == 201
    # Run B's editor tries it, as written and as another spelling of the same address.
    for address in (f"127.0.0.1:{port}", f"localhost:{port}"):
        code, body = site.post("editor_b", "run-b", address)
        assert code == 403, (address, body)
        detail = str(body["detail"])
        assert "is the profiler of another run" in detail and "needs editor rights" in detail
        assert "run-a" not in detail, "a run the caller cannot see is not named"
    assert site.plane.state.list_targets("run-b") == []
    # An admin may (e.g. two runs of one job that share a process).
    code, body = site.post("admin", "run-b", f"127.0.0.1:{port}")
    assert code == 201, body
    assert [t.port for t in site.plane.state.list_targets("run-b")] == [port]


def test_the_local_operator_may_register_any_address(
        site: Site) -> None:
    port = free_port()
    register_push_target(site.plane, "run-a", f"127.0.0.1:{port}")
    # The CLI is the local operator (an admin): allowed.
    record, _ = register_push_target(site.plane, "run-b", f"localhost:{port}")
    assert record.run == "run-b"


def test_targets_per_run_are_capped_and_the_error_names_the_cap(site: Site) -> None:
    for _ in range(3):
        assert site.post("editor_b", "run-b", f"127.0.0.1:{free_port()}")[0] == 201
    code, body = site.post("editor_b", "run-b", f"127.0.0.1:{free_port()}")
    assert code == 400
    assert "cap of 3 per run" in str(body["detail"])
    assert "MLDIAG_MAX_TARGETS_PER_RUN" in str(body["detail"])
    assert len(site.plane.state.list_targets("run-b")) == 3


def test_a_capture_claims_its_own_target_not_the_address_text(site: Site) -> None:
    port = free_port()
    a, _ = register_push_target(site.plane, "run-a", f"127.0.0.1:{port}")
    b, _ = register_push_target(site.plane, "run-b", f"127.0.0.1:{port}")
    services = Services(settings=site.plane.settings, storage=site.plane.storage,
                        state=site.plane.state, bus=site.plane.bus)
    held = CaptureProfile(run="run-b", session="hold", duration_s=300.0)
    mine = CaptureProfile(run="run-a", session="mine", duration_s=1.0)
    with _profiler_turn(services, b, held, time.monotonic() + 1):
        # Run B's capture (up to 300 s) does not hold run A's profiler.
        started = time.monotonic()
        with _profiler_turn(services, a, mine, time.monotonic() + 1.0):
            pass
        assert time.monotonic() - started < 0.5
        # A second capture of run B's own target still waits its turn.
        with pytest.raises(Exception, match="earlier mldiag capture still held"):
            with _profiler_turn(services, b, CaptureProfile(run="run-b", session="x"),
                                time.monotonic() + 0.3):
                pass
