"""What makes `mldiag` accept `gcloud alpha mldiagnostics` command lines: tracer-level enums,
resource names, `--location`/`--project`, and `--format=json|csv[no-heading](...)|value(...)`.

`gcloud alpha mldiagnostics profiler-session capture s1 --machine-learning-run=r
--duration=5000ms --host-tracer-level=host-tracer-level-info --format=json` runs as is with
`gcloud alpha mldiagnostics` replaced by `mldiag`.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The profiler's levels, by the names gcloud gives them (`--host-tracer-level=info`,
# `host-tracer-level-info` or the API's `HOST_TRACER_LEVEL_INFO`); integers still work.
TRACER_LEVELS: dict[str, dict[str, int]] = {
    "host": {"disabled": 0, "critical": 1, "info": 2, "verbose": 3},
    "device": {"disabled": 0, "enabled": 1},
    "python": {"disabled": 0, "enabled": 1},
}
TOP_LEVEL = {"host": 3, "device": 2, "python": 1}


def tracer_level(kind: str) -> Callable[[str], int]:
    """An argparse type for `--<kind>-tracer-level`: an enum name or an integer."""
    names = TRACER_LEVELS[kind]

    def parse(text: str) -> int:
        word = text.strip().lower().replace("_", "-")
        word = word.removeprefix(f"{kind}-tracer-level-")
        if word in names:
            return names[word]
        if word.isdigit() and 0 <= int(word) <= TOP_LEVEL[kind]:
            return int(word)
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a {kind} tracer level: one of {', '.join(names)} (or "
            f"{kind}-tracer-level-{next(iter(names))}, ...), or 0-{TOP_LEVEL[kind]}")

    parse.__name__ = f"{kind} tracer level"
    return parse


def add_tracer_levels(p: argparse.ArgumentParser) -> None:
    """The three tracer-level flags with gcloud's defaults (enabled, info, disabled)."""
    p.add_argument("--host-tracer-level", type=tracer_level("host"), default=2,
                   metavar="LEVEL", help="disabled|critical|info|verbose (default info)")
    p.add_argument("--device-tracer-level", type=tracer_level("device"), default=1,
                   metavar="LEVEL", help="disabled|enabled (default enabled)")
    p.add_argument("--python-tracer-level", type=tracer_level("python"), default=0,
                   metavar="LEVEL", help="disabled|enabled (default disabled)")


def add_scope(p: argparse.ArgumentParser) -> None:
    """`--project` and `--location`: the GCP project and region (MLDIAG_PROJECT /
    MLDIAG_LOCATION); the embedded runtime has one of each and ignores them."""
    p.add_argument("--project", default=None, help="GCP project (default: MLDIAG_PROJECT)")
    p.add_argument("--location", default=None,
                   help="GCP region (default: MLDIAG_LOCATION, us-central1)")


