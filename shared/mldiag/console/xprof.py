"""The official XProf frontend for one session, under `<session>/xprof/`.

The frontend (from the pinned xprof wheel) takes its base from the page's path before
`/data/plugin/profile`, so it is served at `<session>/xprof/data/plugin/profile/` and every
request it makes stays under that prefix. Its data routes are answered by the session's
`mldiag.viewer.Workspace`: this session alone, through xprof's own plugin. `capture_profile`,
`generate_cache` and every other route of the official server are not routed here.

Besides: the Graph Viewer frames its graph at the data route with doubled slashes
(`//<session>/xprof//data/plugin/profile/data`), routed too; xprof's HTML answers are sandboxed
and the files the graph page needs are served at `/xprof-vendor/` (`console.xprof_html`); the
index carries the console's own script (`PAGE_SCRIPT`: the offline banner, the graph's end of
loading, its address kept under the prefix).
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import json
import re
from collections.abc import Callable
from importlib import resources
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.responses import RedirectResponse

from mldiag.access import PROFILE, Principal
from mldiag.console import xprof_html
from mldiag.console.auth import console_of, require
from mldiag.console.pages import error_response, get_session
from mldiag.model import SessionRecord
from mldiag.viewer import HTML, ViewerError
from mldiag.viewer_cache import REBUILDING, CacheExpired, unviewable, xprof_version

router = APIRouter()
PLUGIN = "/xprof/data/plugin/profile"
STATIC = {
    "index.html": "text/html; charset=utf-8", "index.js": "text/javascript",
    "bundle.js": "text/javascript", "runtime.js": "text/javascript",
    "zone.js": "text/javascript", "styles.css": "text/css",
    "materialicons.woff2": "font/woff2", "material_symbols_outlined.woff2": "font/woff2",
    "trace_viewer_index.html": "text/html; charset=utf-8",
    "trace_viewer_index.js": "text/javascript", "trace_viewer_v2.js": "text/javascript",
    "trace_viewer_v2.wasm": "application/wasm",
}
DATA_ROUTES = ("runs", "run_tools", "hosts", "module_list", "data")
# The official server's routes that capture, write caches or browse the host's files.
REFUSED_ROUTES = frozenset({"capture_profile", "generate_cache", "local", "data_csv"})


def _static(name: str) -> bytes:
    return (resources.files("xprof") / "static" / name).read_bytes()


def _sha256_source(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


# An Angular template's static attributes are compiled into the bundle as flat
# `[name, value, ...]` arrays; an inline event handler among them reads `"onload","focus();"`.
_STATIC_HANDLER = re.compile(r'[\[,]"(on[a-z]+)","((?:[^"\\]|\\.)*)"')


def inline_handlers() -> list[str]:
    """The inline event handlers the frontend's templates set (`onload="focus();"` on the
    trace viewer's iframe, `oncontextmenu="event.preventDefault()"` on its canvas), read from
    the pinned bundle, so a new pin's handlers are allowed by their hashes without a code
    change. Escapes are decoded as the browser sees the attribute's value."""
    found: list[str] = []
    for _, value in _STATIC_HANDLER.findall(_static("bundle.js").decode()):
        code = json.loads(f'"{value}"')
        if code not in found:
            found.append(code)
    return found


@functools.cache
def frontend_csp() -> str:
    """The frontend's policy: its own scripts, the hashes of index.html's two inline
    scripts and of its templates' inline event handlers (`'unsafe-hashes'`: those handlers
    alone, never `'unsafe-inline'`), Google Charts' loader (which it tries, then boots
    without), and WebAssembly for the trace viewer. Component styles are inline, as Angular
    writes them."""
    page = _static("index.html").decode()
    hashes = " ".join(_sha256_source(body)
                      for body in re.findall(r"<script>(.*?)</script>", page, re.S))
    handlers = " ".join(_sha256_source(code) for code in inline_handlers())
    return ("default-src 'self'; "
            f"script-src 'self' {hashes} 'unsafe-hashes' {handlers} "
            "https://www.gstatic.com https://www.gstatic.cn "
            "'wasm-unsafe-eval'; style-src 'self' 'unsafe-inline' https://www.gstatic.com "
            "https://fonts.googleapis.com; img-src 'self' data: blob:; "
            "font-src 'self' data: https://fonts.gstatic.com; connect-src 'self'; "
            "worker-src 'self' blob:; frame-src 'self'; frame-ancestors 'self'; "
            "base-uri 'self'; form-action 'none'; object-src 'none'")


def _answer(request: Request, s: SessionRecord, route: str) -> Response:
    console = console_of(request)
    if route == "config":
        return _json({"hideCaptureProfileButton": True, "srcPathPrefix": "",
                      "enableTabNameLabel": False})
    if route == "version":
        return Response(xprof_version(), media_type="text/plain")
    if route not in DATA_ROUTES:
        raise HTTPException(404, f"{route} is not served for a session")
    try:
        ws = console.viewers.workspace(s)
        out = ws.answer(route, dict(request.query_params))
    except CacheExpired as e:  # a window fetched late was gone
        lost = console.viewers.lost(s, e)
        raise HTTPException(lost.status, str(lost)) from e
    except ViewerError as e:
        raise HTTPException(e.status, str(e)) from e
    headers = {"Cache-Control": "private, max-age=60", "Vary": "Accept-Encoding"}
    body, encoding = out.body, out.content_encoding
    if out.content_type == HTML:
        # An HTML answer holds profile text: sandboxed, and the graph page rebuilt.
        body, encoding, request.state.csp = _html_answer(request, body, encoding)
        headers["Vary"] = "Accept-Encoding, Sec-Fetch-Dest"
    else:
        request.state.csp = xprof_html.DATA_CSP
    if encoding == "gzip" and "gzip" not in request.headers.get("accept-encoding", ""):
        body = gzip.decompress(body)
    elif encoding:
        headers["Content-Encoding"] = encoding
    return Response(body, media_type=out.content_type, headers=headers)


