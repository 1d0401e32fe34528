"""Who may see what: roles, tokens, role bindings and share links.

The console asks one question of every request: may this principal do this on this run (and
session)? The answer comes from the principal's grants alone, so it is decided on the server
and denies by default. Secrets (API tokens, login codes, share links) are random, shown once,
and stored only as their SHA-256 hash.

Roles, each including the one before except `analysis_viewer`:
- `analysis_viewer`: lists runs and sessions, and reads the analysis reports; no traces, raw
  profiles or profiler targets (ML Diagnostics' separate analysis permission);
- `viewer`: everything read-only: runs, targets, sessions, reports, XProf and raw xplanes;
- `editor`: viewer, plus captures, continuous profiling and restricted share links;
- `admin`: editor, plus tokens, role bindings, `--anyone` links and revoking any link.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import secrets
import threading
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

BROWSE, REPORT, PROFILE, CAPTURE, SHARE, ADMIN = (
    "browse", "report", "profile", "capture", "share", "admin")
ROLES: dict[str, frozenset[str]] = {
    "analysis_viewer": frozenset({BROWSE, REPORT}),
    "viewer": frozenset({BROWSE, REPORT, PROFILE}),
    "editor": frozenset({BROWSE, REPORT, PROFILE, CAPTURE, SHARE}),
    "admin": frozenset({BROWSE, REPORT, PROFILE, CAPTURE, SHARE, ADMIN}),
}
ALL_RUNS = "*"
SHARE_DEFAULT_S = 7 * 86400.0
SHARE_MAX_S = 30 * 86400.0
ANONYMOUS = "anonymous"
# The principal of a token that is its own: `token:<its id>`.
TOKEN_PRINCIPAL = "token:"
# The access log of a link: one row per (principal, client network, hour) with its count, and
# at most this many rows a link (the oldest dropped), however often it is used.
ACCESS_BUCKET_S = 3600.0
ACCESS_ROWS_PER_LINK = 1000
# How often one console writes the count of one row while a link is in use (its first use
# is written at once).
ACCESS_WRITE_EVERY_S = 10.0


def hash_secret(secret: str) -> str:
    """The stored form of a token, login code or share link."""
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret(prefix: str, nbytes: int = 24) -> str:
    """A random secret, `<prefix>_<urlsafe base64>` (`nbytes` of entropy)."""
    return f"{prefix}_{secrets.token_urlsafe(nbytes)}"


def new_id() -> str:
    """A short public id for listing and revoking (not a secret)."""
    return secrets.token_hex(6)


def check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    return role


@dataclass
class Grant:
    """A role of a principal (an email, or `token:<id>`) on one run or on every run (`*`)."""

    principal: str
    role: str
    run: str = ALL_RUNS
    created_at: float = 0.0
    created_by: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TokenRecord:
    """A bearer secret, stored hashed. `kind`: `api` (made by `mldiag tokens create`),
    `browser` (the console's sign-in cookie) or `login` (a one-time login code).

    `principal` is a named principal the token signs in as (an email, with its role
    bindings, or `local-admin`), or `token:...` for a token that is its own principal: then
    its principal id is `token:<id>`, and `label` only names it for people. A browser
    sign-in made from an API token names that token in `parent` and `parent_hash`, acts as
    it, and is valid only while it is."""

    id: str
    token_hash: str
    principal: str
    role: str
    run: str = ALL_RUNS
    kind: str = "api"
    label: str = ""
    created_at: float = 0.0
    expires_at: float = 0.0  # 0: never
    revoked_at: float = 0.0
    created_by: str = ""
    parent: str = ""
    parent_hash: str = ""

    def valid(self, now: float) -> bool:
        return not self.revoked_at and (not self.expires_at or now < self.expires_at)

    @property
    def principal_id(self) -> str:
        """Who this token signs in as: share-link ownership and the access log use it."""
        if not self.principal.startswith(TOKEN_PRINCIPAL):
            return self.principal
        return TOKEN_PRINCIPAL + (self.parent or self.id)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ShareLink:
    """A link to one session, stored hashed. Restricted links need a signed-in opener, who
    gets viewer on that session alone; `anyone` links need no sign-in.

    It opens the session it was made for, not another of the same names made after a delete:
    `session_created_at` is that session's `created_at` (None on links made before this was
    recorded: they open a session created before the link)."""

    id: str
    token_hash: str
    run: str
    session: str
    anyone: bool = False
    created_by: str = ""
    created_at: float = 0.0
    expires_at: float = 0.0
    revoked_at: float = 0.0
    session_created_at: float | None = None

    def valid(self, now: float) -> bool:
        return not self.revoked_at and now < self.expires_at

    def opens(self, session_created_at: float) -> bool:
        """Whether the session of this link's names, created at `session_created_at`, is the
        one it was made for."""
        if self.session_created_at is None:
            return session_created_at <= self.created_at
        return session_created_at == self.session_created_at

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AccessEntry:
    """Uses of a share link by one principal (or "anonymous") from one client network
    (`client_network`) within one hour: `count` uses from `first_at` to `at`, the last of
    `path`. Rows stored before aggregation are one use each."""

    link_id: str
    principal: str
    at: float
    path: str = ""
    count: int = 1
    first_at: float = 0.0
    client: str = ""

    def __post_init__(self) -> None:
        self.first_at = self.first_at or self.at

    @property
    def key(self) -> str:
        """The row these uses are counted in: (link, principal, client, hour)."""
        hour = int((self.first_at or self.at) // ACCESS_BUCKET_S)
        return hashlib.sha256(json.dumps(
            [self.link_id, self.principal, self.client, hour]).encode()).hexdigest()

    def merged(self, later: AccessEntry) -> AccessEntry:
        """This row with `later`'s uses added."""
        return replace(self, at=max(self.at, later.at), path=later.path if later.at >= self.at
                       else self.path, count=self.count + later.count,
                       first_at=min(self.first_at or self.at, later.first_at or later.at))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def client_network(host: str | None) -> str:
    """The network a client address is counted in: its /24 (IPv4) or /48 (IPv6), so the
    log tells callers apart without keeping their addresses; '' when unknown."""
    try:
        ip = ipaddress.ip_address(host or "")
    except ValueError:
        return ""
    prefix = 24 if ip.version == 4 else 48
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))


