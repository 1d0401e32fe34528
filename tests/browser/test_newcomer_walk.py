"""What a newcomer does in the console, in chromium, timed: sign in → runs → a run → a
session → its report → every XProf tool → a share link in a fresh browser → compare two
sessions. Every step's load time is recorded (`newcomer-walk.json` beside the screenshots),
and the walk fails on any server error, console error or Content-Security-Policy violation
(the allow-list is the conftest's, each entry with its reason; see XPROF_OFFLINE below for the
one this walk adds). Then the same pages at phone width and in dark mode.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from playwright.sync_api import Browser, Page, Response, expect

from tests.browser.conftest import (
    ARTIFACTS,
    PROFILES,
    Browse,
    Console,
    Profile,
    Shot,
    Watch,
    start_up,
)
from tests.helpers.browser import TOOL_MS, XPROF, open_xprof

pytestmark = pytest.mark.slow

TPU = PROFILES["tpu"]
RUN = "newcomer"
# The same TPU profile dropped twice into one run: two reported sessions to compare.
BEFORE = Profile("before", RUN, "before", TPU.source, TPU.host, TPU.device)
AFTER = Profile("after", RUN, "after", TPU.source, TPU.host, TPU.device)
# A console page must be up (its load event) this fast on a loaded 2-core CI machine; a tool
# of the XProf frontend until its data answered. The figures are in the walk's JSON.
PAGE_S, TOOL_S = 10.0, TOOL_MS / 1000
# Offline (this sandbox has no route to the internet), XProf's frontend cannot load Google
# Charts from www.gstatic.com: its chart code then throws "google is not defined" (already in
# the conftest's KNOWN_PAGE_ERRORS) and, on the tools that draw charts, this one when it
# looks the loader up. Both name Google's external loader, nothing of mldiag's pages.
XPROF_OFFLINE = (re.compile(r"google(\.charts)? is not defined|google\.visualization"),)


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """A fresh `mldiag up` (so its one-time login URL is unused) with the two sessions."""
    yield from start_up(tmp_path_factory, [BEFORE, AFTER], name="newcomer-up")


class Timings:
    """Each step's load time, and the problems the browser saw during it."""

    def __init__(self, watch: Watch) -> None:
        self.watch, self.steps = watch, list[dict[str, Any]]()

    def step(self, name: str, go: Callable[[], Any], limit_s: float = PAGE_S) -> Any:
        errors_before = len(self.watch.errors)
        t = time.perf_counter()
        out = go()
        seconds = round(time.perf_counter() - t, 3)
        new = [e for e in self.watch.errors[errors_before:]
               if not any(p.search(e) for p in XPROF_OFFLINE)]
        self.steps.append({"step": name, "seconds": seconds, "errors": new})
        return out

    def check(self) -> None:
        (ARTIFACTS / "newcomer-walk.json").write_text(json.dumps(self.steps, indent=1) + "\n")
        for s in self.steps:
            print(f"newcomer walk: {s['step']:40} {s['seconds']:7.3f} s")
        slow = [s for s in self.steps
                if s["seconds"] > (TOOL_S if s["step"].startswith("xprof ") else PAGE_S)]
        failed = [f"{s['step']}: {e}" for s in self.steps for e in s["errors"]]
        bad = [f"{status} {url}" for status, url in self.watch.responses if status >= 400]
        assert not failed and not bad and not slow, "\n".join(
            failed + bad + [f"slow: {s}" for s in slow])


def loaded(page: Page, url: str) -> Callable[[], Response | None]:
    def go() -> Response | None:
        r = page.goto(url)
        page.wait_for_load_state("load")
        return r
    return go


