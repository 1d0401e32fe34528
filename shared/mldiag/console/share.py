"""Share links: `/share/{token}/runs/{run}/sessions/{session}/...` opens one session.

A link is valid while it is neither expired nor revoked, only for the session its path
names, and only while that is the session it was made for (not one that reuses its names
after `machine-learning-run delete`). Every refusal (forged, expired, revoked, another
session) is the same 404, so a caller cannot tell which it was. A restricted link needs a
signed-in opener, who gets viewer on that session alone; an `anyone` link needs no sign-in.
Every use is counted in the link's access log: one row per principal, client network and
hour (`access.AccessLog`).
"""

from __future__ import annotations

from dataclasses import replace

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.responses import HTMLResponse

from mldiag.access import (
    ANONYMOUS,
    AccessEntry,
    Principal,
    client_network,
    hash_secret,
    share_path,
)
from mldiag.console import pages, views, xprof
from mldiag.console.auth import NotSignedIn, console_of, resolve
from mldiag.model import SessionRecord

router = APIRouter(include_in_schema=False)
PREFIX = "/share/{token}/runs/{run}/sessions/{session}"
REFUSED = "no such link (it may have expired or been revoked)"


async def link_principal(request: Request) -> Principal:
    """The opener, with viewer on the link's session; 404 for any bad link."""
    console = console_of(request)
    p = request.path_params
    link = console.access.find_link(hash_secret(p["token"]))
    if (link is None or not link.valid(console.clock()) or link.run != p["run"]
            or link.session != p["session"]):
        raise HTTPException(404, REFUSED)
    # The session it was made for, not one of the same names made after a delete.
    session = console.plane.state.get_session(link.run, link.session)
    if session is None or not link.opens(session.created_at):
        raise HTTPException(404, REFUSED)
    principal = resolve(request)
    if not link.anyone and principal.anonymous:
        raise NotSignedIn()
    request.state.base = share_path(p["token"], link.run, link.session)
    if not request.url.path.endswith((".js", ".css", ".woff2", ".wasm")):
        console.access_log.record(AccessEntry(
            link_id=link.id, principal=principal.name if not principal.anonymous else ANONYMOUS,
            at=console.clock(), path=request.url.path.split(p["token"], 1)[-1][:500],
            client=client_network(request.client.host if request.client else None)))
    return replace(principal.with_grants([("viewer", link.run, link.session)]),
                   via=principal.via or "share", link_id=link.id)


def _session(request: Request, principal: Principal) -> SessionRecord:
    p = request.path_params
    return pages.get_session(console_of(request), p["run"], p["session"])


@router.get(PREFIX, response_class=HTMLResponse)
def shared_page(request: Request, principal: Principal = Depends(link_principal)) -> Response:
    request.state.principal = principal
    return pages.session_page(request, principal, _session(request, principal),
                              request.state.base, shared=True)


@router.get(PREFIX + "/state")
def shared_state(request: Request,
                 principal: Principal = Depends(link_principal)) -> dict[str, object]:
    return views.session_row(_session(request, principal), principal)


@router.get(PREFIX + "/report", response_class=HTMLResponse)
def shared_report(request: Request, principal: Principal = Depends(link_principal)) -> Response:
    return pages.report(request, _session(request, principal), principal)


@router.get(PREFIX + "/diff.html", response_class=HTMLResponse)
def shared_diff(request: Request, principal: Principal = Depends(link_principal)) -> Response:
    return pages.diff_page(request, _session(request, principal), principal)


@router.get(PREFIX + "/hosts/{host}/xplane.pb")
def shared_download(host: str, request: Request,
                    principal: Principal = Depends(link_principal)) -> Response:
    return pages.download(request, _session(request, principal), host)


xprof.register(PREFIX, link_principal, _session)
