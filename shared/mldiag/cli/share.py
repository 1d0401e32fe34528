"""`mldiag share create|list|revoke`: links to one session, for people without a role."""

from __future__ import annotations

import argparse
import time
from typing import Any

from mldiag.access import create_link, share_path
from mldiag.cli._access import open_store, when
from mldiag.cli._home import add_home, running_console_url
from mldiag.durations import parse_duration
from mldiag.errors import MldiagError
from mldiag.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("share", help="create, list and revoke share links to a session",
                       description="A share link opens one session (its page, report and "
                       "XProf) for 7 days by default, 30 at most. Restricted links need a "
                       "signed-in opener; --anyone links need none. Revoking takes effect at "
                       "once.")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    c = verbs.add_parser("create", help="print a new link's URL alone on stdout")
    c.add_argument("session", metavar="RUN/SESSION")
    c.add_argument("--expires", default="7d",
                   help="lifetime, at most 30d, as gcloud writes it (7d, P7D, 1w, 36h; default 7d)")
    c.add_argument("--anyone", action="store_true", help="no sign-in needed to open it")
    c.add_argument("--url", default=None, help="the console's address as openers reach it "
                   "(default: MLDIAG_PUBLIC_URL, else the console `mldiag up` serves on the "
                   "home, else http://127.0.0.1:8790)")
    lst = verbs.add_parser("list", help="links with their session, expiry and state")
    lst.add_argument("--run", default=None)
    r = verbs.add_parser("revoke", help="revoke a link by id")
    r.add_argument("id")
    for v in (c, lst, r):
        add_home(v)


def console_url(flag: str | None, settings: Settings) -> str:
    """The console address a printed link starts with: --url, MLDIAG_PUBLIC_URL, the URL the
    running `mldiag up` recorded (its --port may differ from the default), or the default."""
    if flag:
        if not flag.startswith(("http://", "https://")):
            raise MldiagError(f"--url {flag!r}: expected http://HOST[:PORT] or https://...")
        return flag.rstrip("/")
    if settings.public_url or settings.backend != "local":
        return settings.console_url
    return running_console_url(settings.home) or settings.console_url


def run(args: argparse.Namespace) -> int:
    store, settings = open_store(args.home)
    now = time.time()
    if args.verb == "create":
        run_name, sep, session = args.session.partition("/")
        if not sep or not run_name or not session:
            raise MldiagError(f"expected RUN/SESSION, not {args.session!r}")
        from mldiag.bootstrap import control_plane

        record = control_plane(settings).state.get_session(run_name, session)
        if record is None:
            raise MldiagError(f"no session {run_name}/{session}")
        try:
            secret, _link = create_link(store, run_name, session, created_by="cli", now=now,
                                        session_created_at=record.created_at,
                                        anyone=args.anyone,
                                        expires_s=parse_duration(args.expires))
        except ValueError as e:
            raise MldiagError(str(e)) from e
        print(console_url(args.url, settings) + share_path(secret, run_name, session))
        return 0
    if args.verb == "revoke":
        if not store.revoke_link(args.id, now):
            raise MldiagError(f"no active share link {args.id!r} (see `mldiag share list`)")
        print(f"share link {args.id} revoked")
        return 0
    print(f"{'ID':<13} {'SESSION':<40} {'WHO':<10} {'STATE':<8} {'EXPIRES':<17} CREATED BY")
    for link in store.list_links(run=args.run):
        state = ("revoked" if link.revoked_at else "expired" if now >= link.expires_at
                 else "active")
        print(f"{link.id:<13} {link.run + '/' + link.session:<40} "
              f"{'anyone' if link.anyone else 'signed-in':<10} {state:<8} "
              f"{when(link.expires_at):<17} {link.created_by}")
    return 0
