"""XProf's Graph Viewer in chromium, offline: a graph is drawn (its nodes are in the frame's
SVG) inside a sandbox that gives its page an opaque origin, and a profile whose text would
close the graph page's script neither runs nor navigates anything."""

from __future__ import annotations

import contextlib
import gzip
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from playwright.sync_api import Browser, Frame, Page, Route, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.browser.conftest import PROFILES, Browse, Console, Shot
from tests.helpers.browser import TOOL_MS, XPROF

pytestmark = pytest.mark.slow
TPU = PROFILES["tpu"]


def offline(page: Page, console: Console) -> list[str]:
    """Abort every request that leaves the console (Google's servers included), as on an
    air-gapped fleet; the list of what was refused."""
    refused: list[str] = []

    def route(r: Route) -> None:
        if r.request.url.startswith(console.url + "/") or r.request.url.startswith(
                ("data:", "blob:")):
            r.continue_()
        else:
            refused.append(r.request.url)
            r.abort("internetdisconnected")

    page.context.route("**/*", route)
    return refused


def graph_frame(page: Page) -> Frame:
    """The Graph Viewer's frame, once it is at a graph's address."""
    deadline = time.monotonic() + TOOL_MS / 1000
    while True:
        frame = next((f for f in page.frames if "tag=graph_viewer" in f.url
                      and "type=graph" in f.url), None)
        if frame is not None:
            return frame
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no graph frame among {[f.url for f in page.frames]}")
        with contextlib.suppress(PlaywrightTimeout):
            page.wait_for_event("framenavigated", timeout=min(left, 1.0) * 1000)


def open_graph_viewer(page: Page, console: Console) -> None:
    query = urlencode({"run": TPU.session, "tag": "graph_viewer", "host": TPU.host})
    page.goto(f"{console.url}{TPU.path}{XPROF}graph_viewer?{query}")
    # With no module and op named, the frontend offers the heaviest ops as chips.
    chip = page.locator("mat-chip-option").first
    expect(chip).to_be_visible(timeout=TOOL_MS)
    chip.click()


@pytest.fixture
def signed_in(browse: Browse, admin_state: dict[str, Any]) -> Iterator[tuple[Page, Any]]:
    ctx, watch = browse.context(signed_in=admin_state)
    yield ctx.new_page(), watch


def test_the_graph_viewer_draws_a_graph_offline_inside_its_sandbox(
        console: Console, signed_in: tuple[Page, Any], shot: Shot, browser: Browser) -> None:
    print(f"chromium {browser.version}")
    page, watch = signed_in
    refused = offline(page, console)
    open_graph_viewer(page, console)
    frame = graph_frame(page)
    # Drawn: graphviz's SVG nodes, with their op names, in the frame.
    nodes = frame.locator("#graph-container svg g.node")
    expect(nodes.first).to_be_visible(timeout=TOOL_MS)
    assert nodes.count() >= 2
    assert re.search(r"\w", nodes.first.locator("text").first.text_content() or "")
    assert frame.locator("#graph-container svg g.edge").count() >= 1
    # The frontend cannot read the sandboxed frame: the page tells the console's page it has
    # drawn, and "Loading graph..." goes.
    expect(page.locator("graph-viewer .progress-container")).to_be_hidden()
    shot(page, "graph-drawn")
    # The page runs in an opaque origin: not the console's, whose cookies it cannot read.
    assert frame.evaluate("() => self.origin") == "null"
    assert frame.evaluate("() => { try { return document.cookie; } catch (e) { return "
                          "'refused: ' + e.name; } }").startswith("refused")
    # Nothing was needed from Google's servers to draw it.
    assert not [u for u in refused if "hpcc" in u or "svg-pan-zoom" in u or "Roboto" in u]
    # The address the frontend gives the drawn graph stays under the session's XProf, so a
    # reload (or the address, shared) draws it again.
    assert page.url.startswith(f"{console.url}{TPU.path}{XPROF}graph_viewer?node_name="), (
        page.url)
    page.reload()
    expect(graph_frame(page).locator("#graph-container svg g.node").first).to_be_visible(
        timeout=TOOL_MS)
    watch.check()


EVIL = "http://evil.invalid/"
# What a profile's text can carry into the graph page (here in a node's tooltip): markup that
# would end xprof's inline script, send the frame elsewhere and run script.
PLANTED = (f"</script><meta http-equiv='refresh' content='0;url={EVIL}'>"
           "<script>top.document.title = 'pwned'; fetch('/api/v1/runs')</script>")


def _cached_graph(console: Console) -> Path:
    """The console's cached answer that holds the graph page it served (its viewer cache)."""
    for meta in (console.home / "viewer").glob("*/responses/data-*.json"):
        body = meta.with_suffix("").read_bytes()
        text = gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body
        if b"digraph" in text and b"const data = `" in text:
            return meta.with_suffix("")
    raise AssertionError("the console cached no graph page")


