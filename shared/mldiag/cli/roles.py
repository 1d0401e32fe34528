"""`mldiag roles grant|list|revoke`: role bindings of people (emails) on runs."""

from __future__ import annotations

import argparse
import time
from typing import Any

from mldiag.access import ALL_RUNS, ROLES, Grant
from mldiag.cli._access import open_store
from mldiag.cli._home import add_home
from mldiag.errors import MldiagError


def register(sub: Any) -> None:
    p = sub.add_parser("roles", help="grant, list and revoke roles of people",
                       description="On Google Cloud the console signs people in with IAP; "
                       "what they may see is their role bindings: viewer, analysis_viewer, "
                       "editor or admin, on one run or on all.")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    g = verbs.add_parser("grant", help="give EMAIL a role")
    r = verbs.add_parser("revoke", help="take a role back")
    for v in (g, r):
        v.add_argument("email")
        v.add_argument("--role", required=True, choices=list(ROLES))
        v.add_argument("--run", default=ALL_RUNS, help="one run (default: every run)")
    lst = verbs.add_parser("list", help="every binding")
    lst.add_argument("--email", default=None)
    for v in (g, r, lst):
        add_home(v)


def run(args: argparse.Namespace) -> int:
    store, _ = open_store(args.home)
    if args.verb == "grant":
        if "@" not in args.email:
            raise MldiagError(f"{args.email!r} is not an email (IAP signs people in by email)")
        store.grant(Grant(principal=args.email, role=args.role, run=args.run,
                          created_at=time.time(), created_by="cli"))
        print(f"{args.email}: {args.role} on {'every run' if args.run == ALL_RUNS else args.run}")
        return 0
    if args.verb == "revoke":
        if not store.revoke_grant(args.email, args.role, args.run):
            raise MldiagError(f"{args.email} has no {args.role} role on {args.run}")
        print(f"{args.email}: {args.role} on {args.run} revoked")
        return 0
    for grant in store.list_grants(args.email):
        print(f"{grant.principal:<40} {grant.role:<16} {grant.run}")
    return 0
