"""The console's lists (runs, a run's sessions, all sessions): their query parameters, read
into `mldiag.listing` queries the state store runs, and the links to their pages.

The same parameters serve the pages and the JSON API: `q` (search), `state`, `verdict`,
`trigger`, `from` and `to` (UTC dates, `YYYY-MM-DD`, both days included), `sort`, `cursor`
and `limit`. The API gives the next page's URL in a `Link: <...>; rel="next"` header.
"""

from __future__ import annotations

import datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import HTTPException, Request, Response

from mldiag.listing import (
    RUN_SORTS,
    SESSION_SORTS,
    TRIGGERS,
    VERDICTS,
    BadQuery,
    RunQuery,
    SessionQuery,
)
from mldiag.model import STATES

PAGE_SIZE = 50
HELP = ("Filters and pages: `q` (a word prefix of the name), `state`, `verdict`, `trigger`, "
        "`from` and `to` (UTC dates, YYYY-MM-DD, both days included; not with sort=name), "
        "`sort` (newest, oldest, name), `limit` (1-200) and `cursor` (the next page's, from "
        "the answer's `Link: <...>; rel=\"next\"` header). Runs take `q`, `sort`, `limit` and "
        "`cursor`.")
# The parameters a page's form sets (and its links keep), besides the cursor.
SESSION_PARAMS = ("q", "state", "verdict", "trigger", "from", "to", "sort", "limit")
RUN_PARAMS = ("q", "sort", "limit")


def _day(text: str, what: str) -> float | None:
    if not text:
        return None
    try:
        day = datetime.date.fromisoformat(text)
    except ValueError as e:
        raise HTTPException(422, f"{what}: a date as YYYY-MM-DD, not {text!r}") from e
    return datetime.datetime.combine(day, datetime.time(), datetime.UTC).timestamp()


def _limit(text: str) -> int:
    try:
        return int(text) if text else PAGE_SIZE
    except ValueError as e:
        raise HTTPException(422, f"limit: a whole number, not {text!r}") from e


def session_query(request: Request, run: str | None = None) -> SessionQuery:
    """The sessions query of the request's parameters (422 with the reason when bad)."""
    p = request.query_params
    since, to = _day(p.get("from", ""), "from"), _day(p.get("to", ""), "to")
    try:
        return SessionQuery(
            run=run or p.get("run") or None, state=p.get("state", ""),
            verdict=p.get("verdict", ""), trigger=p.get("trigger", ""), search=p.get("q", ""),
            since=since, until=None if to is None else to + 86400.0,
            sort=p.get("sort") or "newest", cursor=p.get("cursor", ""),
            limit=_limit(p.get("limit", "")))
    except BadQuery as e:
        raise HTTPException(422, str(e)) from e


def run_query(request: Request) -> RunQuery:
    """The runs query of the request's parameters (422 with the reason when bad)."""
    p = request.query_params
    try:
        return RunQuery(search=p.get("q", ""), sort=p.get("sort") or "newest",
                        cursor=p.get("cursor", ""), limit=_limit(p.get("limit", "")))
    except BadQuery as e:
        raise HTTPException(422, str(e)) from e


def _url(request: Request, names: tuple[str, ...], cursor: str = "") -> str:
    kept = [(k, request.query_params[k]) for k in names if request.query_params.get(k)]
    if cursor:
        kept.append(("cursor", cursor))
    return request.url.path + ("?" + urlencode(kept) if kept else "")


def list_form(request: Request, names: tuple[str, ...], next_cursor: str,
              count: int) -> dict[str, Any]:
    """What a page's list form and pager show: the values given, the choices, and the
    links to the first page (when not on it) and to the next one (when there is one)."""
    p = request.query_params
    return {"values": {k: p.get(k, "") for k in names},
            "filtered": any(p.get(k) for k in names if k not in ("sort", "limit")),
            "states": STATES, "verdicts": VERDICTS, "triggers": TRIGGERS,
            "sorts": list(SESSION_SORTS if "state" in names else RUN_SORTS),
            "first": _url(request, names) if p.get("cursor") else "",
            "next": _url(request, names, next_cursor) if next_cursor else "",
            "count": count, "page_size": _limit(p.get("limit", ""))}


def link_next(request: Request, response: Response, names: tuple[str, ...],
              next_cursor: str) -> None:
    """Point the API's answer at its next page (RFC 8288 `Link`), when there is one."""
    if next_cursor:
        response.headers["Link"] = f'<{_url(request, names, next_cursor)}>; rel="next"'
