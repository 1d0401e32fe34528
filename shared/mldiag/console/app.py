"""The console: one FastAPI app with routers per area (pages, API, XProf, share links, auth).

Every route declares who may call it (`console.auth.require` or a share link's own check);
every response carries the security headers below, with the page's own Content-Security-
Policy where it needs a different one (the XProf frontend, the sandboxed report); request
bodies are capped before anything reads them (`console.guard`).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

import mldiag
from mldiag.analysis import breakable, prose
from mldiag.console.context import Console
from mldiag.console.guard import Guard
from mldiag.listing import BadQuery

CONSOLE_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
               "connect-src 'self'; frame-src 'self'; frame-ancestors 'none'; "
               "base-uri 'self'; form-action 'self'; object-src 'none'")


_BOLD = re.compile(r"\*\*([^*<>]+?)\*\*")


def _fmt(value: Any) -> str:
    """A value as words, never a Python or JSON dump: findings' impact and fix, configs and
    recorded values may be text or structured (a dict's `text` or `summary` stands for it,
    else its items read "key: value; ...")."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        for key in ("text", "summary"):
            if value.get(key):
                return str(value[key])
        return "; ".join(f"{k}: {_fmt(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return "; ".join(_fmt(v) for v in value)
    return str(value)


def inline(value: Any) -> Markup:
    """Text with its inline Markdown drawn: escaped first, then `code` spans as <code> and
    **bold** as <b> (only ever around escaped text), so no backtick or asterisk shows."""
    return Markup(_BOLD.sub(r"<b>\1</b>", str(prose(_fmt(value)))))


def templates() -> Jinja2Templates:
    env = Environment(loader=PackageLoader("mldiag.web", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True))
    env.filters["fmt"] = _fmt
    # Escaped by prose itself, which only adds <code> around `code` spans.
    env.filters["prose"] = lambda value: Markup(prose(_fmt(value)))
    env.filters["inline"] = inline
    # The report's blocks (a pod's hosts, drawn by report/macros.html) need its filter too.
    env.filters["breakable"] = breakable
    return Jinja2Templates(env=env)


def create_app(console: Console) -> FastAPI:
    """The console app on `console`'s state, bucket, bus and access store."""
    from mldiag.console import api, pages, share, xprof

    app = FastAPI(title="mldiag console", version=mldiag.__version__,
                  openapi_url="/api/v1/openapi.json", docs_url=None, redoc_url=None)
    app.state.console = console
    app.state.templates = templates()

    # Outermost of the app's own layers: every response, errors included, gets the headers.
    app.add_middleware(Guard, csp=CONSOLE_CSP)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        return pages.error_response(request, exc.status_code, str(exc.detail),
                                    headers=getattr(exc, "headers", None))

    @app.exception_handler(BadQuery)
    async def bad_query(request: Request, exc: BadQuery) -> Response:
        # A list's cursor the store refuses (made by another store, or mangled).
        return pages.error_response(request, 422, str(exc))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"detail": exc.errors()}, status_code=422)
        return pages.error_response(request, 422, "bad request: "
                                    + "; ".join(str(e.get("msg")) for e in exc.errors()))

    app.mount("/static", StaticFiles(packages=[("mldiag.web", "static")]), name="static")
    app.include_router(pages.router)
    app.include_router(api.router)
    app.include_router(share.router)
    app.include_router(xprof.router)
    return app