def test_a_newcomer_walks_from_sign_in_to_compare(console: Console, browse: Browse,
                                                  browser: Browser, shot: Shot) -> None:
    print(f"newcomer walk on Chromium {browser.version}")
    ctx, watch = browse.context()
    walk = Timings(watch)
    page = ctx.new_page()

    # Sign in with the one-time URL `mldiag up` printed: it lands on the runs.
    walk.step("sign in (login URL → runs)", loaded(page, console.login_url))
    expect(page).to_have_url(console.url + "/")
    row = page.locator(f'table.runs tr[data-run="{RUN}"]')
    expect(row).to_contain_text(RUN)
    # Times read in the browser's zone, with their age; the UTC text is the tooltip.
    created = row.locator("time.when").first
    expect(created).to_contain_text(re.compile(r"ago|now"))
    expect(created).to_have_attribute("title", re.compile(r" UTC$"))
    shot(page, "runs")

    walk.step("runs → run", lambda: (row.get_by_role("link", name=RUN, exact=True).click(),
                                     page.wait_for_load_state("load")))
    expect(page).to_have_url(f"{console.url}/runs/{RUN}")
    sessions = page.locator("table.sessions tr[data-session]")
    expect(sessions).to_have_count(2)
    # The page leads with the profiles; with no live target, Capture says why it is off.
    heads = page.locator("main h2").all_inner_texts()
    assert heads[0] == "Profiles", heads
    expect(page.get_by_role("button", name="Capture", exact=True)).to_be_disabled()
    expect(page.locator("#no-target")).to_contain_text("No live target")
    shot(page, "run", full_page=True)

    after = page.locator(f'table.sessions tr[data-session="{AFTER.session}"]')
    walk.step("run → session", lambda: (
        after.get_by_role("link", name=AFTER.session, exact=True).click(),
        page.wait_for_load_state("load")))
    expect(page).to_have_url(console.url + AFTER.path)
    verdict = page.locator("#verdict .summary")
    expect(verdict).not_to_be_empty()
    sentence = verdict.inner_text().split(". ")[0]
    # Said once on the page (the folded report is its own document).
    assert page.locator("main").inner_text().count(sentence) == 1, sentence
    assert "`" not in page.locator("main").inner_text()
    shot(page, "session", full_page=True)

    with ctx.expect_page() as tab:
        walk.step("session → report (open alone)", lambda: page.get_by_role(
            "link", name="open alone").first.click())
    report = tab.value
    walk.step("report loaded", lambda: report.wait_for_load_state("load"))
    expect(report.locator("h1 .badge")).to_have_text(
        re.compile("OPTIMAL|NEEDS_ATTENTION|INSUFFICIENT_DATA"))
    shot(report, "report", full_page=True)
    report.close()

    xprof, tags = walk.step("session → XProf (overview)", lambda: open_xprof(ctx, page),
                            TOOL_S)
    assert {"overview_page", "trace_viewer@", "op_profile"} <= set(tags), tags
    base = console.url + AFTER.path
    for tag in tags:
        query = urlencode({"run": AFTER.session, "tag": tag, "host": AFTER.host})

        def tool(tag: str = tag, query: str = query) -> Response:
            wanted = ("module_list?" if tag == "graph_viewer" else "data?")
            with xprof.expect_response(lambda r: XPROF + wanted in r.url,
                                       timeout=TOOL_MS) as data:
                xprof.goto(f"{base}{XPROF}{quote(tag)}?{query}")
            xprof.wait_for_load_state("load")
            return data.value

        data = walk.step(f"xprof {tag}", tool, TOOL_S)
        assert data.status == 200, (tag, data.url)
        shot(xprof, f"xprof-{tag.rstrip('@')}")
    xprof.close()

    # Share with anyone; the link opens in a fresh browser context, signed in as no one.
    page.locator("input.share-anyone").check()
    page.get_by_role("button", name="Share").click()
    share_url = page.locator("output.share-url")
    expect(share_url).to_contain_text(f"{console.url}/share/")
    guest, guest_watch = browse.context()
    shared = guest.new_page()
    guest_walk = Timings(guest_watch)
    guest_walk.step("share link in a fresh context", loaded(shared, share_url.inner_text()))
    expect(shared.locator("h1")).to_contain_text(f"{RUN} / {AFTER.session}")
    expect(shared.locator("header .who")).to_have_text("shared link")
    shot(shared, "shared", full_page=True)

    walk.step("session → run", loaded(page, f"{console.url}/runs/{RUN}"))
    form = page.locator("form.compare")
    # The user picks the two (the defaults follow creation order, and the two fixtures are
    # created within the same second).
    form.locator('select[name="a"]').select_option(BEFORE.session)
    form.locator('select[name="b"]').select_option(AFTER.session)
    expect(form.locator('select[name="a"]')).to_have_value(BEFORE.session)
    expect(form.locator('select[name="b"]')).to_have_value(AFTER.session)
    walk.step("run → compare", lambda: (form.get_by_role("button", name="Compare").click(),
                                        page.wait_for_load_state("load")))
    expect(page).to_have_url(re.compile(rf"/runs/{RUN}/compare\?a=before&b=after"))
    headline = page.locator("#diff .summary")
    expect(headline).not_to_be_empty()
    # The diff's sentence once on the page; the full diff folded below it.
    assert page.locator("main").inner_text().count(headline.inner_text()) == 1
    page.locator("details.report > summary").click()
    expect(page.frame_locator("iframe.report").locator("h2").first).to_have_text(
        "What changed")
    shot(page, "compare", full_page=True)

    walk.steps += guest_walk.steps
    walk.check()


@pytest.mark.parametrize("scheme,width", [("dark", 1300), ("light", 390)])
def test_the_pages_fit_a_phone_and_follow_dark_mode(
        scheme: str, width: int, console: Console, browser: Browser,
        shot: Shot) -> None:
    ctx = browser.new_context(viewport={"width": width, "height": 900},
                              color_scheme=scheme,  # type: ignore[arg-type]
                              extra_http_headers={"Authorization": f"Bearer {console.token}"})
    watch = Watch(console.url)
    watch.attach(ctx)
    try:
        page = ctx.new_page()
        for name, path in (("runs", "/"), ("run", f"/runs/{RUN}"), ("session", AFTER.path),
                           ("sessions", "/sessions?q=after"),
                           ("compare", f"/runs/{RUN}/compare?a=before&b=after")):
            page.goto(console.url + path)
            page.wait_for_load_state("load")
            # Nothing wider than the screen: wide tables scroll in their own box.
            wide = page.evaluate("document.documentElement.scrollWidth")
            assert wide <= width, f"{path}: {wide} px wide at {width} px"
            background = page.evaluate("getComputedStyle(document.body).backgroundColor")
            channels = [int(c) for c in re.findall(r"\d+", background)[:3]]
            assert (sum(channels) < 150) == (scheme == "dark"), (path, background)
            shot(page, f"{name}-{scheme}-{width}", full_page=True)
        watch.check()
    finally:
        ctx.close()