def add_run(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """`--machine-learning-run` (gcloud's name) or `--run`: an id or a full resource name."""
    p.add_argument("--machine-learning-run", "--run", dest="run", required=required,
                   metavar="RUN", help="the run: its name, or projects/P/locations/L/"
                   "machineLearningRuns/RUN")


def add_async(p: argparse.ArgumentParser) -> None:
    p.add_argument("--async", "--no-wait", dest="no_wait", action="store_true",
                   help="return once the request is queued")


_RESOURCE = re.compile(
    r"^projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
    r"(?:/machineLearningRuns/(?P<run>[^/]+))?(?:/(?:profilerSessions|profilerTargets)/"
    r"(?P<leaf>[^/]+))?$")


def resource(text: str) -> dict[str, str]:
    """The parts of a full resource name (`projects/P/locations/L/machineLearningRuns/R/
    profilerSessions/S`): project, location, run, leaf; {} for a plain id."""
    match = _RESOURCE.match(text or "")
    return {k: v for k, v in match.groupdict().items() if v} if match else {}


def normalise(args: argparse.Namespace) -> argparse.Namespace:
    """Full resource names in `--machine-learning-run`, NAME or SESSION become plain ids
    (their project and location fill `--project`/`--location` when those are unset)."""
    for attr in ("run", "name", "session"):
        value = getattr(args, attr, None)
        if not isinstance(value, str):
            continue
        parts = resource(value)
        if not parts:
            continue
        if attr == "run" or "leaf" not in parts:
            setattr(args, attr, parts.get("run", value))
        else:
            setattr(args, attr, parts["leaf"])
            if parts.get("run") and not getattr(args, "run", None):
                args.run = parts["run"]
        for key in ("project", "location"):
            if getattr(args, key, None) is None and key in parts:
                setattr(args, key, parts[key])
    if isinstance(getattr(args, "targets", None), str):
        # gcloud prints targets as profilerTargets/ resource names; users paste them back.
        args.targets = ",".join(resource(t).get("leaf", t) for t in args.targets.split(","))
    return args


# --format


@dataclass(frozen=True)
class Format:
    """A parsed `--format`: json, csv, value or table, with its attributes and projection."""

    name: str
    heading: bool = True
    fields: tuple[str, ...] = ()


_FORMAT = re.compile(r"^\s*(?P<name>[a-z]+)\s*(?:\[(?P<attrs>[^\]]*)\])?\s*"
                     r"(?:\((?P<fields>[^)]*)\))?\s*$")
FORMATS = ("json", "csv", "value", "table")


def output_format(text: str) -> Format:
    """An argparse type for `--format`: `json`, `csv[no-heading](name,state)`,
    `value(name)`, `table(name,state)`."""
    match = _FORMAT.match(text)
    if not match or match["name"] not in FORMATS:
        raise argparse.ArgumentTypeError(
            f"unsupported --format {text!r}: use json, csv[no-heading](FIELD,...), "
            "value(FIELD,...) or table(FIELD,...)")
    attrs = {a.strip() for a in (match["attrs"] or "").split(",") if a.strip()}
    unknown = attrs - {"no-heading"}
    if unknown:
        raise argparse.ArgumentTypeError(f"--format {text!r}: unknown attribute(s) "
                                         f"{', '.join(sorted(unknown))} (known: no-heading)")
    fields = tuple(f.strip() for f in (match["fields"] or "").split(",") if f.strip())
    for f in fields:
        if not re.fullmatch(r"[A-Za-z_][\w]*(\.[\w-]+)*", f):
            raise argparse.ArgumentTypeError(
                f"--format {text!r}: {f!r} is not a field (dotted keys only, e.g. "
                "hosts.w0.status; transforms such as .basename() are not supported)")
    if match["name"] in ("csv", "value") and not fields:
        raise argparse.ArgumentTypeError(f"--format {match['name']} needs the fields to show, "
                                         f"e.g. {match['name']}(name,state)")
    return Format(match["name"], heading=match["name"] != "value" and "no-heading" not in attrs,
                  fields=fields)


def add_format(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", type=output_format, default=None, metavar="FORMAT",
                   help="json, csv[no-heading](FIELD,...), value(FIELD,...) or "
                   "table(FIELD,...)")
    p.add_argument("--json", dest="format", action="store_const", const=Format("json"),
                   help="same as --format=json")


def _snake(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key).lower()


def field(record: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path (`hosts.w0.status`); camelCase keys match snake_case ones
    (`createdAt` is `created_at`). None when absent."""
    value: Any = record
    for key in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(key, value.get(_snake(key)))
    return value


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return ";".join(_cell(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, default=str)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def emit(records: Sequence[Mapping[str, Any]] | Mapping[str, Any], fmt: Format) -> None:
    """Print records (or one record) in `fmt`."""
    many = not isinstance(records, Mapping)
    rows: list[Mapping[str, Any]] = [records] if isinstance(records, Mapping) else list(records)
    if fmt.name == "json":
        if fmt.fields:
            rows = [{f: field(r, f) for f in fmt.fields} for r in rows]
        print(json.dumps(rows if many else rows[0], indent=2, sort_keys=True, default=str))
        return
    fields = (fmt.fields or tuple(rows[0])) if rows else fmt.fields
    table = [[_cell(field(r, f)) for f in fields] for r in rows]
    if fmt.name == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        if fmt.heading:
            writer.writerow(fields)
        writer.writerows(table)
    elif fmt.name == "value":
        for row in table:
            print("\t".join(row))
    else:
        heads = [f.rsplit(".", 1)[-1].upper() for f in fields]
        widths = [max([len(h), *(len(row[i]) for row in table)]) for i, h in enumerate(heads)]
        if fmt.heading:
            print("  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip())
        for row in table:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
