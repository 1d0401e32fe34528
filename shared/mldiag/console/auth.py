"""Who is calling: one dependency every route declares, deny by default.

A request is signed in by exactly one of:
- `Authorization: Bearer TOKEN`: an mldiag token, or (with MLDIAG_CONSOLE_AUTH=iap) a Google
  ID token whose audience is MLDIAG_ID_TOKEN_AUDIENCE;
- the console's cookie (set by the one-time login URL, or by signing in with a token);
- with MLDIAG_CONSOLE_AUTH=iap, IAP's `X-Goog-IAP-JWT-Assertion`, checked against IAP's keys
  and MLDIAG_IAP_AUDIENCE.
An email principal's roles are its bindings in the access store (`mldiag roles grant`); a
token carries its own role. A share link adds viewer on its one session (`console.share`).

Requests signed in by an ambient credential (the cookie, IAP) that change anything must carry
the page's CSRF token (`X-CSRF-Token` header or `csrf_token` form field).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException, Request

from mldiag.access import (
    ALL_RUNS,
    ANONYMOUS,
    TOKEN_PRINCIPAL,
    Principal,
    TokenRecord,
    hash_secret,
)
from mldiag.console.context import Console
from mldiag.errors import MldiagError
from mldiag.identity import InvalidToken, KeysUnavailable, verify_jwt

log = logging.getLogger(__name__)

COOKIE = "mldiag_session"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
IAP_ISSUER = "https://cloud.google.com/iap"


class NotSignedIn(MldiagError, HTTPException):
    """A page or API call that needs a principal, from a visitor who has none (401).

    Permanent for the request: sign in first.
    """

    def __init__(self) -> None:
        super().__init__(401, "sign in to see this (an mldiag token, or the login URL that "
                         "`mldiag up` printed)")


def console_of(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def _signed_in_as(console: Console, record: TokenRecord, now: float) -> TokenRecord | None:
    """The valid token `record` acts for: itself, or for a browser sign-in the API token it
    came from (directly, or through a login code the admin token issued), whatever its
    principal (`local-admin` too), so that revoking or expiring that token ends every browser
    session made from it. One without `parent_hash` predates that link and is refused: sign
    in again."""
    if record.kind != "browser":
        return record
    parent = console.access.find_token(record.parent_hash) if record.parent_hash else None
    if parent is None or parent.id != record.parent or not parent.valid(now):
        return None
    return parent


def _token_principal(console: Console, token: str, via: str) -> Principal | None:
    now = console.clock()
    record = console.access.find_token(hash_secret(token))
    if record is None or record.kind == "login" or not record.valid(now):
        return None
    source = _signed_in_as(console, record, now)
    if source is None:
        return None
    grants = [(record.role, record.run or ALL_RUNS, "")]
    principal_id = record.principal_id
    if "@" in principal_id:
        grants += [(g.role, g.run, "") for g in console.access.list_grants(principal_id)]
    label = source.label if source.principal.startswith(TOKEN_PRINCIPAL) else ""
    return Principal(principal_id, tuple(grants), via=via, label=label)


def _email_principal(console: Console, email: str, via: str) -> Principal:
    grants = tuple((g.role, g.run, "") for g in console.access.list_grants(email))
    return Principal(email, grants, via=via)


def verify_iap(console: Console, assertion: str) -> str | None:
    """The email in a valid IAP JWT (ES256, IAP's issuer, this console's audience)."""
    settings = console.settings
    if not settings.iap_audience:
        log.error("MLDIAG_CONSOLE_AUTH=iap without MLDIAG_IAP_AUDIENCE: every IAP request is "
                  "refused")
        return None
    try:
        claims = verify_jwt(assertion, certs_url=settings.iap_certs_url,
                            audience=settings.iap_audience, issuers=(IAP_ISSUER,),
                            algorithms=["ES256"])
    except (InvalidToken, KeysUnavailable) as e:
        log.info("IAP assertion refused: %s", e)
        return None
    email = claims.get("email")
    return str(email) if email else None


def verify_google_id_token(console: Console, token: str) -> str | None:
    """The verified email of a Google ID token for MLDIAG_ID_TOKEN_AUDIENCE, else None."""
    from google.auth.transport import requests as google_requests
    from google.oauth2 import id_token

    audience = console.settings.id_token_audience
    if not audience:
        return None
    try:
        claims = id_token.verify_oauth2_token(token, google_requests.Request(), audience)
    except Exception as e:  # noqa: BLE001
        log.info("Google ID token refused: %s", e)
        return None
    if not claims.get("email") or not claims.get("email_verified", False):
        return None
    return str(claims["email"])


def resolve(request: Request) -> Principal:
    """The caller of this request; the anonymous principal (no grants) when not signed in."""
    cached: Principal | None = getattr(request.state, "principal", None)
    if cached is not None:
        return cached
    console = console_of(request)
    principal: Principal | None = None
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        token = header[7:].strip()
        principal = _token_principal(console, token, "bearer")
        if principal is None and console.settings.console_auth == "iap" and (
                not token.startswith("mldiag_")):
            email = verify_google_id_token(console, token)
            principal = _email_principal(console, email, "id_token") if email else None
        if principal is None:
            # A bad bearer token is refused outright, never downgraded to another credential.
            raise HTTPException(401, "invalid, expired or revoked token")
    if principal is None and (cookie := request.cookies.get(COOKIE)):
        principal = _token_principal(console, cookie, "cookie")
    if principal is None and console.settings.console_auth == "iap" and (
            assertion := request.headers.get("x-goog-iap-jwt-assertion")):
        email = verify_iap(console, assertion)
        principal = _email_principal(console, email, "iap") if email else None
    principal = principal or Principal(ANONYMOUS)
    request.state.principal = principal
    return principal


def csrf_token(console: Console, request: Request) -> str:
    """The CSRF token of this request's ambient credential ('' when it has none)."""
    principal = resolve(request)
    if principal.via == "cookie":
        basis = "cookie:" + hash_secret(request.cookies.get(COOKIE, ""))
    elif principal.via == "iap":
        basis = "iap:" + principal.name
    else:
        return ""
    return hmac.new(console.secret, basis.encode(), hashlib.sha256).hexdigest()[:40]


async def check_csrf(request: Request) -> None:
    """Refuse an ambient-credential request that changes state without the page's token."""
    if request.method in SAFE_METHODS:
        return
    principal = resolve(request)
    if principal.via not in ("cookie", "iap"):
        return
    expected = csrf_token(console_of(request), request)
    sent = request.headers.get("x-csrf-token", "")
    if not sent and request.headers.get("content-type", "").startswith(
            ("application/x-www-form-urlencoded", "multipart/form-data")):
        form = await request.form()
        sent = str(form.get("csrf_token", ""))
    if not hmac.compare_digest(sent, expected):
        raise HTTPException(403, "missing or wrong CSRF token (reload the page)")


def require(permission: str, *, project: bool = False) -> Callable[..., Any]:
    """A dependency: the caller may `permission` on the route's run (and session), or
    401 (not signed in) / 403 (signed in, not allowed). With `project`, only a grant on every
    run counts (tokens and role bindings). Share-link routes use their own."""

    async def dependency(request: Request) -> Principal:
        principal = resolve(request)
        run = ALL_RUNS if project else request.path_params.get("run")
        session = None if project else request.path_params.get("session")
        if not principal.can(permission, run, session):
            if principal.anonymous:
                raise NotSignedIn()
            raise HTTPException(403, f"{principal.display} may not {permission} "
                                     + (f"run {run!r}" if run else "here"))
        await check_csrf(request)
        return principal

    return dependency
