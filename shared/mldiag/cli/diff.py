"""`mldiag diff A B [--json] [--out DIR]`: what changed from A to B, and how much of the
step-time delta each change accounts for.

A and B are each a session of the state store (`RUN/SESSION`: its stored snapshot is read,
nothing is collected again), an analysis folder (`health_snapshot.json` and `analysis.json`,
as `mldiag analyze` writes them), or a profile path (a logdir, session directory or
`.xplane.pb` of one session), which is analysed first."""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mldiag.analysis import ProfileSession, Side, build_diff, find_sessions, kpi
from mldiag.cli._home import add_home
from mldiag.errors import MldiagError
from mldiag.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser(
        "diff", help="what changed between two sessions or profiles",
        description="Compare B with A (the baseline): KPI, op, kernel, HLO, finding and config "
        "deltas, and one ranked explanation of the step-time delta. Writes diff.json and "
        "diff.html.")
    p.add_argument("a", metavar="A", help="the baseline: RUN/SESSION, an analysis folder, or "
                   "a profile path")
    p.add_argument("b", metavar="B", help="the session to explain, in the same forms")
    p.add_argument("--out", help="output directory (default: ./diff-<A>-vs-<B>)")
    p.add_argument("--json", action="store_true", help="print diff.json to stdout")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.add_argument("--xprof", action="store_true",
                   help="also run xprof's diff_sessions on the raw profiles for the kernel "
                   "diff (automatic when both are GPU profile paths)")
    add_home(p)


@dataclass
class _Input:
    side: Side
    profile: ProfileSession | None = None  # the raw profile, when it was at hand
    session: Any = None  # the SessionRecord of a RUN/SESSION side


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(f"mldiag: {text}", file=sys.stderr, flush=True)


def _name(spec: str) -> str:
    text = Path(spec.rstrip("/")).name if Path(spec).exists() else spec.replace("/", "_")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:60] or "side"


def _analysis_folder(path: Path, label: str) -> Side | None:
    if not (path.is_dir() and (path / "health_snapshot.json").is_file()
            and (path / "analysis.json").is_file()):
        return None
    investigation = path / "investigation.json"
    return Side(label=label, snapshot=_load(path / "health_snapshot.json"),
                analysis=_load(path / "analysis.json"),
                investigation=_load(investigation) if investigation.is_file() else None,
                source=f"stored analysis in {path}")


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise MldiagError(f"cannot read {path}: {e}") from e
    if not isinstance(data, dict):
        raise MldiagError(f"{path} is not a JSON object")
    return data


def _profile_path(args: argparse.Namespace, spec: str, out: Path, which: str) -> _Input:
    from mldiag.analysis import analyze

    sessions = find_sessions(spec)
    if len(sessions) > 1:
        raise MldiagError(f"{spec} holds {len(sessions)} sessions: pass one session directory "
                          f"(e.g. {sessions[-1].path})")
    _say(args, f"analysing {spec} ({which})")
    result = analyze(spec, out / which)
    return _Input(Side(label=spec, snapshot=_load(out / which / "health_snapshot.json"),
                       analysis=result.analysis,
                       investigation=_load(out / which / "investigation.json"),
                       source=f"analysed now into {out / which}"), profile=sessions[0])


def _session(args: argparse.Namespace, spec: str) -> _Input:
    from mldiag.bootstrap import control_plane
    from mldiag.regression import NotComparable, stored_side

    run, sep, name = spec.partition("/")
    if not sep or not run or not name or "/" in name:
        raise MldiagError(f"{spec!r} is neither a path that exists nor RUN/SESSION")
    settings = Settings.from_env(home=args.home)
    if settings.backend == "local" and not Path(settings.state_db).is_file():
        raise MldiagError(f"{spec!r} is not a path, and there is no mldiag state in "
                          f"{settings.home} to find it as RUN/SESSION (set --home)")
    plane = control_plane(settings)
    s = plane.state.get_session(run, name)
    if s is None:
        raise MldiagError(f"no session {spec} (and no such path)")
    try:
        side = stored_side(plane.storage, plane.state, s)
    except NotComparable as e:
        raise MldiagError(str(e)) from e
    return _Input(side, session=s)


def _resolve(args: argparse.Namespace, spec: str, out: Path, which: str) -> _Input:
    path = Path(spec)
    if path.exists():
        folder = _analysis_folder(path, spec)
        if folder is not None:
            return _Input(folder)
        return _profile_path(args, spec, out, which)
    return _session(args, spec)


