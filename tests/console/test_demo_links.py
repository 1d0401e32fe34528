"""`mldiag demo` ends by pointing at the console: the command that serves the demo's home and
the pages of its run, session and compare view. Each printed page opens."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from mldiag.cli.demo import console_pointer
from mldiag.settings import Settings
from tests.console.conftest import Site


def test_the_demo_points_at_pages_that_open(site: Site) -> None:
    lines = console_pointer(site.console.settings, "tpu", "s2", "s1")
    assert f".venv/bin/mldiag up --home {site.home}" in "\n".join(lines)
    urls = [line.strip() for line in lines if line.strip().startswith("http://")]
    assert [urlsplit(u).path for u in urls] == [
        "/runs/tpu", "/runs/tpu/sessions/s2", "/runs/tpu/compare"]
    for url in urls:
        parts = urlsplit(url)
        answer = site.client.get(parts.path + (f"?{parts.query}" if parts.query else ""),
                                 headers=site.auth("viewer"))
        assert answer.status_code == 200, (url, answer.status_code)


def test_on_the_default_home_the_command_is_plain_up() -> None:
    lines = console_pointer(Settings(home=Path(".mldiag")), "demo", "host_bound-1")
    assert "  .venv/bin/mldiag up     # then open the login URL it prints, and" in lines
    assert lines[-1] == "  http://127.0.0.1:8790/runs/demo/sessions/host_bound-1"
