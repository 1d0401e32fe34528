"""`mldiag analyze PATH [--out DIR] [--json] [--latest]`: analyse profiles offline.

A logdir with several sessions has each analysed into its own folder (`--out/RUN/SESSION`, or
each session's own `analysis/`), one line each; one bad session fails alone, and the exit
status is 2 only after every session was tried."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mldiag.analysis import TOOLS, analyze, find_sessions
from mldiag.errors import MldiagError, ProfileUnreadable


def register(sub: Any) -> None:
    p = sub.add_parser(
        "analyze",
        help="analyse an XProf profile (logdir, session dir or .xplane.pb)",
        description=f"Run the {len(TOOLS)} collection tools, triage, investigate, "
        "and write health_snapshot.json, investigation.json, analysis.json and summary.html.",
    )
    p.add_argument("path", help="a logdir, run or session directory, or one .xplane.pb file")
    p.add_argument("--out", help="output directory (default: <session>/analysis)")
    p.add_argument("--json", action="store_true", help="print analysis.json to stdout")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.add_argument("--latest", action="store_true",
                   help="with several sessions under PATH, analyse only the newest")
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
    progress = None if args.quiet or args.json else _progress
    if not args.quiet:
        print(f"mldiag: analysing {args.path}", file=sys.stderr, flush=True)
    sessions = find_sessions(args.path)
    budget = None
    if args.memory_budget:
        from mldiag.analysis import parse_bytes

        try:
            budget = parse_bytes(args.memory_budget)
        except ValueError as e:
            raise MldiagError(f"--memory-budget: {e}") from e
    if args.latest and len(sessions) > 1:
        sessions = sessions[-1:]
    if len(sessions) == 1:
        analysis, html = _one(args.path if not args.latest else sessions[0].path, args.out,
                              progress, budget)
        if args.json:
            print(json.dumps(analysis, indent=2))
        else:
            _print(analysis, html)
        return 0
    # Several sessions: each into its own folder, one line each; one bad session fails alone.
    print(f"mldiag: {len(sessions)} sessions under {args.path}", file=sys.stderr, flush=True)
    failed = 0
    documents = []
    for s in sessions:
        out = str(Path(args.out) / s.run / s.name) if args.out else None
        try:
            analysis, html = _one(s.path, out, progress, budget)
        except (ProfileUnreadable, MldiagError) as e:
            failed += 1
            print(f"FAILED  {s.run}/{s.name}: {e}", flush=True)
            documents.append({"session": {"run": s.run, "session": s.name},
                              "status": "FAILED", "reason": str(e)})
            continue
        documents.append(analysis)
        if not args.json:
            top = analysis["findings"][0] if analysis["findings"] else None
            head = f"  top: {top['priority']} {top['title']}" if top else "  no findings"
            print(f"{analysis['status']}  {s.run}/{s.name}{head}  summary: {html}", flush=True)
    if args.json:
        print(json.dumps(documents, indent=2))
    print(f"mldiag: {len(sessions) - failed} of {len(sessions)} sessions analysed"
          + (f", {failed} failed" if failed else ""), file=sys.stderr)
    return 2 if failed else 0


def _one(path: Any, out: str | None, progress: Any, budget: int | None
         ) -> tuple[dict[str, Any], Any]:
    try:
        result = analyze(path, out, progress=progress, memory_budget_bytes=budget)
    except OSError as e:
        where = e.filename or out or "the session directory"
        raise MldiagError(f"cannot write the report to {where}: {e.strerror or e} "
                          "(use --out DIR)") from e
    return result.analysis, result.summary_html


def _print(analysis: dict[str, Any], html: Any) -> None:
    session = analysis["session"]
    hosts = len(session.get("hosts") or [])
    unreadable = sorted(session.get("unreadable_hosts") or {})
    print(f"{analysis['status']}  {session.get('run')}/{session.get('session')}  "
          f"({session.get('device_type') or 'unknown device'}, {hosts} host(s)"
          + (f"; left out, unreadable: {', '.join(unreadable)}" if unreadable else "") + ")")
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
    print(f"summary: {html}")
