"""A test that needs a missing team fixture skips, naming it, or fails where fixtures are
required (MLDIAG_REQUIRE_FIXTURES=1, as CI runs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.fixtures import REPO, REQUIRE_FIXTURES, team_fixture


def test_a_missing_fixture_skips_the_test_naming_it(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUIRE_FIXTURES, raising=False)
    with pytest.raises(pytest.skip.Exception, match=re.escape(f"{tmp_path / 'gone'} is absent")):
        team_fixture(tmp_path / "gone")


@pytest.mark.parametrize("value", ["1", "yes"])
def test_a_missing_fixture_fails_the_test_where_fixtures_are_required(
        value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_FIXTURES, value)
    with pytest.raises(pytest.fail.Exception, match="MLDIAG_REQUIRE_FIXTURES=1 makes that"):
        team_fixture(tmp_path / "gone")


def test_a_present_fixture_is_its_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_FIXTURES, "1")
    assert team_fixture(tmp_path) == tmp_path


def test_ci_requires_the_fixtures() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(rf"^export {REQUIRE_FIXTURES}=1$", ci, re.M)
    assert ci.index(REQUIRE_FIXTURES) < ci.index("exec scripts/test")
