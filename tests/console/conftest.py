"""A console on a real local runtime: three REPORTED sessions of the TPU fixture in two runs,
tokens for every role, and an HTTP client (Starlette's TestClient, the ASGI app in-process)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mldiag.access import ALL_RUNS, create_token
from mldiag.bootstrap import ControlPlane, LocalRuntime, bootstrap
from mldiag.console.app import create_app
from mldiag.console.context import Console, build_console
from mldiag.settings import Settings
from tests.helpers.fixtures import TPU_XPLANE, team_fixture
from tests.helpers.pipeline import FAST

SESSIONS = (("tpu", "s1"), ("tpu", "s2"), ("other", "o1"))
HOST = "tpu_inference_2"


@dataclass
class Site:
    home: Path
    runtime: LocalRuntime
    console: Console
    client: TestClient
    tokens: dict[str, str] = field(default_factory=dict)
    # Each token's principal id (`token:<id>`), by the same key.
    ids: dict[str, str] = field(default_factory=dict)

    def auth(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"} if who else {}

    def token(self, role: str, run: str = ALL_RUNS, key: str = "") -> str:
        secret, record = create_token(self.console.access, role=role, run=run,
                                      now=time.time(), label=f"{role}@{run}")
        if key:
            self.tokens[key], self.ids[key] = secret, record.principal_id
        return secret


def drop(home: Path, run: str, session: str) -> None:
    dest = home / "bucket" / run / "plugins" / "profile" / session / f"{HOST}.xplane.pb"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(TPU_XPLANE, dest)


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    team_fixture(TPU_XPLANE)
    home = tmp_path_factory.mktemp("console") / "home"
    settings = Settings(home=home, **FAST)
    runtime = bootstrap(settings)
    runtime.start()
    for run, session in SESSIONS:
        drop(home, run, session)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = [(s.state) for s in runtime.state.list_sessions()]
        if len(states) == len(SESSIONS) and set(states) == {"REPORTED"} and runtime.wait_idle(1):
            break
        time.sleep(0.1)
    assert {s.state for s in runtime.state.list_sessions()} == {"REPORTED"}
    plane = ControlPlane(settings=settings, state=runtime.state, storage=runtime.storage,
                         bus=runtime.services.bus)
    console = build_console(settings, plane=plane)
    client = TestClient(create_app(console), base_url="http://127.0.0.1:8790")
    s = Site(home=home, runtime=runtime, console=console, client=client)
    for role in ("viewer", "analysis_viewer", "editor", "admin"):
        s.token(role, key=role)
    s.token("viewer", "other", key="viewer_other")
    s.token("editor", "other", key="editor_other")
    try:
        yield s
    finally:
        client.close()
        runtime.stop()
