"""Choosing the GCP adapters by settings, without connecting anywhere (no emulator needed)."""

from __future__ import annotations

import pytest

from mldiag import entrypoints
from mldiag.bootstrap import control_plane, gcp_services
from mldiag.errors import MldiagError
from mldiag.messages import ProfileObjectFinalized
from mldiag.settings import Settings
from tests.emulators import EmulatorMissing, sdk_root

GCP = Settings(backend="gcp", project="p-demo", bucket="b-demo", topic_prefix="x-",
               firestore_database="db1")


def test_gcp_settings_build_the_gcp_adapters_unconnected() -> None:
    from mldiag.adapters.gcp.bus import PubSubBus
    from mldiag.adapters.gcp.state import FirestoreStateStore
    from mldiag.adapters.gcp.storage import GcsStorage

    services = gcp_services(GCP)
    assert isinstance(services.storage, GcsStorage) and services.storage.bucket == "b-demo"
    assert isinstance(services.state, FirestoreStateStore)
    assert isinstance(services.bus, PubSubBus)
    assert services.bus.topic_path("analysis-requests") == (
        "projects/p-demo/topics/x-analysis-requests")
    assert services.storage.uri("r/a.json") == "gs://b-demo/r/a.json"
    # Clients are made on first use: building the services looked up no credentials.
    assert services.storage._client is None and services.state._client is None
    assert services.bus._publisher is None


def test_the_control_plane_follows_the_backend() -> None:
    from mldiag.adapters.gcp.state import FirestoreStateStore

    plane = control_plane(GCP)
    assert isinstance(plane.state, FirestoreStateStore)
    assert plane.storage.uri("x") == "gs://b-demo/x"


def test_gcp_without_project_or_bucket_says_what_is_missing() -> None:
    with pytest.raises(MldiagError, match="MLDIAG_PROJECT and MLDIAG_BUCKET"):
        gcp_services(Settings(backend="gcp"))


def test_function_instances_build_gcp_services_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mldiag.adapters.gcp.state import FirestoreStateStore

    for key, value in {"MLDIAG_BACKEND": "gcp", "MLDIAG_PROJECT": "p-demo",
                       "MLDIAG_BUCKET": "b-demo"}.items():
        monkeypatch.setenv(key, value)
    entrypoints.set_services(None)
    try:
        services = entrypoints.services()
        assert isinstance(services.state, FirestoreStateStore)
        assert entrypoints.services() is services, "built once per instance"
    finally:
        entrypoints.set_services(None)


def test_a_finalize_from_another_bucket_is_foreign() -> None:
    msg = ProfileObjectFinalized(bucket="someone-else", name="r/plugins/profile/s/h.xplane.pb",
                                 generation="1")
    assert entrypoints.foreign_bucket(msg, GCP)
    assert not entrypoints.foreign_bucket(
        ProfileObjectFinalized(bucket="b-demo", name=msg.name, generation="1"), GCP)
    assert not entrypoints.foreign_bucket(msg, Settings()), "no bucket configured: all ours"


def test_a_machine_without_gcloud_gets_a_one_line_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(EmulatorMissing, match="gcloud is not on PATH") as info:
        sdk_root()
    assert "\n" not in str(info.value)


def test_settings_choose_the_investigator(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from mldiag.bootstrap import bootstrap, make_investigator

    gemini = make_investigator(Settings(investigator="gemini", project="p",
                                        gemini_model="gemini-2.5-pro"))
    assert gemini.name == "gemini:gemini-2.5-pro"
    runtime = bootstrap(Settings(home=tmp_path, investigator="gemini", project="p"))
    assert runtime.services.investigator.name.startswith("gemini:")
    assert make_investigator(Settings()).name == "rule-based"
    with pytest.raises(MldiagError, match="rule-based or gemini"):
        make_investigator(Settings(investigator="gpt"))
