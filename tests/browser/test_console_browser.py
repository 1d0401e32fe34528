"""The console as a user walks it in chromium: sign in, browse to a session and its report,
open every XProf tool of a TPU and a GPU profile, share a session, and capture on demand from a
live JAX workload."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from playwright.sync_api import Page, Response, Route, expect

from tests.browser.conftest import PROFILES, Browse, Console, Profile, Shot, Watch, clean_env
from tests.helpers.browser import TOOL_MS, XPROF, drawn, open_xprof

pytestmark = pytest.mark.slow

WORKLOAD = Path(__file__).resolve().parents[1] / "e2e" / "sdk_workload.py"
VERDICTS = ("OPTIMAL", "NEEDS_ATTENTION", "INSUFFICIENT_DATA")


def _shows(text: str | re.Pattern[str]) -> Callable[[Page, Profile], None]:
    """The tool's page shows `text` ("{device}" in it: the profile's accelerator)."""

    def check(page: Page, p: Profile) -> None:
        want = text.format(device=p.device) if isinstance(text, str) else text
        expect(page.locator("body")).to_contain_text(want, timeout=TOOL_MS)

    return check


def _trace(page: Page, p: Profile) -> None:
    # The trace viewer is its own page in an iframe; its track names come from the trace.
    frame = page.frame_locator('iframe[src*="trace_viewer_index.html"]').first
    expect(frame.locator("body")).to_contain_text(f"{p.host} /device:{p.device}:",
                                                  timeout=TOOL_MS)
    drawn(page)


# What each tool shows once its data has arrived, by the tag the frontend routes to.
TOOLS: dict[str, Callable[[Page, Profile], None]] = {
    "overview_page": _shows("Device type: {device}"),
    "trace_viewer@": _trace,
    "op_profile": _shows("Overall {device} FLOPS utilization is"),
    "input_pipeline_analyzer": _shows("Device-side analysis details"),
    "kernel_stats": _shows("GPU Kernel Stats"),
    "memory_profile": _shows("Memory Profile Summary"),
    "memory_viewer": _shows(re.compile(r"Peak memory allocation: [\d.]+ MiB")),
    "roofline_model": _shows("Program-Level Analysis"),
    "graph_viewer": _shows(re.compile(r"Hlo Modules \([1-9]\d*\)")),
    "framework_op_stats": _shows("Framework Operations"),
    "hlo_stats": _shows("Time per HLO category"),
}
# Every session offers at least these; the walk checks whatever else the frontend lists.
ALWAYS = {"overview_page", "trace_viewer@", "op_profile", "memory_profile", "hlo_stats"}


def _is_data(r: Response) -> bool:
    return XPROF + "data?" in r.url or XPROF + "module_list?" in r.url


def walk_tools(xprof: Page, tags: list[str], watch: Watch, profile: Profile, base: str,
               shot: Shot) -> None:
    """Every tool the frontend offers shows its data, opened at the URL the frontend routes
    to (the tool list itself is hidden by the trace and graph viewers' own panels)."""
    tools = xprof.locator(".item-container", has_text=re.compile(r"Tools \(\d+\)")).locator(
        "mat-select")
    expect(tools).to_contain_text("Overview Page")
    tools.click()
    expect(xprof.get_by_role("option")).to_have_count(len(tags))
    shot(xprof, f"xprof-{profile.key}-tool-list")
    # Picking the tool already shown closes the list and stays.
    xprof.get_by_role("option", name="Overview Page", exact=True).click()
    expect(xprof.get_by_role("option")).to_have_count(0)
    unchecked = sorted(set(tags) - set(TOOLS))
    assert not unchecked, f"XProf offers {unchecked}, which this test does not check"
    assert ALWAYS <= set(tags), tags
    for tag in tags:
        query = urlencode({"run": profile.session, "tag": tag, "host": profile.host})
        # Some tools render their headings before their data: wait for the data too.
        with xprof.expect_response(_is_data, timeout=TOOL_MS) as data:
            xprof.goto(f"{base}{XPROF}{quote(tag)}?{query}")
        assert data.value.status == 200, (tag, data.value.url)
        TOOLS[tag](xprof, profile)
        shot(xprof, f"xprof-{profile.key}-{tag.rstrip('@')}")


def test_the_login_url_signs_in_once(console: Console, browse: Browse,
                                     admin_state: dict[str, Any], shot: Shot) -> None:
    ctx, watch = browse.context(allow=(401,))
    page = ctx.new_page()
    response = page.goto(console.login_url)
    assert response is not None and response.status == 401
    expect(page.locator("p.err")).to_contain_text("already used")
    shot(page, "login-url-used")
    watch.check()


@pytest.mark.parametrize("key", list(PROFILES))
def test_browse_to_a_session_and_open_every_xprof_tool(
        key: str, console: Console, browse: Browse, admin_state: dict[str, Any],
        shot: Shot) -> None:
    profile = PROFILES[key]
    expected = console.api(f"/api/v1/runs/{profile.run}/sessions/{profile.session}")
    verdict = expected["verdict"]
    assert verdict in VERDICTS
    ctx, watch = browse.context(signed_in=admin_state)
    page = ctx.new_page()
    page.goto(console.url + "/")
    runs = page.locator("table.runs")
    for p in PROFILES.values():
        expect(runs.locator(f'tr[data-run="{p.run}"]')).to_contain_text(p.run)
    expect(page.locator("header .who")).to_contain_text("local-admin")
    shot(page, "runs")

    runs.get_by_role("link", name=profile.run, exact=True).click()
    expect(page).to_have_url(f"{console.url}/runs/{profile.run}")
    row = page.locator(f'table.sessions tr[data-session="{profile.session}"]')
    expect(row.locator('[data-field="state"]')).to_have_text("REPORTED")
    expect(row.locator('[data-field="verdict"]')).to_have_text(verdict)
    expect(row.locator('[data-field="top_finding"]')).to_have_text(expected["top_finding"])
    shot(page, "run")

    row.get_by_role("link", name=profile.session, exact=True).click()
    expect(page).to_have_url(console.url + profile.path)
    expect(page.locator('h1 [data-field="state"]')).to_have_text("REPORTED")
    expect(page.locator('h1 [data-field="verdict"]')).to_have_text(verdict)
    # The summary's `code` spans are drawn as <code>: the text reads without the backticks.
    expect(page.locator("#verdict .summary")).to_have_text(expected["summary"].replace("`", ""))
    # What the verdict was judged over, in the report's words (the analysis's reading).
    expect(page.locator("#verdict")).to_contain_text(re.compile(r"host.*: .*judged over"))
    findings = page.locator("table.findings tbody tr")
    expect(findings).to_have_count(len(expected["findings"]))
    if expected["findings"]:
        expect(findings.first).to_contain_text(expected["findings"][0]["title"])
    report = page.frame_locator("iframe.report")
    expect(report.locator("h1 .badge")).to_have_text(verdict)
    expect(report.locator("h1")).to_contain_text(f"{profile.run} / {profile.session}")
    expect(page.locator("#hosts")).to_contain_text(profile.host)
    shot(page, "session", full_page=True)

    xprof, tags = open_xprof(ctx, page)
    walk_tools(xprof, tags, watch, profile, console.url + profile.path, shot)
    data = [s for s, u in watch.responses if XPROF + "data?" in u]
    assert len(data) >= len(tags) and all(s < 500 for s, _ in watch.responses)
    watch.check()


def test_share_a_session_then_restrict_and_revoke_links(
        console: Console, browse: Browse, admin_state: dict[str, Any], shot: Shot) -> None:
    profile = PROFILES["tpu"]
    ctx, watch = browse.context(signed_in=admin_state)
    page = ctx.new_page()
    page.goto(console.url + profile.path)
    share_url = page.locator("output.share-url")
    page.locator("input.share-anyone").check()
    page.get_by_role("button", name="Share").click()
    expect(share_url).to_contain_text(f"{console.url}/share/")
    anyone = share_url.inner_text()
    assert anyone.endswith(profile.path), anyone
    shot(page, "shared-anyone")

    # Opened without any cookie: the session, its report and its XProf, nothing else.
    guest, guest_watch = browse.context()
    shared = guest.new_page()
    shared.goto(anyone)
    expect(shared.locator("h1")).to_contain_text(f"{profile.run} / {profile.session}")
    expect(shared.locator('h1 [data-field="state"]')).to_have_text("REPORTED")
    expect(shared.locator("header .who")).to_have_text("shared link")
    expect(shared.frame_locator("iframe.report").locator("h1 .badge")).to_have_text(
        re.compile("|".join(VERDICTS)))
    expect(shared.locator("#links")).to_have_count(0)
    expect(shared.get_by_role("button", name="Share")).to_have_count(0)
    shot(shared, "shared-page", full_page=True)
    xprof, _ = open_xprof(guest, shared)
    assert xprof.url.startswith(anyone + XPROF), xprof.url
    TOOLS["overview_page"](xprof, profile)
    shot(xprof, "shared-xprof")
    guest_watch.check()

    # Restricted: whoever opens it must sign in first.
    page.locator("input.share-anyone").uncheck()
    page.get_by_role("button", name="Share").click()
    expect(share_url).not_to_have_text(anyone)
    expect(share_url).to_contain_text(f"{console.url}/share/")
    restricted = share_url.inner_text()
    stranger, stranger_watch = browse.context(allow=(401,))
    signin = stranger.new_page()
    response = signin.goto(restricted)
    assert response is not None and response.status == 401
    expect(signin.locator("h1")).to_have_text("Sign in")
    expect(signin.locator("p.err")).to_contain_text("sign in")
    shot(signin, "restricted-sign-in")
    signin.locator('input[name="token"]').fill(console.token)
    signin.get_by_role("button", name="Sign in").click()
    expect(signin).to_have_url(restricted)
    expect(signin.locator("h1")).to_contain_text(f"{profile.run} / {profile.session}")
    stranger_watch.check()

    # Both links are listed on the session page; revoking one closes it at once.
    page.reload()
    links = page.locator("#links tbody tr")
    expect(links).to_have_count(2)
    public = links.filter(has_text="anyone with the link")
    expect(public).to_contain_text("active")
    shot(page, "links", full_page=True)
    public.get_by_role("button", name="Revoke").click()
    expect(public).to_contain_text("revoked")
    expect(public.get_by_role("button", name="Revoke")).to_have_count(0)
    expect(links.filter(has_text="signed-in users")).to_contain_text("active")
    late, late_watch = browse.context(allow=(404,))
    gone = late.new_page()
    response = gone.goto(anyone)
    assert response is not None and response.status == 404
    expect(gone.locator("h1")).to_have_text("Not found")
    shot(gone, "revoked-404")
    late_watch.check()
    watch.check()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def workload(console: Console, tmp_path: Path) -> Iterator[str]:
    """tests/e2e/sdk_workload.py (JAX, mldiag.sdk with on_demand_xprof) on the console's home;
    its run name, once its target's heartbeat reached the console."""
    run = "browser-train"
    log = (tmp_path / "workload.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, str(WORKLOAD), "--run", run, "--port", str(_free_port()),
         "--seconds", "300"],
        env=clean_env(MLDIAG_HOME=str(console.home), MLDIAG_HOST_NAME="w0"),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not _target_up(console, run):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the workload never registered its target:\n"
                            + (tmp_path / "workload.log").read_text()[-3000:])
            time.sleep(0.2)
        yield run
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def _target_up(console: Console, run: str) -> bool:
    runs = {r["name"]: r for r in console.api("/api/v1/runs")}
    return run in runs and runs[run]["targets_up"] >= 1


