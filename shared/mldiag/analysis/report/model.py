"""The report's view model: reading values out of tool output, formatting them as text, and
the few kinds of cell and block the templates draw (`report/macros.html`).

A leaf module: the summary, tool, provenance and diff views all build on it, and it imports
none of them. Nothing here writes markup: a cell says what it is (text, "n/a", code, a status
chip...) and the template decides how that looks, escaped by autoescape.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from markupsafe import Markup, escape

_BACKTICK = re.compile(r"`([^`\n]+)`")


def prose(value: object) -> Markup:
    """A finding's text as HTML: escaped, with its `code` spans as <code> (the report's and
    the console's `prose` filter)."""
    # Escape first, then wrap: backticks survive escaping, so the <code> we add can only
    # hold already-escaped text.
    text = "" if value is None else str(value)
    return Markup(_BACKTICK.sub(r"<code>\1</code>", str(escape(text))))


def after_headline(summary: str, headline: str) -> str:
    """`summary` without the "what changed" `headline` it starts with (an alert-triggered
    session's summary leads with it), for a page that shows the headline in its own section:
    the sentence is said once. `summary` unchanged when it does not start with it."""
    if headline and summary.startswith(headline):
        return summary[len(headline):].lstrip()
    return summary


def readable(value: Any, depth: int = 1) -> str:
    """A tool's answer or arguments as words for the report's one line (never a Python or
    JSON dump): scalars as they read, a dict as its first items (nested ones in parentheses),
    a list as its length and, near the top, its first item."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, int | str):
        text = str(value)
        return text if len(text) <= 60 else text[:59] + "…"
    if isinstance(value, Mapping):
        if not value:
            return "none"
        if depth >= 3:
            return f"{len(value)} field(s)"
        items = list(value.items())
        shown = ", ".join(f"{k} {readable(v, depth + 1)}" for k, v in items[:4])
        shown += ", …" if len(items) > 4 else ""
        return shown if depth <= 1 else f"({shown})"
    if isinstance(value, list | tuple):
        if not value:
            return "none"
        first = f", the first {readable(value[0], depth + 1)}" if depth <= 1 else ""
        return f"{len(value)} item(s){first}"
    return type(value).__name__


def breakable(value: object, after: str = "_.") -> Markup:
    """Escaped text with a line-break opportunity (<wbr>) after each of `after`'s characters."""
    text = str(escape("" if value is None else str(value)))
    return Markup(re.sub(f"([{re.escape(after)}])", r"\1<wbr>", text))


# ---------------------------------------------------------------- reading tool output


def as_map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def as_str(value: object) -> str:
    return value if isinstance(value, str) else ""


def text(value: object) -> str:
    """What `str()` shows, with None as nothing."""
    return "" if value is None else str(value)


def measured(value: object) -> float | None:
    """A non-negative finite number, or None when absent or XProf's -1 "unknown"."""
    if isinstance(value, bool):
        return None
    number: float | None = None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        stripped = value.strip().rstrip("%").replace(",", "")
        try:
            number = float(stripped)
        except ValueError:
            return None
    if number is None or not math.isfinite(number) or number < 0:
        return None
    return number


