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

from mldiag.errors import MldiagError

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
    r"(?:/machineLearningRuns/(?P<run>[^/]+))?(?:/(?:profilerSessions|profilerTargets|"
    r"monitoredEvents)/"
    r"(?P<leaf>[^/]+))?$")


def resource(text: str) -> dict[str, str]:
    """The parts of a full resource name (`projects/P/locations/L/machineLearningRuns/R/
    profilerSessions/S`): project, location, run, leaf; {} for a plain id."""
    match = _RESOURCE.match(text or "")
    return {k: v for k, v in match.groupdict().items() if v} if match else {}


def normalise(args: argparse.Namespace) -> argparse.Namespace:
    """Full resource names in `--machine-learning-run`, NAME or SESSION become plain ids
    (their project and location fill `--project`/`--location` when those are unset)."""
    for attr in ("run", "name", "session", "event"):
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


class UnsupportedFormat(MldiagError, argparse.ArgumentTypeError):
    """A `--format` mldiag cannot honour (exit 2 with the reason, never an empty output).
    Permanent: the same format is refused again."""


@dataclass(frozen=True)
class Transform:
    """One `.name(args)` of a projection key, e.g. `.basename()` or `.segment(-2)`."""

    name: str
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Column:
    """One key of a projection: a dotted path, its transforms, and its heading."""

    path: str
    transforms: tuple[Transform, ...] = ()
    label: str = ""

    @property
    def heading(self) -> str:
        return self.label or self.path.rsplit(".", 1)[-1].upper()

    def value(self, record: Mapping[str, Any]) -> Any:
        value = field(record, self.path)
        for t in self.transforms:
            value = TRANSFORMS[t.name](value, *t.args)
        return value


@dataclass(frozen=True)
class Format:
    """A parsed `--format`: json, csv, value or table, with its attributes and projection."""

    name: str
    heading: bool = True
    columns: tuple[Column, ...] = ()

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(c.path for c in self.columns)


def _basename(value: Any) -> Any:
    return value.rstrip("/").rsplit("/", 1)[-1] if isinstance(value, str) else value


def _segment(value: Any, index: str = "-1") -> Any:
    if not isinstance(value, str):
        return value
    parts = value.split("/")
    try:
        return parts[int(index)]
    except IndexError:
        return ""


def _scope(value: Any, *names: str) -> Any:
    """gcloud's scope(): the part after the last `/NAME/` (or the basename, with none)."""
    if not isinstance(value, str):
        return value
    for name in names or ("",):
        marker = f"/{name}/" if name else "/"
        if marker in value:
            return value.rsplit(marker, 1)[-1]
    return value


def _join(value: Any, sep: str = ",") -> Any:
    return sep.join(_cell(v) for v in value) if isinstance(value, list | tuple) else value


def _len(value: Any) -> Any:
    return 0 if value is None else len(value) if hasattr(value, "__len__") else value


def _split(value: Any, sep: str = "/") -> Any:
    return value.split(sep) if isinstance(value, str) else value


def _sort(value: Any) -> Any:
    return sorted(value, key=str) if isinstance(value, list | tuple) else value


def _yesno(value: Any, yes: str = "yes", no: str = "no") -> Any:
    return yes if value else no


# The transforms of `gcloud topic projections` that this surface's resources use; any other
# is refused by name (UnsupportedFormat) rather than printed empty.
TRANSFORMS: dict[str, Callable[..., Any]] = {
    "basename": _basename, "join": _join, "len": _len, "list": _join, "scope": _scope,
    "segment": _segment, "sort": _sort, "split": _split, "yesno": _yesno,
}
_NAME = re.compile(r"^\s*(?P<name>[a-z]+)\s*")
_KEY = re.compile(r"^[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)*$")
_CALL = re.compile(r"\.(?P<name>[A-Za-z_]\w*)\((?P<args>[^()]*)\)")
FORMATS = ("json", "csv", "value", "table")


