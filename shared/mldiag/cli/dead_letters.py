"""`mldiag dead-letters list`: the messages and objects the pipeline gave up on, with why.

Locally they are the in-process bus's dead letters, and the objects that `on_profile_object`
refused (an unsafe name, a bad layout); on GCP the `dead_letters` function copies every
`<topic>-dead-letter` message into Firestore, and the functions record the poison messages they
acknowledge, so the same command reads both from the state store.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from mldiag.bootstrap import open_state
from mldiag.cli import _control, _gcloud
from mldiag.cli._home import add_home


def register(sub: Any) -> None:
    p = sub.add_parser("dead-letters", help="list what the pipeline refused or gave up on, "
                       "with the reason")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    ls = verbs.add_parser("list", help="dead letters, oldest first")
    ls.add_argument("--since", type=_control.duration, default=None,
                    help="only the last DURATION (e.g. 1h, 30m)")
    ls.add_argument("--topic", help="only this topic (profile-objects, capture-requests, ...)")
    ls.add_argument("--run", "--machine-learning-run", dest="run",
                    help="only messages naming this run (or objects under it)")
    add_home(ls)
    _gcloud.add_format(ls)
    _gcloud.add_scope(ls)


def subject(payload: str) -> tuple[str, str]:
    """(run, what) a dead letter is about: an object's name, a session, a run, or the start
    of a payload that is not JSON."""
    try:
        data = json.loads(payload)
    except ValueError:
        return "", payload[:80].replace("\n", " ")
    if not isinstance(data, dict):
        return "", payload[:80]
    name = data.get("name")
    if isinstance(name, str) and "bucket" in data:
        return name.split("/", 1)[0], name
    run, session, kind = (str(v) if isinstance(v := data.get(k), str) else ""
                          for k in ("run", "session", "kind"))
    what = "/".join(p for p in (run, session) if p) or str(data.get("alert_id") or "")
    return run, f"{kind} {what}".strip() or payload[:80]


def run(args: argparse.Namespace) -> int:
    state = open_state(_control.settings_of(args))
    since = time.time() - args.since if args.since else 0.0
    rows = []
    for d in state.list_dead_letters(since=since):
        run_name, what = subject(str(d.get("payload") or ""))
        if args.topic and d.get("topic") != args.topic:
            continue
        if args.run and run_name != args.run:
            continue
        rows.append({**d, "run": run_name, "subject": what})
    if args.format:
        _gcloud.emit(rows, args.format)
        return 0
    if not rows:
        print("no dead letters" + (" matching" if args.topic or args.run or args.since else ""))
        return 0
    print(f"{'AT':<19} {'TOPIC':<22} {'TRIES':>5}  SUBJECT / REASON")
    for r in rows:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["at"])) if r.get("at") else "-"
        print(f"{at:<19} {str(r.get('topic')):<22} {r.get('attempts') or 0:>5}  {r['subject']}")
        print(f"{'':<49}{r.get('reason')}")
    return 0
