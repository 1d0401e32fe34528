"""`mldiag gc [--cache-days N] [--superseded-days M] [--profile-days K] [--dry-run]`: what the
bucket's lifecycle does on GCP, for the local runtime's bucket (`mldiag.retention`)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from mldiag.adapters.local.storage import LocalDirStorage
from mldiag.cli._home import add_home
from mldiag.retention import Retention, collect_garbage
from mldiag.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser(
        "gc", help="delete expired viewer caches, superseded analyses and old profiles",
        description="Delete from the local bucket what the GCS lifecycle would: viewer caches "
        "(rebuilt when a session is next opened), superseded analysis versions and collect "
        "windows, and raw profiles, each after its retention (0: keep).")
    default = Retention()
    p.add_argument("--cache-days", type=float, default=default.cache_days,
                   help="viewer caches, days after they were built (default: %(default)s)")
    p.add_argument("--superseded-days", type=float, default=default.superseded_days,
                   help="superseded analysis versions and collect windows, days after a newer "
                   "version was reported (default: %(default)s)")
    p.add_argument("--profile-days", type=float, default=default.profile_days,
                   help="raw profiles (*.xplane.pb), days after upload; their reports stay "
                   "(default: %(default)s, keep)")
    p.add_argument("--dry-run", action="store_true", help="say what would go, delete nothing")
    add_home(p)


def run(args: argparse.Namespace) -> int:
    for flag in ("cache_days", "superseded_days", "profile_days"):
        if getattr(args, flag) < 0:
            raise SystemExit(f"--{flag.replace('_', '-')} is a number of days, 0 to keep")
    settings = Settings.from_env(home=args.home)
    storage = LocalDirStorage(settings.bucket_dir)
    retention = Retention(cache_days=args.cache_days, superseded_days=args.superseded_days,
                          profile_days=args.profile_days)
    removed, size = collect_garbage(storage, retention, time.time(), dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {len(removed.caches)} viewer cache objects, {len(removed.superseded)} "
          f"superseded objects, {len(removed.profiles)} profiles: {size / 1024**2:,.1f} MB")
    return 0
