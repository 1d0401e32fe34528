"""HTML pages: runs, a run, a session (with its report, raw xplanes), sign-in and sign-out.

The session's sub-pages are written once (`session_page`, `report`, `download`) and served
both under `/runs/{run}/sessions/{session}` (for principals with a role) and under a share
link (`console.share`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from fastapi import APIRouter, Depends, Form, HTTPException, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse

from mldiag.access import (
    ADMIN,
    BROWSE,
    CAPTURE,
    PROFILE,
    REPORT,
    SHARE,
    Principal,
    TokenRecord,
    hash_secret,
    new_id,
    new_secret,
)
from mldiag.adapters.local.private import FILE_MODE, owner_only_dir, private_dir
from mldiag.analysis import style_hash
from mldiag.console import lists, views
from mldiag.console.auth import COOKIE, check_csrf, console_of, csrf_token, require, resolve
from mldiag.console.context import Console
from mldiag.console.redaction import redacted, session_reasons
from mldiag.listing import MAX_LIMIT, SessionQuery
from mldiag.model import SessionRecord, parse_object_name
from mldiag.viewer_cache import session_dir

router = APIRouter(include_in_schema=False)
BROWSER_TOKEN_S = 7 * 86400.0


def report_csp() -> str:
    """The report's own policy (its one style block, by hash), sandboxed: no scripts, no
    same-origin access, framed only by the console."""
    return (f"sandbox; default-src 'none'; style-src {style_hash()}; img-src data:; "
            "frame-ancestors 'self'")
_TITLES = {401: "Sign in required", 403: "Not allowed", 404: "Not found",
           409: "Conflict", 413: "Request too large", 422: "Bad request", 500: "Server error",
           503: "Unavailable"}


def wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api/") or "/xprof/data/" in request.url.path


def render(request: Request, template: str, status: int = 200, **context: Any) -> Response:
    console = console_of(request)
    principal = resolve(request)
    context.setdefault("shared", False)
    response: Response = request.app.state.templates.TemplateResponse(
        request, template,
        {"root": "", "principal": principal, "csrf": csrf_token(console, request), **context},
        status_code=status)
    return response


def error_response(request: Request, status: int, detail: str,
                   headers: dict[str, str] | None = None, *, page: bool = False) -> Response:
    """The error as JSON for API and data routes, else (or with `page`) as a page."""
    if wants_json(request) and not page:
        return JSONResponse({"detail": detail}, status_code=status, headers=headers)
    try:
        resolve(request)
    except HTTPException:
        request.state.principal = Principal("anonymous")
    if status == 401:
        return render(request, "console/login.html", status=401, message=detail,
                      next=request.url.path)
    response = render(request, "console/error.html", status=status, detail=detail,
                      title=_TITLES.get(status, "Error"))
    response.headers.update(headers or {})
    return response


def get_session(console: Console, run: str, session: str) -> SessionRecord:
    s = console.plane.state.get_session(run, session)
    if s is None:
        raise HTTPException(404, f"no session {run}/{session}")
    return s


@router.get("/favicon.ico", include_in_schema=False)
def favicon() -> Response:
    return Response(status_code=204)


# Runs


@router.get("/", response_class=HTMLResponse)
def runs_page(request: Request, principal: Principal = Depends(require(BROWSE))) -> Response:
    runs, next_cursor = views.runs_view(console_of(request), principal,
                                        lists.run_query(request))
    return render(request, "console/runs.html", runs=runs,
                  page=lists.list_form(request, lists.RUN_PARAMS, next_cursor, len(runs)))


@router.get("/sessions", response_class=HTMLResponse)
def sessions_list_page(request: Request,
                       principal: Principal = Depends(require(BROWSE))) -> Response:
    """Every run's sessions, filtered, sorted and paged like a run's."""
    names = (*lists.SESSION_PARAMS, "run")
    rows, next_cursor = views.sessions_page(console_of(request), principal,
                                            lists.session_query(request))
    return render(request, "console/sessions.html", sessions=rows,
                  page=lists.list_form(request, names, next_cursor, len(rows)))


@router.get("/runs/{run}", response_class=HTMLResponse)
def run_page(run: str, request: Request,
             principal: Principal = Depends(require(BROWSE))) -> Response:
    console = console_of(request)
    record = console.plane.state.get_run(run)
    if record is None:
        raise HTTPException(404, f"no run {run!r}")
    view = views.run_view(console, principal, record, chart=True,
                          query=lists.session_query(request, run=record.name))
    return render(request, "console/run.html", run=view,
                  page=lists.list_form(request, lists.SESSION_PARAMS, view["next_cursor"],
                                       len(view["sessions_list"])),
                  can_capture=principal.can(CAPTURE, run),
                  suggested_name=time.strftime("ondemand-%Y%m%d-%H%M%S"))


# A session's pages, shared with share links


def session_page(request: Request, principal: Principal, s: SessionRecord, base: str,
                 shared: bool) -> Response:
    console = console_of(request)
    links = []
    if not shared and principal.can(SHARE, s.run, s.session):
        now = console.clock()
        for link in console.access.list_links(run=s.run, session=s.session):
            state = ("revoked" if link.revoked_at else "expired" if now >= link.expires_at
                     else "active")
            links.append({"id": link.id, "anyone": link.anyone, "created_by": link.created_by,
                          "expires": views._iso(link.expires_at), "state": state,
                          "can_revoke": link.created_by == principal.name
                          or principal.can(ADMIN, s.run)})
    api = (f"/api/v1/runs/{quote(s.run, safe='')}/sessions/{quote(s.session, safe='')}"
           if not shared else f"{base}/state")
    return render(request, "console/session.html",
                  s=views.session_view(console, principal, s, pod=True),
                  base=base, api=api, shared=shared, links=links,
                  can_share=not shared and principal.can(SHARE, s.run, s.session),
                  can_report=principal.can(REPORT, s.run, s.session),
                  is_admin=principal.can(ADMIN, s.run))


def report(request: Request, s: SessionRecord, principal: Principal) -> Response:
    return _stored_page(request, s, principal, "summary.html",
                        "this session's report is missing from the bucket")


def diff_page(request: Request, s: SessionRecord, principal: Principal) -> Response:
    """The stored diff.html of an alert-triggered session (against its run's baseline)."""
    return _stored_page(request, s, principal, "diff.html",
                        "this session has no diff: only sessions captured on a degradation "
                        "alert are compared with a baseline (compare any two from the run's "
                        "page)")


def _stored_page(request: Request, s: SessionRecord, principal: Principal, name: str,
                 missing: str) -> Response:
    """A reported session's `analysis/<name>`, served under the report's CSP; 404 with
    `missing` when the bucket has no such file. For who may not view profiles, drawn again
    from its documents without the addresses and server paths they hold (`redaction`)."""
    console = console_of(request)
    if s.state != "REPORTED" or not s.hosts:
        raise HTTPException(404, "this session has no report yet")
    try:
        if principal.can(PROFILE, s.run, s.session):
            body = console.plane.storage.read_bytes(f"{session_dir(s)}/analysis/{name}")
        else:
            body = _redrawn(console, s, name).encode()
    except FileNotFoundError as e:
        raise HTTPException(404, missing) from e
    request.state.csp = report_csp()
    return Response(body, media_type="text/html; charset=utf-8")


def _own_object(console: Console, s: SessionRecord, host: str) -> bool:
    """Whether the host's object is this session's own profile: named
    `[<prefix>/]<run>/plugins/profile/<session>/<host>.xplane.pb` for this run, session and
    host, in the run's storage prefix (any, for a run discovered in the bucket)."""
    name = s.hosts[host].object_name
    try:
        parsed = parse_object_name(name)
    except ValueError:
        return False
    if parsed is None or (parsed.run, parsed.session, parsed.host) != (s.run, s.session, host):
        return False
    run = console.plane.state.get_run(s.run)
    return not (run is not None and run.storage_prefix
                and parsed.prefix != run.storage_prefix.strip("/"))


def download(request: Request, s: SessionRecord, host: str) -> Response:
    console = console_of(request)
    record = s.hosts.get(host)
    if record is None or record.status != "ARRIVED" or not _own_object(console, s, host):
        raise HTTPException(404, f"no profile of host {host!r} in this session")
    ws_dir = private_dir(owner_only_dir(console.viewers.root) / "downloads")
    digest = hashlib.sha256(f"{record.object_name}#{record.generation}".encode()).hexdigest()
    path = ws_dir / f"{digest[:32]}.xplane.pb"
    if not path.is_file():
        console.plane.storage.fetch_to(record.object_name, path)
        if path.stat().st_nlink == 1:
            os.chmod(path, FILE_MODE)  # a download (a hard link keeps the bucket's mode)
    return FileResponse(path, media_type="application/octet-stream",
                        filename=f"{host}.xplane.pb")


def session_base(s: SessionRecord) -> str:
    return f"/runs/{quote(s.run, safe='')}/sessions/{quote(s.session, safe='')}"


@router.get("/runs/{run}/sessions/{session}", response_class=HTMLResponse)
def session_route(run: str, session: str, request: Request,
                  principal: Principal = Depends(require(BROWSE))) -> Response:
    s = get_session(console_of(request), run, session)
    return session_page(request, principal, s, session_base(s), shared=False)


@router.get("/runs/{run}/sessions/{session}/report", response_class=HTMLResponse)
def report_route(run: str, session: str, request: Request,
                 principal: Principal = Depends(require(REPORT))) -> Response:
    return report(request, get_session(console_of(request), run, session), principal)


@router.get("/runs/{run}/sessions/{session}/diff.html", response_class=HTMLResponse)
def diff_route(run: str, session: str, request: Request,
               principal: Principal = Depends(require(REPORT))) -> Response:
    return diff_page(request, get_session(console_of(request), run, session), principal)


def _redrawn(console: Console, s: SessionRecord, name: str) -> str:
    """summary.html or diff.html of `s`, drawn from its stored documents redacted."""
    from mldiag.analysis import render_diff_html, render_summary_html

    def document(doc: str) -> Any:
        data = json.loads(console.plane.storage.read_bytes(f"{session_dir(s)}/analysis/{doc}"))
        return redacted(data, session_reasons(s))

    if name == "diff.html":
        return render_diff_html(document("diff.json"))
    return render_summary_html(document("analysis.json"), document("health_snapshot.json"))


def compared(console: Console, run: str, a: str, b: str,
             principal: Principal) -> dict[str, Any]:
    """The diff.json document of two REPORTED sessions of `run`, from their stored
    snapshots (without addresses and server paths for who may not view profiles); 404 for
    an unknown session, 409 for one that has no report."""
    from mldiag.regression import NotComparable, compare_sessions

    sa, sb = get_session(console, run, a), get_session(console, run, b)
    try:
        doc = compare_sessions(console.plane.storage, console.plane.state, sa, sb)
    except NotComparable as e:
        raise HTTPException(409, str(e)) from e
    if principal.can(PROFILE, run):
        return doc
    result: dict[str, Any] = redacted(doc, session_reasons(sa, sb))
    return result


@router.get("/runs/{run}/compare", response_class=HTMLResponse)
def compare_page(run: str, request: Request, a: str = "", b: str = "",
                 principal: Principal = Depends(require(REPORT))) -> Response:
    """Pick two sessions of the run; their diff below, in a sandboxed frame."""
    console = console_of(request)
    record = console.plane.state.get_run(run)
    if record is None:
        raise HTTPException(404, f"no run {run!r}")
    reported = console.plane.state.query_sessions(
        SessionQuery(run=run, state="REPORTED", limit=MAX_LIMIT)).items
    headline = ""
    if a and b:
        headline = compared(console, run, a, b, principal)["headline"]
    return render(request, "console/compare.html", run=record.name, a=a, b=b,
                  sessions=[views.session_row(x, principal) for x in reported], headline=headline,
                  baseline=record.baseline)


@router.get("/runs/{run}/compare/diff.html", response_class=HTMLResponse)
def compare_report(run: str, a: str, b: str, request: Request,
                   principal: Principal = Depends(require(REPORT))) -> Response:
    from mldiag.analysis import render_diff_html

    body = render_diff_html(compared(console_of(request), run, a, b, principal))
    request.state.csp = report_csp()
    return Response(body, media_type="text/html; charset=utf-8")


@router.get("/runs/{run}/sessions/{session}/hosts/{host}/xplane.pb")
def download_route(run: str, session: str, host: str, request: Request,
                   principal: Principal = Depends(require(PROFILE))) -> Response:
    return download(request, get_session(console_of(request), run, session), host)


# Signing in


def _sign_in(console: Console, record: TokenRecord) -> Response:
    """A browser session of `record`'s principal. Made from an API token, it names that
    token, acts as its principal and ends with it (`console.auth`); made from a login code
    (spent now), it names the admin token that issued the code and ends with that token,
    or when it expires or is signed out or revoked."""
    token = new_secret("mldiag")
    now = console.clock()
    expires_at = now + BROWSER_TOKEN_S
    parent = parent_hash = ""
    if record.kind == "api":
        parent, parent_hash = record.id, record.token_hash
        if record.expires_at:
            expires_at = min(expires_at, record.expires_at)
    else:
        parent, parent_hash = record.parent, record.parent_hash
    console.access.put_token(TokenRecord(
        id=new_id(), token_hash=hash_secret(token), principal=record.principal,
        role=record.role, run=record.run, kind="browser", label="console sign-in",
        created_at=now, expires_at=expires_at, created_by=record.principal_id,
        parent=parent, parent_hash=parent_hash))
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(COOKIE, token, max_age=max(1, int(expires_at - now)), httponly=True,
                        samesite="strict", secure=console.settings.console_url.startswith(
                            "https://"), path="/")
    return response


def same_origin_path(target: str) -> str | None:
    """`target` if it is a path on this console, else None: ASCII without spaces, and not
    `//host`, `/\\host`, a scheme or a control character, before or after percent-decoding
    (a browser reads `/\\evil.example/` and `/%09/evil.example/` as `//evil.example/`)."""
    if not target.isascii() or " " in target:
        return None
    for text in (target, unquote(target)):
        if (not text.startswith("/") or text.startswith("//") or "\\" in text
                or any(ord(c) < 32 or ord(c) == 127 for c in text)):
            return None
        parts = urlsplit(text)
        if parts.scheme or parts.netloc:
            return None
    return target


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, code: str = "", next: str = "/") -> Response:
    console = console_of(request)
    if code:
        # Only a login code is consumed: an API token pasted here stays valid.
        found = console.access.find_token(hash_secret(code))
        record = (console.access.consume_token(hash_secret(code), console.clock())
                  if found is not None and found.kind == "login" else None)
        if record is None:
            return render(request, "console/login.html", status=401, next="/",
                          message="this login URL was already used or has expired: run "
                          "`mldiag up` again, or sign in with a token")
        return _sign_in(console, record)
    return render(request, "console/login.html", next=same_origin_path(next) or "/",
                  message="")


@router.post("/login", response_class=HTMLResponse)
def login_form(request: Request, token: str = Form(...), next: str = Form("/")) -> Response:
    console = console_of(request)
    record = console.access.find_token(hash_secret(token.strip()))
    if record is None or record.kind != "api" or not record.valid(console.clock()):
        return render(request, "console/login.html", status=401,
                      next=same_origin_path(next) or "/",
                      message="invalid, expired or revoked token")
    response = _sign_in(console, record)
    response.headers["location"] = same_origin_path(next) or "/"
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    console = console_of(request)
    principal = resolve(request)
    await check_csrf(request)
    cookie = request.cookies.get(COOKIE)
    if cookie and principal.via == "cookie":
        record = console.access.find_token(hash_secret(cookie))
        if record is not None:
            console.access.revoke_token(record.id, console.clock())
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response