def tool(snapshot: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    return as_map(as_map(snapshot.get("tools")).get(name))


def data(entry: Mapping[str, Any]) -> Mapping[str, Any] | None:
    if entry.get("status") != "DATA":
        return None
    value = entry.get("data")
    return value if isinstance(value, Mapping) else None


def tool_reason(entry: Mapping[str, Any]) -> str:
    """Why a tool has no data, in its own words (``data.reason``, or older ``message``)."""
    details = as_map(entry.get("data"))
    for key in ("reason", "message", "info"):
        said = as_str(details.get(key)).strip()
        if said:
            return said
    return ""


def as_json(value: object) -> str:
    """Verbatim text of a tool value, so evidence stays traceable to tool output."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


# ---------------------------------------------------------------- cells


@dataclass(frozen=True)
class NA:
    """An unknown value: shown as "n/a" (with why, on hover), never as 0."""

    note: str = ""
    kind: ClassVar[str] = "na"


@dataclass(frozen=True)
class Span:
    content: Cell
    css: str = ""
    title: str | None = None
    kind: ClassVar[str] = "span"


@dataclass(frozen=True)
class Prose:
    """Text whose `code` spans show as code."""

    text: str
    kind: ClassVar[str] = "prose"


@dataclass(frozen=True)
class Wbr:
    """Text that may break after `after`'s characters (tool, field and shape names)."""

    text: str
    after: str = "_."
    kind: ClassVar[str] = "wbr"


@dataclass(frozen=True)
class Code:
    text: str
    kind: ClassVar[str] = "code"


@dataclass(frozen=True)
class Strong:
    content: Cell
    css: str = ""
    kind: ClassVar[str] = "strong"


@dataclass(frozen=True)
class Chip:
    """A status (DATA, NO_DATA, ERROR or another word) as a coloured chip."""

    status: str
    kind: ClassVar[str] = "chip"

    @property
    def css(self) -> str:
        return self.status if self.status in ("DATA", "NO_DATA", "ERROR") else "other"


@dataclass(frozen=True)
class Prio:
    """A finding's priority (P0, P1, P2), as the console shows it too."""

    priority: str
    kind: ClassVar[str] = "prio"


@dataclass(frozen=True)
class Fold:
    """A long value folded behind its first line."""

    summary: str
    full: str
    css: str
    kind: ClassVar[str] = "fold"


@dataclass(frozen=True)
class Br:
    kind: ClassVar[str] = "br"


@dataclass(frozen=True)
class Parts:
    """Cells shown one after the other."""

    items: tuple[Cell, ...]
    kind: ClassVar[str] = "parts"


@dataclass(frozen=True)
class Link:
    """A link to a file beside the page (diff.html next to summary.html)."""

    href: str
    label: str
    kind: ClassVar[str] = "link"


@dataclass(frozen=True)
class Nested:
    """Blocks inside a table cell."""

    blocks: Sequence[Block]
    kind: ClassVar[str] = "nested"


Cell = (str | NA | Span | Prose | Wbr | Code | Strong | Chip | Prio | Fold | Br | Parts | Link
        | Nested)


def parts(*items: Cell) -> Parts:
    return Parts(tuple(items))


def chip(status: object) -> Chip:
    return Chip(as_str(status) or "?")


def mono(value: object) -> Span:
    return Span(text(value), "mono")


def evidence_value(value: object) -> Cell:
    """Long values (HLO neighbourhoods) fold away so the evidence table stays readable."""
    full = as_json(value)
    if len(full) <= 120:
        return full
    return Fold(full.splitlines()[0][:80] + "…", full, "evlong")


# ---------------------------------------------------------------- blocks


@dataclass(frozen=True)
class Row:
    cells: Sequence[Cell]
    css: str = ""


@dataclass(frozen=True)
class Table:
    """Header tuples are (label, css class of the column's cells)."""

    headers: Sequence[tuple[str, str]]
    rows: Sequence[Row]
    collapse_after: int = 0
    kind: ClassVar[str] = "table"

    @property
    def shown(self) -> Sequence[Row]:
        return self.rows[:self.collapse_after] if self.folds else self.rows

    @property
    def rest(self) -> Sequence[Row]:
        return self.rows[self.collapse_after:] if self.folds else ()

    @property
    def folds(self) -> bool:
        return bool(self.collapse_after) and len(self.rows) > self.collapse_after


def table(headers: Sequence[tuple[str, str]], rows: Iterable[Sequence[Cell]], *,
          collapse_after: int = 0, row_classes: Sequence[str] = ()) -> Table:
    built = []
    for index, cells in enumerate(rows):
        built.append(Row(tuple(cells), row_classes[index] if index < len(row_classes) else ""))
    return Table(tuple(headers), tuple(built), collapse_after)


@dataclass(frozen=True)
class Para:
    """A paragraph; `css` "why" for an explanation, "err" for an error, "legend"."""

    content: Cell
    css: str = ""
    kind: ClassVar[str] = "para"


def why(content: Cell) -> Para:
    return Para(content, "why")


@dataclass(frozen=True)
class Box:
    """A <div> of one cell: "summary" for a headline, "notjudged" for a caveat."""

    content: Cell
    css: str
    kind: ClassVar[str] = "box"


@dataclass(frozen=True)
class Heading:
    content: Cell
    level: int = 4
    css: str = ""
    kind: ClassVar[str] = "heading"


@dataclass(frozen=True)
class KV:
    """A definition list of (label, value) pairs."""

    pairs: Sequence[tuple[str, Cell]]
    kind: ClassVar[str] = "kv"


@dataclass(frozen=True)
class Facts:
    pairs: Sequence[tuple[str, str]]
    kind: ClassVar[str] = "facts"


@dataclass(frozen=True)
class Folded:
    """Blocks behind a summary line."""

    summary: Cell
    blocks: Sequence[Block]
    kind: ClassVar[str] = "folded"


@dataclass(frozen=True)
class Callout:
    """The yellow box of what was not judged or had to be cut: a heading and a list."""

    title: Cell
    items: Sequence[Cell]
    heading: bool = True
    kind: ClassVar[str] = "callout"


@dataclass(frozen=True)
class Chart:
    """An SVG chart: `name` picks its macro in `report/charts.html`, `geometry` its data."""

    name: str
    geometry: Any
    kind: ClassVar[str] = "chart"


@dataclass(frozen=True)
class ChartRow:
    """A chart (or why there is none) beside a definition list."""

    chart: Block
    side: Block
    kind: ClassVar[str] = "chartrow"


@dataclass(frozen=True)
class ToolBlock:
    """One tool's box in the detailed analysis."""

    anchor: str
    title: str
    blocks: Sequence[Block]
    kind: ClassVar[str] = "tool"


Block = Box | Table | Para | Heading | KV | Facts | Folded | Callout | Chart | ChartRow \
    | ToolBlock


@dataclass(frozen=True)
class Section:
    anchor: str
    title: str
    blocks: Sequence[Block] = field(default_factory=tuple)


# ---------------------------------------------------------------- values as text


def na(note: str = "") -> NA:
    return NA(note)


NOT_MEASURED = NA("not measured")


def group(number: float, decimals: int) -> str:
    return f"{number:,.{decimals}f}"


def ms_text(number: float) -> str:
    return f"{group(number, 1 if number >= 100 else 2)} ms"


def fmt_ms(value: object) -> str | NA:
    number = measured(value)
    return NOT_MEASURED if number is None else ms_text(number)


def fmt_pct(value: object) -> str | NA:
    number = measured(value)
    if number is None:
        return NOT_MEASURED
    # Two decimals below 10% so small shares and the summary's own figures still match.
    return f"{number:.2f}%" if number < 10 else f"{number:.1f}%"


def fmt_gib(value: object) -> str | NA:
    number = measured(value)
    return NOT_MEASURED if number is None else f"{number:,.2f} GiB"


def fmt_mem_gib(value: object) -> str | NA:
    """A size given in GiB; below 0.1 GiB it is shown in MiB so it never reads "0.00 GiB"."""
    number = measured(value)
    if number is None:
        return NOT_MEASURED
    if 0 < number < 0.1:
        mib = number * 1024
        return f"{mib:.1f} MiB" if mib >= 0.1 else f"{mib:.3g} MiB"
    return f"{number:,.2f} GiB"


def fmt_mib(value: object) -> str | NA:
    number = measured(value)
    if number is None:
        return NOT_MEASURED
    if number >= 1024:
        return f"{group(number, 1)} MiB ({number / 1024:.2f} GiB)"
    return f"{number:,.3g} MiB" if number < 1 else f"{group(number, 1)} MiB"


def si_text(number: float, unit: str = "") -> str:
    for factor, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if number >= factor:
            return f"{number / factor:.2f} {suffix}{unit}"
    return f"{number:.4g} {unit}".rstrip()


def fmt_si(value: object, unit: str = "") -> str | NA:
    number = measured(value)
    return NOT_MEASURED if number is None else si_text(number, unit)


def plain_text(number: float, decimals: int = 2) -> str:
    if number != 0 and number < 10 ** (-decimals):
        return f"{number:.2g}"
    return group(number, decimals)


def fmt_plain(value: object, decimals: int = 2) -> str | NA:
    number = measured(value)
    return NOT_MEASURED if number is None else plain_text(number, decimals)


def with_unit(value: object, unit: str, decimals: int = 2) -> str | NA:
    number = measured(value)
    return NOT_MEASURED if number is None else f"{plain_text(number, decimals)} {unit}"
