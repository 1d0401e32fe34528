"""`mldiag tokens create|list|revoke`: API tokens for the console (stored hashed)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from mldiag.access import ALL_RUNS, ROLES, create_token
from mldiag.cli._access import open_store, when
from mldiag.cli._home import add_home
from mldiag.durations import parse_duration
from mldiag.errors import MldiagError


def register(sub: Any) -> None:
    p = sub.add_parser("tokens", help="create, list and revoke console API tokens",
                       description="A token signs in to the console and its API "
                       "(`Authorization: Bearer TOKEN`) with one role, on one run or all. "
                       "Only its hash is stored: the token is printed once.")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    c = verbs.add_parser("create", help="print a new token alone on stdout")
    c.add_argument("--role", required=True, choices=list(ROLES))
    c.add_argument("--run", default=ALL_RUNS, help="the one run it may see (default: all)")
    c.add_argument("--expires", default="",
                   help="lifetime as gcloud writes it, e.g. 30d, 12h, P30D (default: never)")
    c.add_argument("--label", default="", help="what it is for, shown by `tokens list`")
    lst = verbs.add_parser("list", help="tokens with their role, run, expiry and state")
    lst.add_argument("--json", action="store_true")
    r = verbs.add_parser("revoke", help="revoke a token by id (at once)")
    r.add_argument("id")
    for v in (c, lst, r):
        add_home(v)


def run(args: argparse.Namespace) -> int:
    store, _ = open_store(args.home)
    now = time.time()
    if args.verb == "create":
        try:
            expires = parse_duration(args.expires) if args.expires else 0.0
        except ValueError as e:
            raise MldiagError(str(e)) from e
        secret, _record = create_token(store, principal=f"token:{args.label or args.role}",
                                       role=args.role, run=args.run, now=now,
                                       expires_s=expires, label=args.label,
                                       created_by="cli")
        print(secret)
        return 0
    if args.verb == "revoke":
        if not store.revoke_token(args.id, now):
            raise MldiagError(f"no active token {args.id!r} (see `mldiag tokens list`)")
        print(f"token {args.id} revoked")
        return 0
    tokens = [t for t in store.list_tokens() if t.kind != "login"]
    if args.json:
        print(json.dumps([{k: v for k, v in t.to_dict().items() if k != "token_hash"}
                          for t in tokens], indent=1))
        return 0
    print(f"{'ID':<13} {'ROLE':<16} {'RUN':<20} {'KIND':<8} {'STATE':<8} {'EXPIRES':<20} LABEL")
    for t in tokens:
        state = "revoked" if t.revoked_at else "expired" if not t.valid(now) else "active"
        print(f"{t.id:<13} {t.role:<16} {t.run:<20} {t.kind:<8} {state:<8} "
              f"{when(t.expires_at) if t.expires_at else 'never':<20} {t.label}")
    return 0