def _split_top(text: str) -> list[str]:
    """`text` split on commas outside parentheses and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _column(text: str, whole: str) -> Column:
    key, _, attrs = text.partition(":")
    label = ""
    for attr in _split_top(attrs.replace(":", ",")):
        name, _, value = attr.partition("=")
        if name.strip() != "label":
            raise UnsupportedFormat(f"--format {whole!r}: the key attribute {name.strip()!r} "
                                    "is not supported (only label=)")
        label = value.strip().strip("'\"")
    key = key.strip()
    transforms: list[Transform] = []
    first = _CALL.search(key)
    path = key[:first.start()] if first else key
    rest = key[first.start():] if first else ""
    while rest:
        call = _CALL.match(rest)
        if not call:
            raise UnsupportedFormat(f"--format {whole!r}: cannot read {rest!r} after "
                                    f"{path!r} (expected .transform(ARGS))")
        name = call["name"]
        if name not in TRANSFORMS:
            raise UnsupportedFormat(
                f"--format {whole!r}: the transform {name}() is not supported (supported: "
                f"{', '.join(n + '()' for n in sorted(TRANSFORMS))})")
        args = tuple(a.strip().strip("'\"") for a in _split_top(call["args"]))
        transforms.append(Transform(name, args))
        rest = rest[call.end():]
    if not _KEY.match(path):
        raise UnsupportedFormat(f"--format {whole!r}: {key!r} is not a key (a dotted path "
                                "such as hosts.w0.status, optionally with transforms such as "
                                ".basename())")
    return Column(path, tuple(transforms), label)


def output_format(text: str) -> Format:
    """An argparse type for `--format`: `json`, `csv[no-heading](name.basename(),state)`,
    `value(name)`, `table(name:label=TARGET,state)`."""
    match = _NAME.match(text)
    name = match["name"] if match else ""
    if name not in FORMATS:
        raise UnsupportedFormat(
            f"unsupported --format {text!r}: use json, csv[no-heading](FIELD,...), "
            "value(FIELD,...) or table(FIELD,...)")
    rest = text[match.end():].strip() if match else ""
    attrs_text = ""
    if rest.startswith("["):
        close = rest.find("]")
        if close < 0:
            raise UnsupportedFormat(f"--format {text!r}: unclosed [")
        attrs_text, rest = rest[1:close], rest[close + 1:].strip()
    projection = ""
    if rest:
        if not (rest.startswith("(") and rest.endswith(")")):
            raise UnsupportedFormat(f"--format {text!r}: expected (KEY,...) after the "
                                    "format name")
        projection = rest[1:-1]
        if rest.count("(") != rest.count(")"):
            raise UnsupportedFormat(f"--format {text!r}: unbalanced parentheses")
    attrs = {a.strip() for a in attrs_text.split(",") if a.strip()}
    unknown = attrs - {"no-heading"}
    if unknown:
        raise UnsupportedFormat(f"--format {text!r}: unknown attribute(s) "
                                f"{', '.join(sorted(unknown))} (known: no-heading)")
    columns = tuple(_column(k, text) for k in _split_top(projection))
    if name in ("csv", "value") and not columns:
        raise UnsupportedFormat(f"--format {name} needs the fields to show, "
                                f"e.g. {name}(name,state)")
    return Format(name, heading=name != "value" and "no-heading" not in attrs,
                  columns=columns)


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


# What a terminal acts on instead of printing: ESC sequences whole (CSI, and OSC, DCS, SOS,
# PM and APC strings up to their terminator), their one-byte C1 forms, and every other C0 or
# C1 control but tab and newline.
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` without what a terminal would act on: remote text (a profiler's gRPC status, an
    alert's summary, a workload's names) is untrusted, and must not move the cursor, retitle
    the window, plant a hyperlink or clear the screen of whoever reads the CLI's output."""
    return _ESCAPES.sub("", text)


class PrintableStream:
    """A text stream that writes what `printable` leaves of each write (the CLI's stdout and
    stderr, so every line it prints is covered); all else is the wrapped stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(printable(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


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
        if fmt.columns:
            rows = [{c.path: c.value(r) for c in fmt.columns} for r in rows]
        print(json.dumps(rows if many else rows[0], indent=2, sort_keys=True, default=str))
        return
    columns = fmt.columns or (tuple(Column(k) for k in rows[0]) if rows else ())
    table = [[_cell(c.value(r)) for c in columns] for r in rows]
    if fmt.name == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        if fmt.heading:
            writer.writerow([c.label or c.path for c in columns])
        writer.writerows(table)
    elif fmt.name == "value":
        for row in table:
            print("\t".join(row))
    else:
        heads = [c.heading for c in columns]
        widths = [max([len(h), *(len(row[i]) for row in table)]) for i, h in enumerate(heads)]
        if fmt.heading:
            print("  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip())
        for row in table:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