class AccessLog:
    """One console's writer of share-link uses: a row's first use is written at once, its
    later uses added at most every `every_s` per row (and on `flush`), so a link opened 600
    times a second costs a write per row every `every_s`, not one per request."""

    def __init__(self, store: AccessStore, every_s: float = ACCESS_WRITE_EVERY_S) -> None:
        self.store, self.every_s = store, every_s
        self._lock = threading.Lock()
        # Uses not written yet, and when each row was last written, by row key.
        self._pending: dict[str, AccessEntry] = {}
        self._written: dict[str, float] = {}

    def record(self, entry: AccessEntry) -> None:
        """Count one use (or several); write what is due."""
        now = entry.at
        with self._lock:
            key = entry.key
            pending = self._pending.pop(key, None)
            self._pending[key] = pending.merged(entry) if pending is not None else entry
            due = [k for k in self._pending
                   if now - self._written.get(k, -self.every_s) >= self.every_s]
            writes = [self._pending.pop(k) for k in due]
            for k in due:
                self._written[k] = now
            # A row's hour is over: its next use is another row.
            for k in [k for k, at in self._written.items()
                      if now - at > ACCESS_BUCKET_S + self.every_s and k not in self._pending]:
                self._written.pop(k)
        for write in writes:
            self.store.log_access(write)

    def flush(self) -> None:
        """Write every use not written yet (before the log is read)."""
        with self._lock:
            writes, self._pending = list(self._pending.values()), {}
        for write in writes:
            self.store.log_access(write)


@dataclass(frozen=True)
class Principal:
    """The caller of one request and what it was granted: `(role, run, session)` triples,
    where run `*` is every run and session "" every session of that run."""

    # The principal's id (an email, `local-admin`, `token:<id>`): what owns share links and
    # what the access log records.
    name: str
    grants: tuple[tuple[str, str, str], ...] = field(default_factory=tuple)
    # How the caller authenticated: bearer, cookie, iap, id_token or share.
    via: str = ""
    # The share link the request came through, if any (for the access log).
    link_id: str = ""
    # What people call it (a token's label); shown, never compared.
    label: str = ""

    @property
    def anonymous(self) -> bool:
        return self.name == ANONYMOUS

    @property
    def display(self) -> str:
        return f"{self.label} ({self.name})" if self.label else self.name

    def can(self, permission: str, run: str | None = None, session: str | None = None) -> bool:
        """Whether any grant gives `permission` on `run` (any run when None) and `session`
        (any session of the run when None)."""
        for role, grant_run, grant_session in self.grants:
            if permission not in ROLES.get(role, ()):
                continue
            if run is not None and grant_run not in (ALL_RUNS, run):
                continue
            if session is not None and grant_session and grant_session != session:
                continue
            if run is None and session is None and grant_session:
                continue  # a one-session grant does not open the project-wide lists
            return True
        return False

    def visible_runs(self, runs: list[str]) -> list[str]:
        """The runs this principal may list."""
        return [r for r in runs if self.can(BROWSE, r)]

    def with_grants(self, grants: list[tuple[str, str, str]]) -> Principal:
        return replace(self, grants=self.grants + tuple(grants))