def _html_answer(request: Request, body: bytes, encoding: str | None
                 ) -> tuple[bytes, str | None, str]:
    """An HTML answer's body, encoding and policy (`xprof_html`)."""
    if request.query_params.get("tag") != "graph_viewer":
        return body, encoding, xprof_html.INERT_HTML_CSP
    page, script_hash = xprof_html.graph_page(
        (gzip.decompress(body) if encoding == "gzip" else body).decode("utf-8", "replace"))
    framed = request.headers.get("sec-fetch-dest") == "iframe"
    return page.encode(), None, xprof_html.graph_csp(script_hash, framed=framed)


def _json(data: Any) -> Response:
    return Response(json.dumps(data), media_type="application/json")


def serve(request: Request, s: SessionRecord, path: str) -> Response:
    """Answer `path` (what follows `/xprof/data/plugin/profile/`) for session `s`."""
    name = path.strip("/") or "index.html"
    if name in STATIC and name != "index.html":
        request.state.csp = frontend_csp()
        headers = {} if name.endswith(".html") else {"Cache-Control": "public, max-age=3600"}
        body = _bundle() if name == "bundle.js" else _static(name)
        return Response(body, media_type=STATIC[name], headers=headers)
    if name in DATA_ROUTES or name in ("config", "version") or name in REFUSED_ROUTES:
        return _answer(request, s, name)
    # The frontend's index, or its own routes (`overview_page?run=...`, a tool page
    # reloaded): its index, which routes itself; unless the session cannot be opened here,
    # which a page says (the frontend would only spin on its 503s).
    console = console_of(request)
    if console.viewers.rebuilding(s):
        # Reloaded until the rebuild's manifest is there (the pipeline's prebuild_viewer).
        return error_response(request, 503, f"{REBUILDING[0].upper()}{REBUILDING[1:]} The "
                              "XProf viewer opens here once it is built; this page reloads "
                              "itself.", headers={"Refresh": "15", "Retry-After": "15"},
                              page=True)
    if why := unviewable(s, console.plane.storage, console.viewers.memory_budget):
        return error_response(request, 503, f"The XProf viewer cannot open this session. "
                              f"{why[0].upper()}{why[1:]}.", page=True)
    request.state.csp = frontend_csp()
    return Response(_index(), media_type=STATIC["index.html"])


# The console's additions to the frontend's page: the note for a browser without a route to
# Google's servers (Google Charts, fonts), first in the head so that it sees those loads fail,
# and the end of "Loading graph..." once the sandboxed graph page says it has drawn.
PAGE_SCRIPT = "/static/xprof-page.js"


@functools.cache
def _bundle() -> bytes:
    """The frontend's bundle, its components' font served by the console (offline too)."""
    return _static("bundle.js").replace(*xprof_html.GOOGLE_SANS_CODE)


@functools.cache
def _index() -> bytes:
    """The frontend's index.html, with PAGE_SCRIPT."""
    return _static("index.html").replace(
        b"<head>", f'<head>\n  <script src="{PAGE_SCRIPT}"></script>'.encode(), 1)


def register(prefix: str, dependency: Callable[..., Any],
             session_of: Callable[[Request, Any], SessionRecord]) -> None:
    """Mount the frontend under `prefix + /xprof/` with `dependency` deciding access."""

    @router.get(prefix + "/xprof", include_in_schema=False)
    @router.get(prefix + "/xprof/", include_in_schema=False)
    def xprof_root(request: Request, principal: Any = Depends(dependency)) -> Response:
        return RedirectResponse(str(request.url.path).rstrip("/") + "/data/plugin/profile/",
                                status_code=307)

    @router.get(prefix + PLUGIN + "/{path:path}", include_in_schema=False)
    def xprof_path(path: str, request: Request, principal: Any = Depends(dependency)
                   ) -> Response:
        return serve(request, session_of(request, principal), path)

    # The Graph Viewer frames its graph at `${origin}/${pathPrefix}/${data route}` (xprof
    # 2.24.2's `getGraphVizUri`), both parts starting with a slash: the session's data route
    # with two doubled slashes.
    @router.get("/" + prefix + "/xprof/" + PLUGIN.removeprefix("/xprof") + "/data",
                include_in_schema=False)
    def graph_frame(request: Request, principal: Any = Depends(dependency)) -> Response:
        return serve(request, session_of(request, principal), "data")


@router.get(xprof_html.VENDOR_PATH + "{name}", include_in_schema=False)
def vendor(name: str) -> Response:
    """The files xprof's graph page loads from Google's servers, served here (public:
    open-source libraries and fonts; readable from the sandboxed page's opaque origin)."""
    if name not in xprof_html.VENDOR:
        raise HTTPException(404, "no such file")
    return Response(xprof_html.vendor_file(name), media_type=xprof_html.VENDOR[name],
                    headers={"Cache-Control": "public, max-age=86400",
                             "Access-Control-Allow-Origin": "*",
                             "Cross-Origin-Resource-Policy": "cross-origin"})


def _session(request: Request, principal: Principal) -> SessionRecord:
    p = request.path_params
    return get_session(console_of(request), p["run"], p["session"])


register("/runs/{run}/sessions/{session}", require(PROFILE), _session)
