"""The API's OpenAPI document, and schemathesis against it: generated requests (as an admin,
and as nobody) never get a server error, and every answer matches the document's status
codes and content types."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.console.conftest import Site

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def api_schema(site: Site) -> Any:
    return schemathesis.openapi.from_asgi("/api/v1/openapi.json", site.client.app)


def test_the_openapi_document_lists_the_api(site: Site) -> None:
    doc = site.client.get("/api/v1/openapi.json").json()
    paths = set(doc["paths"])
    for path in ("/api/v1/runs", "/api/v1/runs/{run}", "/api/v1/runs/{run}/targets",
                 "/api/v1/runs/{run}/sessions", "/api/v1/runs/{run}/sessions/{session}",
                 "/api/v1/runs/{run}/captures", "/api/v1/runs/{run}/continuous",
                 "/api/v1/runs/{run}/sessions/{session}/share", "/api/v1/share",
                 "/api/v1/share/{link_id}", "/api/v1/runs/{run}/compare",
                 "/api/v1/runs/{run}/baseline"):
        assert path in paths, path
    assert not any(p.startswith(("/share/", "/runs/")) for p in paths)  # pages stay out


def test_schemathesis_finds_no_server_error(site: Site, api_schema: Any) -> None:
    schema = api_schema
    failures: list[str] = []
    calls: list[int] = []
    tokens = [site.tokens["admin"], site.tokens["viewer"], ""]

    @settings(max_examples=8, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    def run(case: Any, token: str) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = case.call(headers=headers)
        calls.append(response.status_code)
        if response.status_code >= 500:
            failures.append(f"{case.method} {case.formatted_path}: {response.status_code} "
                            f"{response.text[:200]}")

    from hypothesis import given
    from hypothesis import strategies as st

    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.method.upper() == "DELETE" and "tokens" in operation.path:
            continue  # would revoke the tokens this test signs in with
        strategy = operation.as_strategy()
        given(case=strategy, token=st.sampled_from(tokens))(run)()
        operations += 1
    assert failures == []
    assert operations >= 15 and len(calls) >= 4 * operations
    assert {200, 401} <= set(calls)  # some cases signed in and served, some refused