class AccessStore(Protocol):
    """Tokens, role bindings, share links and their access log (SQLite or Firestore).

    Records are looked up by the hash of their secret, never by the secret."""

    def put_token(self, record: TokenRecord) -> None: ...

    def find_token(self, token_hash: str) -> TokenRecord | None: ...

    def list_tokens(self) -> list[TokenRecord]:
        """Every token, newest first, revoked and expired ones included."""
        ...

    def revoke_token(self, token_id: str, now: float) -> bool:
        """Revoke one token by id; False when no unrevoked token has that id."""
        ...

    def consume_token(self, token_hash: str, now: float) -> TokenRecord | None:
        """Atomically revoke a valid token and return it (one-time login codes); None when
        it is unknown, expired or already used, so exactly one of several racing uses wins."""
        ...

    def grant(self, grant: Grant) -> None:
        """Add (or keep) a binding; one per (principal, role, run)."""
        ...

    def revoke_grant(self, principal: str, role: str, run: str = ALL_RUNS) -> bool: ...

    def list_grants(self, principal: str | None = None) -> list[Grant]: ...

    def put_link(self, link: ShareLink) -> None: ...

    def find_link(self, token_hash: str) -> ShareLink | None: ...

    def list_links(self, run: str | None = None, session: str | None = None
                   ) -> list[ShareLink]:
        """Links, newest first, revoked and expired ones included."""
        ...

    def revoke_link(self, link_id: str, now: float) -> bool: ...

    def log_access(self, entry: AccessEntry) -> None:
        """Add `entry`'s uses to its row (`entry.key`: its link, principal, client and hour),
        made when absent; a link keeps at most its newest ACCESS_ROWS_PER_LINK rows (or
        the store's `max_access_rows`)."""
        ...

    def list_access(self, link_id: str | None = None, limit: int = 1000) -> list[AccessEntry]:
        """The newest `limit` rows of uses (of one link, or all), by last use, newest first."""
        ...


def create_link(store: AccessStore, run: str, session: str, *, session_created_at: float,
                created_by: str, now: float, anyone: bool = False,
                expires_s: float = SHARE_DEFAULT_S) -> tuple[str, ShareLink]:
    """A new share link to one session, the one created at `session_created_at`: (its
    secret, shown once; the stored record).

    Expiry is at most SHARE_MAX_S (30 days). Who may create which kind is the caller's check
    (`anyone` links are for admins)."""
    if not 0 < expires_s <= SHARE_MAX_S:
        raise ValueError(f"share links expire within 30 days, not {expires_s / 86400:g} days")
    secret = secrets.token_urlsafe(16)  # 128 bits
    link = ShareLink(id=new_id(), token_hash=hash_secret(secret), run=run, session=session,
                     anyone=anyone, created_by=created_by, created_at=now,
                     expires_at=now + expires_s, session_created_at=session_created_at)
    store.put_link(link)
    return secret, link


def share_path(secret: str, run: str, session: str) -> str:
    """The console path a share link opens (quote the parts for a URL)."""
    from urllib.parse import quote

    return f"/share/{secret}/runs/{quote(run, safe='')}/sessions/{quote(session, safe='')}"


def create_token(store: AccessStore, *, role: str, now: float, principal: str = "",
                 run: str = ALL_RUNS, expires_s: float = 0.0, label: str = "",
                 created_by: str = "") -> tuple[str, TokenRecord]:
    """A new API token: (its secret, shown once; the stored record).

    It is its own principal, `token:<id>`, unless `principal` names one (an email); a
    `token:...` principal (once one name per label or role) is taken as its own too."""
    check_role(role)
    secret = new_secret("mldiag")
    token_id = new_id()
    if not principal or principal.startswith(TOKEN_PRINCIPAL):
        principal = TOKEN_PRINCIPAL + token_id
    record = TokenRecord(id=token_id, token_hash=hash_secret(secret), principal=principal,
                         role=role, run=run or ALL_RUNS, kind="api", label=label,
                         created_at=now, expires_at=now + expires_s if expires_s else 0.0,
                         created_by=created_by)
    store.put_token(record)
    return secret, record