def test_markup_planted_in_a_graph_neither_navigates_nor_runs_with_the_console_s_origin(
        console: Console, signed_in: tuple[Page, Any], shot: Shot) -> None:
    page, watch = signed_in
    refused = offline(page, console)
    open_graph_viewer(page, console)
    expect(graph_frame(page).locator("#graph-container svg g.node").first).to_be_visible(
        timeout=TOOL_MS)
    # The cached answer rewritten, as a profile with that text would have written it.
    cached = _cached_graph(console)
    body = cached.read_bytes()
    page_text = (gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body).decode()
    cached.write_bytes(page_text.replace('tooltip="', f'tooltip="{PLANTED}', 1).encode())
    page.reload()
    frame = graph_frame(page)
    # Drawn, the planted text a tooltip like any other text.
    expect(frame.locator("#graph-container svg g.node").first).to_be_visible(timeout=TOOL_MS)
    assert PLANTED in frame.locator("#graph-container svg").inner_html().replace(
        "&lt;", "<").replace("&gt;", ">").replace("&#39;", "'")
    shot(page, "planted-graph")
    assert page.url.startswith(f"{console.url}{TPU.path}{XPROF}graph_viewer?"), page.url
    assert frame.url.startswith(console.url + "/"), frame.url
    assert page.title() != "pwned"
    assert not [u for u in refused if u.startswith(EVIL)], refused
    api = [u for _, u in watch.responses if "/api/v1/runs" in u]
    assert not api, api
    watch.check()


def open_overview(page: Page, console: Console) -> None:
    query = urlencode({"run": TPU.session, "tag": "overview_page", "host": TPU.host})
    page.goto(f"{console.url}{TPU.path}{XPROF}overview_page?{query}")
    expect(page.locator("body")).to_contain_text("Device type: TPU", timeout=TOOL_MS)


def test_offline_the_xprof_page_says_what_is_missing_and_what_works(
        console: Console, signed_in: tuple[Page, Any], shot: Shot) -> None:
    page, watch = signed_in
    refused = offline(page, console)
    open_overview(page, console)
    banner = page.locator("#mldiag-offline")
    expect(banner).to_be_visible(timeout=TOOL_MS)
    expect(banner).to_contain_text("Google Charts (www.gstatic.com/charts) is missing")
    expect(banner).to_contain_text("What works: the Trace Viewer, the Graph Viewer")
    assert any("www.gstatic.com/charts/loader.js" in u for u in refused), refused
    shot(page, "offline-banner")
    report = banner.get_by_role("link", name="the report (summary.html)")
    assert report.get_attribute("href") == f"{TPU.path}/report"
    opened = page.context.request.get(console.url + TPU.path + "/report")
    assert opened.ok and "<html" in opened.text()
    # The frontend's own font (Google Sans Code, OFL) is the console's: nothing is missing.
    assert not [u for u in refused if "fonts.g" in u], refused
    assert page.evaluate("() => [...document.fonts].some("
                         "f => f.family.includes('Google Sans Code'))")
    expect(banner).not_to_contain_text("Fonts")
    # A Google font the page asks for and cannot get is named.
    page.evaluate("""() => { const style = document.createElement('style');
      style.textContent = '@import url(https://fonts.googleapis.com/css2?family=Inconsolata);';
      document.head.append(style); }""")
    expect(banner).to_contain_text("Fonts (fonts.googleapis.com: Inconsolata) are missing",
                                   timeout=TOOL_MS)
    watch.check()


def test_with_google_s_servers_reachable_there_is_no_banner(
        console: Console, signed_in: tuple[Page, Any]) -> None:
    page, watch = signed_in

    def google(r: Route) -> None:
        # Stand-ins for Google's answers: the charts loader defines `google.charts`.
        if "/charts/loader.js" in r.request.url:
            r.fulfill(content_type="text/javascript", body=(
                "window.google = {charts: {load() {}, setOnLoadCallback(f) {},"
                " safeLoad() { return new Promise(() => {}); }}};"))
        else:
            r.fulfill(content_type="text/css", body=(
                "@font-face {font-family: 'Google Sans Code'; src: local('Courier');}"))

    page.context.route(re.compile(r"^https://(www\.gstatic\.com|fonts\.googleapis\.com)/"),
                       google)
    open_overview(page, console)
    # Decided (after the page's last style sheet), not still pending.
    page.wait_for_function("() => ['none', 'shown'].includes("
                           "document.documentElement.dataset.mldiagOffline)", timeout=TOOL_MS)
    assert page.evaluate("() => document.documentElement.dataset.mldiagOffline") == "none"
    assert page.locator("#mldiag-offline").count() == 0
    watch.check()
