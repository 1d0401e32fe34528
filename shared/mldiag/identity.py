"""Verifying Google-signed JWTs: IAP assertions and Google ID tokens, with cached public keys.

The console checks IAP's `X-Goog-IAP-JWT-Assertion` (ES256, IAP's keys) and the registration
function checks the Google ID token of the workload calling it (RS256, Google's OAuth2 keys).
Both are the same check, as google-auth's `id_token.verify_oauth2_token` does it: the
signature against the issuer's published JWK set, fetched at most once an hour per URL, then
the expiry, the issuer and the audience.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Collection
from typing import Any

from mldiag.errors import MldiagError

GOOGLE_CERTS_URL = "https://www.googleapis.com/oauth2/v3/certs"
GOOGLE_ISSUERS = ("accounts.google.com", "https://accounts.google.com")
JWKS_TTL_S = 3600.0

_jwks: dict[str, tuple[float, Any]] = {}
_jwks_lock = threading.Lock()


class InvalidToken(MldiagError, ValueError):
    """A JWT that is malformed, expired, for another audience or not signed by the issuer.

    Permanent: the same token is refused again.
    """


class KeysUnavailable(MldiagError, RuntimeError):
    """The issuer's public keys could not be fetched: nothing can be verified.

    Transient: the keys are fetched again on the next call.
    """


def jwk_set(url: str) -> Any:
    """The JWK set served at `url` (a `jwt.PyJWKSet`), fetched once an hour, not per call."""
    import jwt

    with _jwks_lock:
        cached = _jwks.get(url)
        if cached is not None and time.monotonic() - cached[0] < JWKS_TTL_S:
            return cached[1]
        try:
            with urllib.request.urlopen(url, timeout=10) as f:  # noqa: S310 - configured URL
                keys = jwt.PyJWKSet.from_dict(json.loads(f.read()))
        except (OSError, ValueError, jwt.PyJWTError) as e:
            raise KeysUnavailable(f"cannot fetch the signing keys at {url}: {e}") from e
        _jwks[url] = (time.monotonic(), keys)
        return keys


def verify_jwt(token: str, *, certs_url: str, audience: str, issuers: Collection[str],
               algorithms: list[str]) -> dict[str, Any]:
    """The claims of `token` once its signature, expiry, issuer and audience hold.

    InvalidToken (with the reason) otherwise; an empty `audience` refuses every token.
    KeysUnavailable when the issuer's keys cannot be fetched.
    """
    import jwt

    if not audience:
        raise InvalidToken("no audience is configured: every token is refused")
    try:
        kid = jwt.get_unverified_header(token).get("kid")
        key = next((k for k in jwk_set(certs_url).keys if k.key_id == kid), None)
        if key is None:
            raise InvalidToken(f"token signed with unknown key {kid!r}")
        claims: dict[str, Any] = jwt.decode(
            token, key.key, algorithms=algorithms, audience=audience,
            options={"require": ["exp", "iat", "aud", "iss"]})
    except jwt.PyJWTError as e:
        raise InvalidToken(str(e)) from e
    if claims.get("iss") not in issuers:
        raise InvalidToken(f"token issued by {claims.get('iss')!r}")
    return claims


def verify_google_id_token(token: str, audience: str,
                           certs_url: str = GOOGLE_CERTS_URL) -> str:
    """The verified email of a Google ID token minted for `audience`.

    This is what a service account gets from the metadata server (or
    `google.oauth2.id_token.fetch_id_token`); InvalidToken when it does not hold, or carries
    no verified email.
    """
    claims = verify_jwt(token, certs_url=certs_url, audience=audience,
                        issuers=GOOGLE_ISSUERS, algorithms=["RS256"])
    email = claims.get("email")
    if not email or claims.get("email_verified") is not True:
        raise InvalidToken("the token carries no verified email")
    return str(email)
