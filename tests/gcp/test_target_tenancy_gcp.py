"""A profiler address belongs to one run (issue 34, item 2), on Firestore (the emulator).

Two ways register a push target on Google Cloud: the console and the CLI
(`register_push_target` over the Firestore state store), and a workload's SDK through the
`register` function (`entrypoints.register`, the body of functions/register/main.py, with a
Google ID token of the workload's service account). On both, run B cannot take run A's
profiler address without rights on run A, and a run's targets are capped. The local backend's
twin: tests/pipeline/test_target_tenancy.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from mldiag import entrypoints
from mldiag.access import Principal
from mldiag.adapters.gcp.registration import FirestoreRunOwners, GcsUploadSigner
from mldiag.adapters.gcp.state import FirestoreStateStore
from mldiag.adapters.local.bus import InProcessBus
from mldiag.adapters.local.state import SqliteStateStore
from mldiag.adapters.local.storage import LocalDirStorage
from mldiag.bootstrap import ControlPlane
from mldiag.capture.requests import TargetHeld, register_push_target
from mldiag.errors import MldiagError
from mldiag.model import RunRecord, TargetRecord
from mldiag.registration import Registrar
from mldiag.settings import Settings
from tests.emulators import Emulators
from tests.gcp.conftest import jwks_endpoint

pytestmark = pytest.mark.emulator
ALICE = "train-a@proj.iam.gserviceaccount.com"
BOB = "train-b@proj.iam.gserviceaccount.com"
URL = "https://register.example.invalid/"


@pytest.fixture
def stores(emu: Emulators, tmp_path: Any) -> Iterator[dict[str, Any]]:
    from cryptography.hazmat.primitives.asymmetric import rsa

    database = f"targets-{int(time.time() * 1000) % 10**8}"
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with jwks_endpoint(key.public_key(), kid="g1", alg="RS256") as certs:
        # Loopback is allowed here (the gcp backend refuses it by default) so that the
        # addresses are real ones of this machine.
        settings = Settings(backend="gcp", project=emu.project, firestore_database=database,
                            registration_url=URL, id_token_certs_url=certs,
                            capture_allow_loopback="yes", probe_timeout_s=0.1,
                            max_targets_per_run=2, home=tmp_path / "home")
        state = FirestoreStateStore(client=emu.firestore_client(database))
        registrar = Registrar(settings=settings, state=state,
                              owners=FirestoreRunOwners(client=emu.firestore_client(database)),
                              uploads=GcsUploadSigner("unused", client=emu.storage_client()))
        plane = ControlPlane(settings=settings, state=state,
                             storage=LocalDirStorage(tmp_path / "bucket"),
                             bus=InProcessBus(SqliteStateStore(tmp_path / "bus.db")))
        yield {"state": state, "registrar": registrar, "plane": plane, "key": key}


def call(stores: dict[str, Any], email: str, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """One request to the register function, signed in as `email`."""
    import jwt

    now = int(time.time())
    token = jwt.encode({"iss": "https://accounts.google.com", "aud": URL, "azp": "1",
                        "sub": "1", "email": email, "email_verified": True, "iat": now - 5,
                        "exp": now + 600}, stores["key"], algorithm="RS256",
                       headers={"kid": "g1"})
    return entrypoints.register(f"Bearer {token}", json.dumps(body).encode(),
                                stores["registrar"])


def push(run: str, host: str, address: str, port: int) -> dict[str, Any]:
    """A workload's push target (an SDK on torch_xla), alive: a fresh heartbeat."""
    return TargetRecord(run=run, host=host, port=port, address=address,
                        last_heartbeat=time.time(), heartbeat_s=30.0).to_dict()


def test_the_register_function_refuses_another_runs_profiler_address(
        stores: dict[str, Any]) -> None:
    for who, run in ((ALICE, "alice-run"), (BOB, "bob-run")):
        assert call(stores, who, {"op": "register_run", "run": {"name": run}})[1] == 200
    assert call(stores, ALICE, {"op": "upsert_target",
                                "target": push("alice-run", "a0", "127.0.0.1", 9301)})[1] == 200
    # Bob's workload names Alice's profiler as its own target, in any spelling.
    for address in ("127.0.0.1", "localhost"):
        answer, status = call(stores, BOB, {"op": "upsert_target",
                                            "target": push("bob-run", "b0", address, 9301)})
        assert status == 403, answer
        assert "is the profiler of another run" in answer["error"]
        assert "alice-run" not in answer["error"]
    assert stores["state"].list_targets("bob-run") == []
    # A pull target is never connected to: its address holds nothing.
    pulled = {**push("bob-run", "b1", "127.0.0.1", 9301), "delivery": "pull"}
    assert call(stores, BOB, {"op": "upsert_target", "target": pulled})[1] == 200
    # The owner of both runs may.
    assert call(stores, ALICE, {"op": "register_run", "run": {"name": "alice-two"}})[1] == 200
    assert call(stores, ALICE, {"op": "upsert_target",
                                "target": push("alice-two", "a0", "127.0.0.1", 9301)})[1] == 200
    # And the cap per run, named.
    answer, status = call(stores, BOB, {"op": "upsert_target",
                                        "target": push("bob-run", "b2", "127.0.0.1", 9302)})
    assert status == 200, answer
    answer, status = call(stores, BOB, {"op": "upsert_target",
                                        "target": push("bob-run", "b3", "127.0.0.1", 9303)})
    assert status == 400 and "cap of 2 per run" in answer["error"], answer


def test_console_and_cli_registration_on_firestore_needs_rights_on_the_holder(
        stores: dict[str, Any]) -> None:
    plane = stores["plane"]
    for run in ("run-a", "run-b"):
        plane.state.register_run(RunRecord(name=run, created_at=time.time()))
    editor_a = Principal("token:a", (("editor", "run-a", ""),))
    editor_b = Principal("token:b", (("editor", "run-b", ""), ("viewer", "run-a", "")))
    admin = Principal("token:admin", (("admin", "*", ""),))
    register_push_target(plane, "run-a", "127.0.0.1:9401", principal=editor_a)
    with pytest.raises(TargetHeld) as held:
        register_push_target(plane, "run-b", "localhost:9401", principal=editor_b)
    # A viewer of run A sees its name in the refusal.
    assert "the profiler of run 'run-a'" in str(held.value)
    assert "needs editor rights on run 'run-a' (or admin)" in str(held.value)
    assert plane.state.list_targets("run-b") == []
    record, _ = register_push_target(plane, "run-b", "127.0.0.1:9401", principal=admin)
    assert [t.host for t in plane.state.list_targets("run-b")] == [record.host]
    register_push_target(plane, "run-b", "127.0.0.1:9402", principal=editor_b)
    with pytest.raises(MldiagError, match="cap of 2 per run"):
        register_push_target(plane, "run-b", "127.0.0.1:9403", principal=editor_b)
