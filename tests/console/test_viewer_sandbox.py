"""What the console serves of xprof's answers when the bucket or the profile is hostile: a cached
answer's type comes from the tool and the request, never from what is stored beside it, and
xprof's HTML answers are sandboxed, the graph page rebuilt so that no profile text is markup or
code in it."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mldiag.console import xprof_html
from mldiag.console.app import create_app
from mldiag.viewer import Viewers
from mldiag.viewer_cache import MANIFEST, cache_prefix, object_name
from tests.console.conftest import HOST, Site

XP = "/runs/tpu/sessions/s1/xprof/data/plugin/profile"
OVERVIEW = {"run": "s1", "tag": "overview_page", "host": HOST}
HOSTS = {"run": "s1", "tag": "overview_page"}
EVIL = "https://attacker.example/"


def _fresh(site: Site, root: Path) -> TestClient:
    """A console on the same bucket with a viewer cache of its own (nothing opened yet)."""
    console = replace(site.console, viewers=Viewers(site.runtime.storage, root))
    return TestClient(create_app(console), base_url="http://127.0.0.1:8790")


@pytest.fixture
def poisoned(site: Site, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Two of the session's prebuilt answers rewritten in the bucket, as anyone who may write
    the bucket can: the overview's as a script stored as `text/javascript`, the host list's as
    an HTML page stored as `text/html` that loads it. Restored afterwards."""
    storage = site.runtime.storage
    s = site.runtime.state.get_session("tpu", "s1")
    assert s is not None
    prefix = cache_prefix(s)
    probe = Viewers(storage, tmp_path / "probe").workspace(s)
    files = json.loads(storage.read_bytes(f"{prefix}/{MANIFEST}"))["files"]
    script_url = f"{XP}/data?run=s1&tag=overview_page&host={HOST}"
    plants = {
        "data": (OVERVIEW, b"document.title = 'pwned by the bucket';", "text/javascript"),
        "hosts": (HOSTS, f'<script src="{script_url}"></script>'.encode(), "text/html"),
    }
    saved: dict[str, bytes] = {}
    names: dict[str, str] = {}
    for route, (query, body, stored_type) in plants.items():
        rel = probe.cached_path(route, query).relative_to(probe.root).as_posix()
        assert rel in files and f"{rel}.json" in files, rel
        for name, data in ((object_name(prefix, rel), body), (
                object_name(prefix, rel) + ".json",
                json.dumps({"content_type": stored_type, "content_encoding": None}).encode())):
            saved[name] = storage.read_bytes(name)
            storage.write_bytes(name, data)
        names[route] = rel
    try:
        yield names
    finally:
        for name, data in saved.items():
            storage.write_bytes(name, data)


def test_a_cached_answer_is_typed_by_its_tool_never_by_its_stored_metadata(
        site: Site, poisoned: dict[str, str], tmp_path: Path) -> None:
    viewer = site.auth("viewer")
    with _fresh(site, tmp_path / "cache") as client:
        script = client.get(f"{XP}/data", params=OVERVIEW, headers=viewer)
        page = client.get(f"{XP}/hosts", params=HOSTS, headers=viewer)
    # The planted bodies are what the bucket holds now: the console serves them, as data.
    assert script.status_code == 200 and b"pwned by the bucket" in script.content
    assert page.status_code == 200 and b"<script src=" in page.content
    assert script.headers["content-type"] == "application/json"
    assert page.headers["content-type"] == "application/json"
    for r in (script, page):
        assert r.headers["x-content-type-options"] == "nosniff"
        csp = r.headers["content-security-policy"]
        assert csp.startswith("sandbox;") and "default-src 'none'" in csp, csp


