"""Benchmark: the console's runs and sessions pages at 10,000 sessions (issue 35, item 7).

    python bench/console_lists.py [--sessions 10000] [--runs 20] [--repeat 15] [--json OUT]

Fills a local home's SQLite state store with `--sessions` sessions: one run ("big") holds
90% of them, the other `--runs - 1` share the rest; every third is REPORTED with an
analysis.json in the bucket (the pages read the top finding of the rows they show), the others
FAILED or CAPTURING, with mixed verdicts and triggers, one a minute. Then times each page's
request through the console app in-process (Starlette's TestClient: the server's own time,
routing, store queries, bucket reads and template rendering, without a network), the median
and the worst of `--repeat` requests after one warm-up: the runs list, the big run's page
(newest first, a filtered and a searched list, and the 20th page by cursor), every run's
sessions, and the JSON API.

Target: each page's median under 300 ms. Prints a table, then as the last line:
worst_median_ms=<..>.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _workdir import workdir  # bench/_workdir.py, beside this file

VERDICTS = ("OPTIMAL", "NEEDS_ATTENTION", "INSUFFICIENT_DATA")
TARGET_MS = 300.0


def fill(home: Path, sessions: int, runs: int) -> tuple[Any, Any]:
    """The runtime's state and storage with `sessions` sessions in `runs` runs."""
    from mldiag.bootstrap import bootstrap
    from mldiag.model import CAPTURING, FAILED, REPORTED, HostRecord, SessionRecord
    from mldiag.settings import Settings

    settings = Settings(home=home, prebuild_viewer=False)
    rt = bootstrap(settings)
    names = ["big", *(f"run-{i:02d}" for i in range(1, runs))]
    t0 = 1_780_000_000.0
    for i, name in enumerate(names):
        rt.state.ensure_run(name, discovered=False, now=t0 + i)
    db = rt.state.connection()
    rows = []
    for i in range(sessions):
        run = "big" if i % 10 else names[1 + (i // 10) % (runs - 1)] if runs > 1 else "big"
        state = (REPORTED, FAILED, CAPTURING)[i % 3]
        name = f"{'alert' if i % 7 == 0 else 'ondemand'}-{i:05d}"
        host = HostRecord(object_name=f"{run}/plugins/profile/{name}/h0.xplane.pb",
                          generation="1", size=1_000_000, arrived_at=t0 + 60 * i)
        s = SessionRecord(run=run, session=name, state=state, created_at=t0 + 60 * i,
                          updated_at=t0 + 60 * i + 20, trigger="alert" if i % 7 == 0
                          else "manual", verdict=VERDICTS[i % 9 // 3] if state == REPORTED
                          else None, hosts={"h0": host}, reported_version=1,
                          timings={CAPTURING: t0 + 60 * i, state: t0 + 60 * i + 20},
                          reason="no host arrived" if state == FAILED else "")
        rows.append(s)
        if state == REPORTED:
            rt.storage.write_bytes(f"{run}/plugins/profile/{name}/analysis/analysis.json",
                                   json.dumps({"status": s.verdict, "summary": "ok",
                                               "findings": [{"priority": "P1",
                                                             "title": "Host-bound"}]}).encode())
    # One transaction, as the store's own `_save` writes each row.
    db.execute("BEGIN IMMEDIATE")
    for s in rows:
        rt.state._save(db, s)  # noqa: SLF001 - bulk load of the bench's own store
    db.execute("COMMIT")
    return settings, rt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--workdir")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from fastapi.testclient import TestClient

    from mldiag.access import create_token
    from mldiag.bootstrap import ControlPlane
    from mldiag.console.app import create_app
    from mldiag.console.context import build_console

    home = workdir(args.workdir, "mldiag-bench-lists-") / "home"
    started = time.perf_counter()
    settings, rt = fill(home, args.sessions, args.runs)
    fill_s = time.perf_counter() - started
    plane = ControlPlane(settings=settings, state=rt.state, storage=rt.storage,
                         bus=rt.services.bus)
    console = build_console(settings, plane=plane)
    token = create_token(console.access, principal="token:bench", role="viewer",
                         now=time.time())[0]
    headers = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(console), base_url="http://127.0.0.1:8790") as client:
        # The 20th page of the big run, by following the pages' cursors.
        path = "/runs/big"
        for _ in range(19):
            page = client.get(path, headers=headers).text
            path = re.search(r'<a href="([^"]+)" rel="next">', page).group(1)  # type: ignore[union-attr]
            path = path.replace("&amp;", "&")
        cases = {
            "runs page /": "/",
            "run page, newest 50 of 9,000": "/runs/big",
            "run page, REPORTED + NEEDS_ATTENTION": "/runs/big?state=REPORTED"
                                                    "&verdict=NEEDS_ATTENTION",
            "run page, search 'alert', trigger alert": "/runs/big?q=alert&trigger=alert",
            "run page, created in one day": "/runs/big?from=2026-05-29&to=2026-05-29",
            "run page, 20th page by cursor": path,
            "all sessions /sessions": "/sessions",
            "API /api/v1/runs/big/sessions": "/api/v1/runs/big/sessions",
            "API /api/v1/runs": "/api/v1/runs",
        }
        results = []
        for label, url in cases.items():
            r = client.get(url, headers=headers)
            assert r.status_code == 200, (url, r.status_code, r.text[:300])
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                r = client.get(url, headers=headers)
                times.append((time.perf_counter() - t) * 1e3)
            rows = len(re.findall(r"<tr data-session=|<tr data-run=", r.text)) if \
                url.startswith(("/runs", "/sessions", "/?", "/")) and not url.startswith(
                    "/api") else len(r.json())
            results.append({"page": label, "url": url, "rows": rows,
                            "median_ms": round(statistics.median(times), 1),
                            "max_ms": round(max(times), 1)})
    print(f"{args.sessions} sessions in {args.runs} runs (filled in {fill_s:.1f} s); "
          f"{args.repeat} requests each, after one warm-up")
    print(f"{'page':44} {'rows':>5} {'median ms':>10} {'max ms':>8}")
    for r in results:
        print(f"{r['page']:44} {r['rows']:>5} {r['median_ms']:>10} {r['max_ms']:>8}")
    worst = max(r["median_ms"] for r in results)
    if args.json:
        args.json.write_text(json.dumps({"sessions": args.sessions, "runs": args.runs,
                                         "results": results}, indent=1))
    print(f"worst_median_ms={worst} target_ms={TARGET_MS:g} "
          f"{'met' if worst <= TARGET_MS else 'NOT met'}")
    return 0 if worst <= TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
