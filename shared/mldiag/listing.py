"""List queries of the state store: filters, sort, a cursor and a page size, for the console's
runs and sessions lists (`StateStore.query_sessions`, `StateStore.query_runs`).

The same query gives the same rows on SQLite and on Firestore, so its parts are the ones
Firestore can serve from an index: equality filters, one date range on `created_at`, an
order on one field (ties broken by the record's key) and a word-prefix search over names
(`search_terms`, stored with each record). Pages are cursor-based: a cursor names the last
row shown, so a page costs `limit` rows however deep it is.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any

from mldiag.errors import MldiagError
from mldiag.model import STATES

# Sort orders: name -> (stored field, descending). The first is the default.
SESSION_SORTS: dict[str, tuple[str, bool]] = {
    "newest": ("created_at", True), "oldest": ("created_at", False), "name": ("session", False),
}
RUN_SORTS: dict[str, tuple[str, bool]] = {
    "newest": ("created_at", True), "oldest": ("created_at", False), "name": ("name", False),
}
VERDICTS = ("OPTIMAL", "NEEDS_ATTENTION", "INSUFFICIENT_DATA")
TRIGGERS = ("manual", "alert")
MAX_LIMIT = 200
# Search terms are prefixes of at most this many characters; a longer search is cut to it.
TERM_CHARS = 32
_WORD = re.compile(r"[^0-9a-z]+")


class BadQuery(MldiagError, ValueError):
    """A list query that no store may run (an unknown sort or filter value, a bad cursor).

    Permanent: the same query fails again; the caller fixes it."""


def search_terms(name: str) -> list[str]:
    """What a search matches in `name`: every prefix (lower case, up to TERM_CHARS characters)
    of the whole name and of each of its words (runs of letters and digits). Stored with the
    record, so that a search is an equality lookup (Firestore's `array-contains`)."""
    low = name.lower()
    terms = {low[:i] for i in range(1, min(len(low), TERM_CHARS) + 1)}
    for word in _WORD.split(low):
        terms.update(word[:i] for i in range(1, min(len(word), TERM_CHARS) + 1))
    return sorted(terms)


def search_key(text: str) -> str:
    """The term a search text looks up: lower case, trimmed, cut to TERM_CHARS."""
    return text.strip().lower()[:TERM_CHARS]


@dataclass(frozen=True)
class Page[T]:
    """One page of a list: its rows, and the cursor of the next page ("" on the last)."""

    items: list[T]
    next_cursor: str = ""


def encode_cursor(value: Any, key: list[str]) -> str:
    """An opaque cursor after the row whose sort value is `value` and whose key is `key`."""
    raw = json.dumps([value, key], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, sort_field: str, key_len: int) -> tuple[Any, list[str]]:
    """(sort value, key) of a cursor made for a sort on `sort_field`; BadQuery otherwise."""
    try:
        value, key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, TypeError) as e:
        raise BadQuery("this page link is not valid any more: start from the first page") from e
    expected = (int, float) if sort_field == "created_at" else (str,)
    if (not isinstance(value, expected) or isinstance(value, bool) or not isinstance(key, list)
            or len(key) != key_len or not all(isinstance(k, str) for k in key)):
        raise BadQuery("this page link is not valid any more: start from the first page")
    return value, key


@dataclass(frozen=True)
class SessionQuery:
    """Which sessions, in what order, from where: every filter is optional.

    `search` matches a word prefix of the session's name (`search_terms`); `since` and
    `until` bound `created_at` (since <= t < until); `verdict` "" means no filter. Sorting by
    name cannot be combined with a date range (Firestore orders a range's field first)."""

    run: str | None = None
    state: str = ""
    verdict: str = ""
    trigger: str = ""
    search: str = ""
    since: float | None = None
    until: float | None = None
    sort: str = "newest"
    cursor: str = ""
    limit: int = 50

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise BadQuery(problem)

    @property
    def filters(self) -> dict[str, str]:
        """The equality filters given: stored field -> value."""
        return {k: v for k, v in (("run", self.run), ("state", self.state),
                                  ("verdict", self.verdict), ("trigger", self.trigger)) if v}

    def problem(self) -> str:
        """Why no store may run this query ("" when it is fine)."""
        if self.sort not in SESSION_SORTS:
            return f"unknown sort {self.sort!r}: one of {', '.join(SESSION_SORTS)}"
        if self.state and self.state not in STATES:
            return f"unknown state {self.state!r}: one of {', '.join(STATES)}"
        if self.verdict and self.verdict not in VERDICTS:
            return f"unknown verdict {self.verdict!r}: one of {', '.join(VERDICTS)}"
        if self.trigger and self.trigger not in TRIGGERS:
            return f"unknown trigger {self.trigger!r}: one of {', '.join(TRIGGERS)}"
        if not 1 <= self.limit <= MAX_LIMIT:
            return f"limit must be in 1..{MAX_LIMIT}"
        if (self.since is not None or self.until is not None) and self.sort == "name":
            return "a date range lists sessions by date: sort by newest or oldest"
        return ""

    @property
    def order(self) -> tuple[str, bool]:
        """(stored field, descending) of the sort."""
        return SESSION_SORTS[self.sort]

    @property
    def term(self) -> str:
        return search_key(self.search)


@dataclass(frozen=True)
class RunQuery:
    """Which runs, in what order, from where: `search` matches a word prefix of the run's
    name, like SessionQuery's."""

    search: str = ""
    sort: str = "newest"
    cursor: str = ""
    limit: int = 50

    def __post_init__(self) -> None:
        if self.sort not in RUN_SORTS:
            raise BadQuery(f"unknown sort {self.sort!r}: one of {', '.join(RUN_SORTS)}")
        if not 1 <= self.limit <= MAX_LIMIT:
            raise BadQuery(f"limit must be in 1..{MAX_LIMIT}")

    @property
    def order(self) -> tuple[str, bool]:
        return RUN_SORTS[self.sort]

    @property
    def term(self) -> str:
        return search_key(self.search)
