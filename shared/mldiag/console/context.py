"""What the console app is built on: the control plane, the access store and the viewers."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mldiag.access import AccessLog, AccessStore, TokenRecord, hash_secret, new_id, new_secret
from mldiag.adapters.local.private import private_dir
from mldiag.bootstrap import ControlPlane, control_plane
from mldiag.errors import MldiagError
from mldiag.model import SessionRecord
from mldiag.settings import Settings
from mldiag.viewer import Viewers
from mldiag.viewer_cache import rebuild_message

LOCAL_ADMIN = "local-admin"
LOGIN_CODE_S = 15 * 60.0


@dataclass
class Console:
    """The console's services. `plane` is the same state, bucket and bus as the pipeline."""

    settings: Settings
    plane: ControlPlane
    access: AccessStore
    viewers: Viewers
    secret: bytes
    clock: Callable[[], float] = time.time
    # Google's token verifier, injectable for tests (`console.auth.verify_google`).
    fetch_certs: Callable[[str], bytes] | None = None
    started_at: float = field(default_factory=time.time)
    # Share-link uses, counted and written in batches (`access.AccessLog`).
    access_log: AccessLog = field(init=False)

    def __post_init__(self) -> None:
        self.access_log = AccessLog(self.access)


def open_access(settings: Settings) -> AccessStore:
    """The access store beside the state store: SQLite locally, Firestore on GCP."""
    if settings.backend == "gcp":
        from mldiag.adapters.gcp.access import FirestoreAccessStore

        return FirestoreAccessStore(project=settings.project,
                                    database=settings.firestore_database)
    from mldiag.adapters.local.access import SqliteAccessStore

    return SqliteAccessStore(settings.state_db)


def _secret(settings: Settings) -> bytes:
    if settings.console_secret:
        return settings.console_secret.encode()
    if settings.backend == "gcp":
        raise MldiagError("the console on GCP needs MLDIAG_CONSOLE_SECRET (the CSRF key, the "
                          "same on every instance)")
    path = settings.home / "console.secret"
    if not path.is_file():
        private_dir(path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path.read_text().strip().encode()


def build_console(settings: Settings | None = None, *, plane: ControlPlane | None = None,
                  access: AccessStore | None = None) -> Console:
    """The console on the control plane that settings name (or `plane`, to share the local
    runtime's bus and state)."""
    settings = settings or Settings.from_env()
    if settings.console_auth not in ("token", "iap"):
        raise MldiagError(f"MLDIAG_CONSOLE_AUTH must be token or iap, not "
                          f"{settings.console_auth!r}")
    plane = plane or control_plane(settings)
    cache = settings.viewer_cache
    from mldiag.analysis import default_budget_bytes

    # A conversion over this would take the console down: refused with the reason instead.
    budget = settings.viewer_memory_budget_bytes or default_budget_bytes()
    bus = plane.bus

    def rebuild(session: SessionRecord) -> None:
        bus.publish(rebuild_message(session, time.time()))

    return Console(settings=settings, plane=plane, access=access or open_access(settings),
                   viewers=Viewers(plane.storage, cache, keep=settings.viewer_keep,
                                   memory_budget=budget,
                                   rebuild=rebuild if settings.prebuild_viewer else None),
                   secret=_secret(settings))


def ensure_local_admin(console: Console) -> tuple[str | None, str]:
    """The first local start creates the admin token in `$MLDIAG_HOME/admin.token` (0600),
    and a start that finds it revoked, expired or unknown (`mldiag tokens revoke ID` rotates
    it) replaces it; every start issues a one-time login code. The code, and the browser
    session it signs in, name the admin token as their parent and end with it. Returns (the
    new admin token or None, code)."""
    settings = console.settings
    now = console.clock()
    path = settings.home / "admin.token"
    created = None
    admin = (console.access.find_token(hash_secret(path.read_text().strip()))
             if path.is_file() else None)
    if admin is None or admin.principal != LOCAL_ADMIN or not admin.valid(now):
        token = new_secret("mldiag")
        admin = TokenRecord(
            id=new_id(), token_hash=hash_secret(token), principal=LOCAL_ADMIN, role="admin",
            kind="api", label="created by `mldiag up`", created_at=now,
            created_by=LOCAL_ADMIN)
        console.access.put_token(admin)
        private_dir(path.parent)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        tmp.replace(path)
        created = token
    code = new_secret("login", 18)
    console.access.put_token(TokenRecord(
        id=new_id(), token_hash=hash_secret(code), principal=LOCAL_ADMIN, role="admin",
        kind="login", label="one-time login URL", created_at=now,
        expires_at=now + LOGIN_CODE_S, created_by=LOCAL_ADMIN,
        parent=admin.id, parent_hash=admin.token_hash))
    return created, code


def cache_dir(settings: Settings) -> Path:
    return settings.viewer_cache
