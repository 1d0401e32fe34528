"""The XProf frontend as the browser tests drive it: opening it from a session page, and
knowing when its trace viewer has drawn the trace."""

from __future__ import annotations

import re

from playwright.sync_api import BrowserContext, Page, expect

XPROF = "/xprof/data/plugin/profile/"
# How long a tool may take to show its data.
TOOL_MS = 60_000


# The trace viewer has fitted its view to the trace: the range on screen overlaps the span the
# answer gave (`fullTimespan`), and events of the answer were loaded. Before that, the tracks
# are listed but the view is the empty default one (0-800 ms), so a screenshot shows no event.
_DRAWN = """() => {
  const v = document.querySelector('tf-trace-viewer');
  const r = v && v.currentViewportRange, b = v && v._fullBounds;
  return !!(r && b && v._loadedTraceEvents && v._loadedTraceEvents.size > 0
            && r.max > b.min && r.min < b.max && r.max - r.min > (b.max - b.min) / 2);
}"""


def drawn(page: Page) -> None:
    """Wait until the trace viewer shows the trace's events, not only its tracks."""
    frame = next(f for f in page.frames if "trace_viewer_index.html" in f.url)
    frame.wait_for_function(_DRAWN, timeout=TOOL_MS)


def open_xprof(ctx: BrowserContext, page: Page) -> tuple[Page, list[str]]:
    """Click "Open in XProf": the frontend opens in a new tab on its overview page. Returns
    the tab and the tools the frontend was told this session has."""
    with ctx.expect_event("response", lambda r: "/run_tools?" in r.url,
                          timeout=TOOL_MS) as run_tools, ctx.expect_page() as tab:
        page.get_by_role("link", name="Open in XProf").click()
    xprof = tab.value
    expect(xprof).to_have_url(re.compile(re.escape(XPROF) + r"overview_page\?"), timeout=TOOL_MS)
    tags = run_tools.value.json()
    assert isinstance(tags, list) and all(isinstance(t, str) for t in tags), tags
    return xprof, tags