def _xprof_kernels(args: argparse.Namespace, a: _Input, b: _Input) -> dict[str, Any] | None:
    from contextlib import ExitStack

    from mldiag.analysis import xprof_diff

    gpu = all("gpu" in str((i.side.snapshot.get("session") or {}).get("device_type")).lower()
              for i in (a, b))
    if not args.xprof and not (gpu and a.profile and b.profile):
        return None
    with ExitStack() as stack:
        profiles = []
        for i in (a, b):
            if i.profile is not None:
                profiles.append(i.profile)
            elif i.session is not None:
                profiles.append(_download(stack, args, i.session))
            else:
                _say(args, f"--xprof: {i.side.label} is an analysis folder without its raw "
                     "profile; no xprof kernel diff")
                return None
        _say(args, "running xprof's diff_sessions on the raw profiles")
        result, why = xprof_diff(profiles[0], profiles[1])
    if result is None:
        _say(args, why)
    return result


def _download(stack: Any, args: argparse.Namespace, s: Any) -> ProfileSession:
    from mldiag.bootstrap import control_plane
    from mldiag.viewer_cache import arrived_hosts

    plane = control_plane(Settings.from_env(home=args.home))
    names = list(arrived_hosts(s).values())
    local = stack.enter_context(plane.storage.local_files(names))
    return ProfileSession(run=s.run, name=s.session, path=local, xplanes=tuple(
        local / n.rsplit("/", 1)[1] for n in names))


def _writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MldiagError(f"cannot write to {out}: {e.strerror or e} (use --out DIR)") from e


def run(args: argparse.Namespace) -> int:
    out = Path(args.out or f"diff-{_name(args.a)}-vs-{_name(args.b)}")
    if any(Path(x).exists() and _analysis_folder(Path(x), x) is None for x in (args.a, args.b)):
        # A profile path is analysed into DIR/a or DIR/b: fail before that on a bad DIR.
        _writable(out)
    a = _resolve(args, args.a, out, "a")
    b = _resolve(args, args.b, out, "b")
    doc = build_diff(a.side, b.side, xprof_diff=_xprof_kernels(args, a, b))
    from mldiag.regression import diff_artifacts

    data, page = diff_artifacts(doc)
    _writable(out)
    try:
        (out / "diff.json").write_bytes(data)
        (out / "diff.html").write_bytes(page)
    except OSError as e:
        raise MldiagError(f"cannot write the diff to {out}: {e.strerror or e}") from e
    if args.json:
        print(data.decode())
        return 0
    _print(doc, out)
    return 0


def _print(doc: dict[str, Any], out: Path) -> None:
    print(f"diff  {doc['a']['label']} → {doc['b']['label']}")
    print(f"  {doc['headline']}")
    step = kpi(doc, "step time")
    test = step.get("variation") or {}
    verdict = "beyond" if step.get("significant") else "within"
    if test.get("p_value") is not None:
        effect = test.get("effect") or {}
        print(f"  step time {step['a']:.2f} → {step['b']:.2f} ms: {verdict} run-to-run "
              f"variation ({test['test']}, {test['method']}: U={test['u']}, "
              f"p={test['p_value']:.3g}; median shift {effect['median_shift_ms']:+.2f} ms, "
              f"P(B step slower)={effect['probability_b_slower']:.2f})")
    elif step.get("noise_ms") is not None:
        print(f"  step time {step['a']:.2f} → {step['b']:.2f} ms: {verdict} run-to-run "
              f"variation (±{step['noise_ms']:.2f} ms)")
    for item in doc["explanation"]:
        amount = (f"{item['delta_ms']:+9.2f} ms" if item.get("delta_ms") is not None
                  else f"{item.get('delta_points', 0):+8.2f} pts")
        share = (f"{100 * item['share_of_delta']:4.0f}%" if item.get("share_of_delta")
                 is not None else "   -")
        print(f"  {item['rank']:2d}. {amount} {share}  {item['kind']:<16} "
              f"{item['change'].replace('`', '')}")
    for note in doc["comparability"]["notes"]:
        print(f"  not comparable: {note['aspect']}: {note['consequence']}")
    print(f"diff.json: {out / 'diff.json'}")
    print(f"diff.html: {out / 'diff.html'}")
