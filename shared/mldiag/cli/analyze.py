"""`mldiag analyze PATH [--out DIR] [--json]`: analyse one profile offline."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mldiag.analysis.engine import analyze
from mldiag.analysis.profile_input import find_sessions
from mldiag.errors import MldiagError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "analyze",
        help="analyse an XProf profile (logdir, session dir or .xplane.pb)",
        description="Run the 15 collection tools, triage, investigate, and write "
        "health_snapshot.json, investigation.json, analysis.json and summary.html.",
    )
    p.add_argument("path", help="a logdir, run or session directory, or one .xplane.pb file")
    p.add_argument("--out", help="output directory (default: <session>/analysis)")
    p.add_argument("--json", action="store_true", help="print analysis.json to stdout")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.add_argument("--memory-budget", metavar="SIZE",
                   help="memory collection may use, e.g. 6G (default: $MLDIAG_MEMORY_BUDGET, "
                   "else what the cgroup or host allows)")


def _progress(name: str, result: dict[str, Any], done: int, total: int) -> None:
    status = result["status"]
    line = f"  [{done:2d}/{total}] {name:<36} {status:<7} {result['elapsed_ms']:>8.1f} ms"
    if status == "ERROR":
        line += f"  {result.get('error', '')[:80]}"
    print(line, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    progress = None if args.quiet else _progress
    if not args.quiet:
        print(f"mldiag: analysing {args.path}", file=sys.stderr, flush=True)
    sessions = find_sessions(args.path)
    if len(sessions) > 1:
        print(f"mldiag: {len(sessions)} sessions under {args.path}; analysing the newest, "
              f"{sessions[-1].path} (pass a session directory to choose another)",
              file=sys.stderr)
    budget = None
    if args.memory_budget:
        from mldiag.analysis.workers import parse_bytes

        try:
            budget = parse_bytes(args.memory_budget)
        except ValueError as e:
            raise MldiagError(f"--memory-budget: {e}") from e
    try:
        result = analyze(sessions[-1].path if len(sessions) > 1 else args.path, args.out,
                         progress=progress, memory_budget_bytes=budget)
    except OSError as e:
        where = e.filename or args.out or "the session directory"
        raise MldiagError(f"cannot write the report to {where}: {e.strerror or e} "
                          "(use --out DIR)") from e
    analysis = result.analysis
    if args.json:
        print(json.dumps(analysis, indent=2))
        return 0
    session = analysis["session"]
    hosts = len(session.get("hosts") or [])
    print(f"{analysis['status']}  {session.get('run')}/{session.get('session')}  "
          f"({session.get('device_type') or 'unknown device'}, {hosts} host(s))")
    for f in analysis["findings"]:
        print(f"  {f['priority']} {f['category']:<16} {f['title']}")
    if not analysis["findings"]:
        print("  no findings")
    for item in analysis.get("not_judged", []):
        print(f"  not judged: {item}")
    collection = analysis.get("collection") or {}
    if collection:
        print(f"collection: {collection.get('elapsed_ms', 0) / 1000:.1f} s for "
              f"{(collection.get('session_bytes') or 0) / 1024**2:,.1f} MB")
        for kind in ("killed", "skipped", "degraded"):
            for entry in collection.get(kind, []):
                print(f"  {kind}: {entry.get('job') or entry.get('tools')}: {entry['reason']}")
    print(f"summary: {result.summary_html}")
    return 0