def test_capture_on_demand_from_the_action_bar(
        console: Console, browse: Browse, admin_state: dict[str, Any], workload: str,
        shot: Shot) -> None:
    api = f"/api/v1/runs/{workload}/sessions/browser-od1"
    # The page polls for the new session before following it (the pipeline creates it after
    # accepting the capture): its first polls answer 404, as a slow pipeline would.
    ctx, watch = browse.context(signed_in=admin_state, allow_at=((404, api),))
    page = ctx.new_page()
    polls: list[str] = []

    def slow_pipeline(route: Route) -> None:
        polls.append(route.request.method)
        if len(polls) <= 2:
            route.fulfill(status=404, json={"detail": "no session yet"})
        else:
            route.continue_()

    page.route(console.url + api, slow_pipeline)
    page.goto(f"{console.url}/runs/{quote(workload)}")
    expect(page.locator("#targets tbody tr")).to_contain_text("w0")
    expect(page.locator("#targets tbody tr")).to_contain_text("up")
    form = page.locator("#actions form.action", has_text="Capture on demand")
    form.locator('input[name="session"]').fill("browser-od1")
    form.locator('input[name="duration_s"]').fill("1")
    shot(page, "run-before-capture", full_page=True)
    form.get_by_role("button", name="Capture").click()
    expect(page).to_have_url(f"{console.url}/runs/{workload}/sessions/browser-od1")
    assert len(polls) >= 3
    page.unroute(console.url + api)
    expect(page.locator("h1")).to_contain_text(f"{workload} / browser-od1")
    shot(page, "session-capturing")
    # The page polls the API and reloads itself once the session is REPORTED.
    expect(page.locator('h1 [data-field="state"]')).to_have_text("REPORTED", timeout=120_000)
    expect(page.locator('h1 [data-field="verdict"]')).to_have_text(re.compile("|".join(VERDICTS)))
    expect(page.locator("#verdict .summary")).not_to_be_empty()
    expect(page.frame_locator("iframe.report").locator("h1")).to_contain_text(
        f"{workload} / browser-od1")
    expect(page.locator("#hosts")).to_contain_text("w0")
    shot(page, "session-reported", full_page=True)
    watch.check()
