"""`mldiag tokens`, `mldiag share` and `mldiag roles`, as a user types them, and remote text
printed as text."""

from __future__ import annotations

import re
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from mldiag.adapters.local.state import SqliteStateStore
from mldiag.cli.main import main
from mldiag.model import SessionRecord, TargetRecord
from mldiag.settings import Settings
from tests.console.conftest import Site


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_tokens_create_prints_the_token_alone_and_it_signs_in(
        site: Site, capsys: pytest.CaptureFixture[str]) -> None:
    home = str(site.home)
    code, out, _ = cli(capsys, "tokens", "create", "--role", "viewer", "--run", "tpu",
                       "--expires", "30d", "--label", "ci", "--home", home)
    assert code == 0
    token = out.strip()
    assert re.fullmatch(r"mldiag_[A-Za-z0-9_-]{20,}", token)
    auth = {"Authorization": f"Bearer {token}"}
    assert site.client.get("/api/v1/runs/tpu", headers=auth).status_code == 200
    assert site.client.get("/api/v1/runs/other", headers=auth).status_code == 403
    code, out, _ = cli(capsys, "tokens", "list", "--home", home)
    line = next(li for li in out.splitlines() if li.endswith(" ci"))
    assert " viewer " in line and " tpu " in line and " active " in line
    assert token not in out  # listed by id, never by secret
    token_id = line.split()[0]
    assert cli(capsys, "tokens", "revoke", token_id, "--home", home)[0] == 0
    assert site.client.get("/api/v1/runs/tpu", headers=auth).status_code == 401
    code, _, err = cli(capsys, "tokens", "revoke", token_id, "--home", home)
    assert code == 1 and "no active token" in err


def test_share_create_prints_the_url_alone_and_revoke_ends_it(
        site: Site, capsys: pytest.CaptureFixture[str]) -> None:
    home = str(site.home)
    code, out, _ = cli(capsys, "share", "create", "tpu/s1", "--anyone", "--expires", "1d",
                       "--home", home)
    assert code == 0
    url = out.strip()
    assert url.startswith("http://127.0.0.1:8790/share/") and "\n" not in url
    path = urlsplit(url).path
    assert site.client.get(path).status_code == 200
    code, out, _ = cli(capsys, "share", "list", "--run", "tpu", "--home", home)
    line = next(li for li in out.splitlines() if "anyone" in li and "active" in li)
    assert cli(capsys, "share", "revoke", line.split()[0], "--home", home)[0] == 0
    assert site.client.get(path).status_code == 404
    for argv, message in ((["share", "create", "tpu/s1", "--expires", "31d"], "30 days"),
                          (["share", "create", "tpu/nope"], "no session tpu/nope"),
                          (["share", "create", "tpu"], "RUN/SESSION")):
        code, _, err = cli(capsys, *argv, "--home", home)
        assert code == 1 and message in err, err


def test_roles_grant_list_revoke(site: Site, capsys: pytest.CaptureFixture[str]) -> None:
    home = str(site.home)
    assert cli(capsys, "roles", "grant", "ana@example.com", "--role", "analysis_viewer",
               "--run", "tpu", "--home", home)[0] == 0
    _, out, _ = cli(capsys, "roles", "list", "--home", home)
    assert re.search(r"ana@example.com\s+analysis_viewer\s+tpu", out)
    assert cli(capsys, "roles", "revoke", "ana@example.com", "--role", "analysis_viewer",
               "--run", "tpu", "--home", home)[0] == 0
    code, _, err = cli(capsys, "roles", "grant", "not-an-email", "--role", "viewer",
                       "--home", home)
    assert code == 1 and "not an email" in err


# Clear the screen, retitle the window, a hyperlink to elsewhere, a C1 CSI, a carriage return
# that would overwrite the line, a bell.
ESCAPES = "\x1b[2J\x1b]0;pwned\x07\x1b]8;;https://evil.example/\x1b\\link\x1b]8;;\x1b\\" \
          "\x9b31m\rBEL\x07"


def test_remote_text_is_printed_without_terminal_escapes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings(home=tmp_path / "home")
    settings.home.mkdir()
    state = SqliteStateStore(settings.state_db)
    now = time.time()
    state.ensure_run("r", discovered=False)
    state.upsert_target(TargetRecord(run="r", host="h0", port=9999, address="10.0.0.7",
                                     last_heartbeat=now,
                                     last_error=f"StatusCode.UNAVAILABLE {ESCAPES}"))
    state.create_session(SessionRecord(run="r", session="s1", state="REPORTED",
                                       trigger="alert", request_id="alert:e1",
                                       note=f"step time alert {ESCAPES}",
                                       created_at=now, updated_at=now))
    home = str(settings.home)
    printed = [cli(capsys, "targets", "list", "--run", "r", "--home", home),
               cli(capsys, "monitored-events", "list", "--run", "r", "--home", home),
               cli(capsys, "monitored-events", "list", "--run", "r", "--home", home,
                   "--format", "table(name,displayName)"),
               cli(capsys, "monitored-events", "list", "--run", "r", "--home", home,
                   "--format", "csv(displayName)")]
    for code, out, err in printed:
        assert code == 0, err
        assert "link" in out and "BEL" in out, out
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", out + err), repr(out)
        assert "]0;pwned" not in out and "evil.example" not in out and "[2J" not in out
    assert "UNAVAILABLE linkBEL" in printed[0][1]
    assert "step time alert linkBEL" in printed[1][1]


@pytest.mark.parametrize(("text", "days"), [("P7D", 7.0), ("1w", 7.0), ("36h", 1.5),
                                            ("P1DT12H", 1.5), ("2d12h", 2.5)])
def test_expiries_take_what_gcloud_takes(site: Site, capsys: pytest.CaptureFixture[str],
                                         text: str, days: float) -> None:
    """`--expires` of links and tokens reads durations as every other flag does."""
    home = str(site.home)
    before = time.time()
    assert cli(capsys, "share", "create", "tpu/s1", "--expires", text, "--home", home)[0] == 0
    assert cli(capsys, "tokens", "create", "--role", "viewer", "--run", "tpu", "--expires",
               text, "--label", f"exp-{text}", "--home", home)[0] == 0
    after = time.time()
    access = site.console.access
    link = max(access.list_links(run="tpu"), key=lambda x: x.created_at)
    token = next(x for x in access.list_tokens() if x.label == f"exp-{text}")
    for record in (link, token):
        assert before + days * 86400 <= record.expires_at <= after + days * 86400, record
    code, _, err = cli(capsys, "share", "create", "tpu/s1", "--expires", "7 days",
                       "--home", home)
    assert code == 1 and "bad duration" in err, err
