"""`mldiag sessions list|describe` (gcloud: `profiler-session list|describe`): profile
sessions, their states, hosts and reports."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from mldiag.bootstrap import open_state
from mldiag.cli import _control, _gcloud
from mldiag.cli._home import add_home
from mldiag.cli.dead_letters import subject
from mldiag.errors import MldiagError
from mldiag.model import REPORTED, STATES, SessionRecord
from mldiag.ports import StateStore, Storage


def register(sub: Any) -> None:
    p = sub.add_parser("sessions", help="list and describe profile sessions (also: "
                       "profiler-session list|describe)")
    add_home(p)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    add_list_arguments(verbs.add_parser("list", help="list sessions"), run_required=False)
    add_describe_arguments(verbs.add_parser(
        "describe", help="states, hosts, timings, verdict and report path"))


def add_list_arguments(ls: argparse.ArgumentParser, *, run_required: bool) -> None:
    """The flags of `sessions list` and `profiler-session list`."""
    add_home(ls, repeated=True)
    _gcloud.add_run(ls, required=run_required)
    ls.add_argument("--state", choices=STATES, help="only sessions in this state")
    _gcloud.add_format(ls)
    _gcloud.add_scope(ls)


def add_describe_arguments(d: argparse.ArgumentParser) -> None:
    """The flags of `sessions describe` and `profiler-session describe`."""
    add_home(d, repeated=True)
    d.add_argument("session", help="SESSION, RUN/SESSION or its full resource name")
    _gcloud.add_run(d, required=False)
    _gcloud.add_format(d)
    _gcloud.add_scope(d)


def record(s: SessionRecord) -> dict[str, Any]:
    """A session as --format shows it: its fields, `name` being the session's."""
    return {"name": s.session, **s.to_dict()}


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def run(args: argparse.Namespace) -> int:
    state = open_state(_control.settings_of(args))
    if args.verb == "list":
        sessions = state.list_sessions(run=args.run, state=args.state)
        if args.format:
            _gcloud.emit([record(s) for s in sessions], args.format)
            return 0
        if not sessions:
            print(empty_hint(state, args.run, args.state))
            return 0
        print(f"{'RUN/SESSION':<48} {'VER':>3} {'STATE':<14} {'HOSTS':>5} {'VERDICT':<16} UPDATED")
        for s in sessions:
            print(f"{s.key:<48} {s.version:>3} {s.state:<14} {len(s.hosts):>5} "
                  f"{s.verdict or '-':<16} {_stamp(s.updated_at)}")
        return 0
    run_name, _, session = args.session.rpartition("/")
    run_name = run_name or args.run
    candidates = [s for s in state.list_sessions(run=run_name) if s.session == session]
    if not candidates:
        raise MldiagError(f"unknown session {args.session!r}")
    if len(candidates) > 1:
        raise MldiagError(f"session {session!r} exists in several runs "
                          f"({', '.join(s.run for s in candidates)}): pass RUN/SESSION")
    s = candidates[0]
    if args.format:
        _gcloud.emit(record(s), args.format)
        return 0
    print(f"session:  {s.key}  (version {s.version}, kind {s.kind}, trigger {s.trigger})")
    if s.note:
        print(f"why:      {s.note}")
    print(f"state:    {s.state}" + (f"  reason: {s.reason}" if s.reason else ""))
    print(f"verdict:  {s.verdict or '-'}")
    print(f"report:   {s.report_path or '-'}")
    expected = f" of {len(s.expected_hosts)} expected" if s.expected_hosts else (
        f" of {s.expected_count} processes of the job" if s.expected_count else "")
    print(f"hosts:    {len(s.hosts)}{expected}")
    if s.expected_count and s.missing_processes():
        print(f"  not joined yet: process {', '.join(map(str, s.missing_processes()))}")
    for host, h in sorted(s.hosts.items()):
        extra = f"  {h.reason}" if h.reason else ""
        print(f"  {host:<32} {h.status:<8} {h.size:>12} B  {_stamp(h.arrived_at)}{extra}")
    for x in s.superseded:
        print(f"superseded: version {x['version']} ({x['state']}) by version {x['by']} at "
              f"{_stamp(x['at'])}, when {x['host']} arrived")
    print("timings:")
    start = s.created_at
    for st, t in sorted(s.timings.items(), key=lambda kv: kv[1]):
        print(f"  {st:<14} {_stamp(t)}  (+{t - start:.2f} s)")
    if s.state == REPORTED:
        from mldiag.bootstrap import control_plane

        print_findings(control_plane(_control.settings_of(args)).storage, s, describe=True)
    return 0


def empty_hint(state: StateStore, run: str | None, only: str | None) -> str:
    """What an empty `sessions list` says: how sessions come about, and, for a run, the
    objects under it that the pipeline refused (a profile dropped in the wrong place)."""
    where = f" of run {run}" if run else ""
    if only:
        return f"no sessions{where} in state {only} (drop --state to see the others)"
    lines = [f"no sessions{where} yet. A session comes from:",
             f"  mldiag add LOGDIR --run {run or 'RUN'}     a logdir's xplanes (with `mldiag "
             "up` running)",
             f"  mldiag capture NAME --run {run or 'RUN'}   a capture of the run's live targets",
             "  xprof() in a workload that called machinelearning_run(...)"]
    refused = [d for d in state.list_dead_letters()
               if run and subject(str(d.get("payload") or ""))[0] == run]
    if refused:
        lines.append(f"{len(refused)} object(s) under {run}/ were refused; the latest: "
                     f"{refused[-1].get('reason')}")
        lines.append(f"  (all: mldiag dead-letters list --run {run})")
    return "\n".join(lines)


def print_findings(storage: Storage, s: SessionRecord, *, describe: bool = False) -> None:
    """A reported session's summary and findings (priority, category, title: one line each)
    from its analysis.json: after `capture`, the verdict and summary first; in `sessions
    describe`, whose verdict line is above, the summary and a count."""
    arrived = [h.object_name for h in s.hosts.values() if h.status == "ARRIVED"]
    if not arrived:
        return
    name = f"{arrived[0].rsplit('/', 1)[0]}/analysis/analysis.json"
    try:
        analysis = json.loads(storage.read_bytes(name))
    except (OSError, ValueError) as e:
        print(f"  (could not read {name}: {e})")
        return
    findings = analysis.get("findings") or []
    if describe:
        print(f"summary:  {analysis.get('summary', '')}")
        print(f"findings: {len(findings) or 'none'}")
    else:
        print(f"{analysis.get('status')}: {analysis.get('summary', '')}")
    for f in findings:
        print(f"  {f.get('priority')} {f.get('category', ''):<16} {f.get('title')}")