def test_an_html_answer_is_sandboxed_and_never_run_unless_it_is_the_graph_page_framed(
        site: Site) -> None:
    viewer = site.auth("viewer")
    modules = site.client.get(f"{XP}/module_list?run=s1", headers=viewer).text.split(",")
    module = next(m for m in modules if m.startswith("jit_f("))
    query = {"run": "s1", "tag": "graph_viewer", "host": HOST, "module_name": module,
             "node_name": "broadcast_add_fusion.2", "graph_width": "3", "type": "graph",
             "format": "html"}
    framed = site.client.get(f"{XP}/data", params=query,
                             headers={**viewer, "Sec-Fetch-Dest": "iframe"})
    assert framed.status_code == 200
    assert framed.headers["content-type"].startswith("text/html")
    csp = framed.headers["content-security-policy"]
    assert csp.startswith("sandbox allow-scripts;") and "allow-same-origin" not in csp
    assert "frame-ancestors 'self'" in csp and "'unsafe-inline'" not in csp.split(
        "script-src")[1].split(";")[0]
    # Offline: the scripts and the font come from the console, not from Google's servers.
    assert "gstatic.com" not in framed.text and "fonts.googleapis.com" not in framed.text
    for name in re.findall(r'(?:src="|@import url\()' + re.escape(xprof_html.VENDOR_PATH)
                           + r'([^")]+)', framed.text):
        asset = site.client.get(xprof_html.VENDOR_PATH + name)  # public, no sign-in
        assert asset.status_code == 200 and asset.headers["content-type"] == (
            xprof_html.VENDOR[name]), name
        assert asset.headers["access-control-allow-origin"] == "*"
    # Its one inline script is allowed by its hash, and is the page's.
    inline = re.findall(r"<script>(.*?)</script>", framed.text, re.S)
    assert len(inline) == 1 and "hpccWasm.graphviz.layout" in inline[0]
    assert xprof_html._hash_source(inline[0]) in csp
    # Opened on its own (a link, a new tab): shown without scripts.
    alone = site.client.get(f"{XP}/data", params=query,
                            headers={**viewer, "Sec-Fetch-Dest": "document"})
    assert alone.headers["content-security-policy"] == xprof_html.INERT_HTML_CSP
    assert "allow-scripts" not in xprof_html.INERT_HTML_CSP
    # The graph's frame is at the address xprof's frontend makes (two doubled slashes).
    # (A URL whole: httpx would read `//runs/...` as a host.)
    at = f"{site.client.base_url}/{XP.replace('/xprof/', '/xprof//')}/data"
    doubled = site.client.get(at, params=query, headers={**viewer, "Sec-Fetch-Dest": "iframe"})
    assert doubled.status_code == 200 and doubled.text == framed.text
    assert site.client.get(at, params=query).status_code == 401


@pytest.fixture(scope="module")
def xprof_page(site: Site) -> str:
    """The graph page the pinned xprof writes for the TPU fixture, as it writes it."""
    s = site.runtime.state.get_session("tpu", "s1")
    assert s is not None
    ws = site.console.viewers.workspace(s)
    module = next(m for m in ws.modules() if m.startswith("jit_f("))
    out = ws.answer("data", {"run": "s1", "tag": "graph_viewer", "host": HOST,
                             "module_name": module, "node_name": "broadcast_add_fusion.2",
                             "type": "graph", "format": "html"})
    page = (gzip.decompress(out.body) if out.content_encoding == "gzip" else out.body).decode()
    assert "Parameter 0" in page and "gstatic.com" in page
    return page


@pytest.mark.parametrize("planted", [
    f'</script><meta http-equiv="refresh" content="0;url={EVIL}">',
    f"</SCRIPT ><script>location = '{EVIL}'</script>",
    "<!--<script>",
])
def test_markup_a_profile_plants_in_the_graph_page_stays_text(planted: str,
                                                            xprof_page: str) -> None:
    page, script_hash = xprof_html.graph_page(xprof_page.replace("Parameter 0", planted, 1))
    assert script_hash is not None  # still drawn: the text is a label
    inline = re.findall(r"<script>(.*?)</script>", page, re.S | re.I)
    assert len(inline) == 1 and xprof_html._hash_source(inline[0]) == script_hash
    assert "<meta http-equiv" not in page.lower() and EVIL not in page.split("const data")[0]
    # The DOT text is one JSON string that holds the label as it was.
    literal = re.search(r"const data = (\".*?(?<!\\)\");", page, re.S)
    assert literal is not None and planted in json.loads(literal.group(1))


@pytest.mark.parametrize("planted", ["`; location = '" + EVIL + "'; `", "${location}",
                                     "\\1"])
def test_a_graph_page_whose_text_would_run_code_is_served_without_scripts(
        planted: str, xprof_page: str) -> None:
    original = xprof_page.replace("Parameter 0", planted, 1)
    page, script_hash = xprof_html.graph_page(original)
    assert script_hash is None and page == original
    assert "allow-scripts" not in xprof_html.graph_csp(script_hash, framed=True)
