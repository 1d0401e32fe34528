"""A host too large for the viewer's prebuild, viewed window by window in the real XProf
frontend (chromium): the frontend lists the windows as hosts, each window's trace shows its
own tracks, and the overview shows the whole host's figures."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import PROFILES, Browse, Console, Shot, start_up
from tests.helpers.browser import TOOL_MS, XPROF, drawn, open_xprof

pytestmark = pytest.mark.slow
TPU = PROFILES["tpu"]


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """`mldiag up` whose viewer prebuild has less memory than the TPU fixture's conversions
    need whole (about 315 MB), and windows of 300 KB: the fixture is viewed in windows."""
    yield from start_up(tmp_path_factory, [TPU], name="mldiag-up-windowed",
                        MLDIAG_VIEWER_MEMORY_BUDGET="310M", MLDIAG_WINDOW_BYTES="300000")


def _manifest(console: Console, timeout: float = 180.0) -> dict[str, Any]:
    """The session's viewer manifest, once the prebuild (after REPORTED) has written it."""
    cache = (console.home / "bucket" / "xprof-cache" / TPU.run / "plugins" / "profile"
             / TPU.session / "analysis")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(cache.glob("*/manifest.json"))
        if found:
            return dict(json.loads(found[0].read_text()))
        skipped = sorted(cache.glob("*/skipped.json"))
        assert not skipped, skipped[0].read_text()
        time.sleep(0.2)
    pytest.fail("the session's viewer caches were not prebuilt:\n" + "\n".join(console.output))


def test_a_large_host_is_opened_window_by_window(
        console: Console, browse: Browse, admin_state: dict[str, Any], shot: Shot) -> None:
    windows = _manifest(console)["view"]["windows"][TPU.host]
    assert windows >= 2
    names = [f"{TPU.host}.window{k:02d}" for k in range(windows)]
    ctx, watch = browse.context(signed_in=admin_state)
    page = ctx.new_page()
    page.goto(console.url + TPU.path)
    expect(page.locator('h1 [data-field="state"]')).to_have_text("REPORTED")
    xprof, tags = open_xprof(ctx, page)
    # The overview: the whole host's op_stats, whichever window the frontend picked.
    expect(xprof.locator("body")).to_contain_text("Device type: TPU", timeout=TOOL_MS)
    shot(xprof, "windowed-overview")
    hosts = console.api(f"{TPU.path}{XPROF}hosts?run={TPU.session}&tag=trace_viewer%40")
    assert [h["hostname"] for h in hosts] == names
    base = console.url + TPU.path + XPROF
    trace_data = lambda r: XPROF + "data?" in r.url and "trace_viewer" in r.url  # noqa: E731
    with xprof.expect_response(trace_data, timeout=TOOL_MS) as data:
        xprof.goto(f"{base}trace_viewer@?run={TPU.session}&tag=trace_viewer%40")
    assert data.value.status == 200 and f"host={names[0]}" in data.value.url
    frame = xprof.frame_locator('iframe[src*="trace_viewer_index.html"]').first
    expect(frame.locator("body")).to_contain_text(f"{names[0]} /device:TPU:", timeout=TOOL_MS)
    drawn(xprof)
    shot(xprof, "windowed-trace-first-window")
    # Another window, picked from the frontend's host list as a user would.
    hosts_select = xprof.locator(".item-container", has_text="Hosts").locator("mat-select")
    hosts_select.click()
    options = xprof.get_by_role("option").filter(has_text=TPU.host)
    expect(options).to_have_count(len(names))
    shot(xprof, "windowed-host-list")
    options.filter(has_text=names[-1]).click()
    options.filter(has_text=names[0]).click()
    with xprof.expect_response(trace_data, timeout=TOOL_MS) as data:
        xprof.get_by_role("button", name="Apply Host Selection").click()
    # After a switch the frontend asks for the window's span, in JavaScript's numbers
    # (`start_time_ms=5e-324`).
    assert data.value.status == 200 and names[-1] in data.value.url, data.value.url
    frame = xprof.frame_locator('iframe[src*="trace_viewer_index.html"]').first
    expect(frame.locator("body")).to_contain_text(f"{names[-1]} /device:TPU:", timeout=TOOL_MS)
    drawn(xprof)
    shot(xprof, "windowed-trace-last-window")
    assert all(s < 500 for s, _ in watch.responses)
    watch.check()
    # The windows the cache keeps are not new uploads: `mldiag up` saw one session only.
    seen = {m[1] for line in console.output if (m := re.match(r"\S+ (\S+/\S+) v\d+ ", line))}
    assert seen == {f"{TPU.run}/{TPU.session}"}, seen
