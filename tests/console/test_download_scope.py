"""The raw-profile download serves only a session's own profiles (issue 34, item 9).

The route `/runs/R/sessions/S/hosts/H/xplane.pb` serves the object that the host's record
names. Whatever that record says, the object must be this session's own: in this run's
storage prefix, in the session's directory, under this host's name. A record that points at
another run's profile (or another session's) is a 404 to a viewer of this run, who may not
read the other one.
"""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

from mldiag.access import create_token
from mldiag.bootstrap import control_plane
from mldiag.console.app import create_app
from mldiag.console.context import build_console
from mldiag.model import CAPTURING, HostRecord, RunRecord
from mldiag.settings import Settings
from tests.helpers.pipeline import FAST

SECRET = b"run a's private profile"


def _host(name: str, size: int) -> HostRecord:
    return HostRecord(object_name=name, generation="1", size=size, arrived_at=time.time())


def test_a_host_record_naming_another_runs_object_is_not_served(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", **FAST)
    plane = control_plane(settings)
    now = time.time()
    for run, prefix in (("run-a", ""), ("run-b", ""), ("run-c", "team")):
        plane.state.register_run(RunRecord(name=run, created_at=now, storage_prefix=prefix))
    theirs = "run-a/plugins/profile/s1/h0.xplane.pb"
    own = "run-b/plugins/profile/s1/h1.xplane.pb"
    plane.storage.write_bytes(theirs, SECRET)
    plane.storage.write_bytes(own, b"run b's own")
    plane.storage.write_bytes("other/plugins/profile/s1/h0.xplane.pb", SECRET)
    for host, name in (("h0", theirs), ("h1", own)):
        plane.state.register_host("run-b", "s1", host, _host(name, 11), now)
    # Another prefix than the run's, and another session's directory.
    plane.state.register_host("run-c", "s1", "h0",
                              _host("other/plugins/profile/s1/h0.xplane.pb", 11), now)
    plane.state.register_host("run-b", "s2", "h0",
                              _host("run-b/plugins/profile/s1/h1.xplane.pb", 11), now)
    assert plane.state.get_session("run-b", "s1").state == CAPTURING  # type: ignore[union-attr]
    console = build_console(settings, plane=plane)
    secret, _ = create_token(console.access, role="viewer", run="run-b", now=now)
    secret_c, _ = create_token(console.access, role="viewer", run="run-c", now=now)
    client = TestClient(create_app(console), base_url="http://127.0.0.1:8790")

    def get(path: str, token: str = secret) -> tuple[int, bytes]:
        r = client.get(path, headers={"Authorization": f"Bearer {token}"})
        return r.status_code, r.content

    assert get("/runs/run-b/sessions/s1/hosts/h1/xplane.pb") == (200, b"run b's own")
    code, body = get("/runs/run-b/sessions/s1/hosts/h0/xplane.pb")
    assert code == 404 and SECRET not in body
    code, body = get("/runs/run-b/sessions/s2/hosts/h0/xplane.pb")
    assert code == 404
    code, body = get("/runs/run-c/sessions/s1/hosts/h0/xplane.pb", secret_c)
    assert code == 404 and SECRET not in body
