"""Evidence is copied out of tool outputs by field path, never typed in by hand.

A field path is dotted with list selectors: `program.bound_by`, `modules[0].top_buffers[1]`,
`category_summary[category=copy-done].fraction_of_total_time`, `ops[op=dot&program_id=7]`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mldiag.errors import MldiagError

_SEGMENT = re.compile(r"([^.\[\]]+)|\[([^\]]*)\]")


class MissingField(MldiagError, KeyError):
    """The field path does not exist in the tool output.

    Permanent: the output holds what it holds; the citation is left out."""


def lookup(data: Any, path: str) -> Any:
    """Return the value at `path` inside `data`; raise MissingField if absent."""
    cur = data
    for name, selector in _SEGMENT.findall(path):
        if name:
            if not isinstance(cur, Mapping) or name not in cur:
                raise MissingField(path)
            cur = cur[name]
            continue
        if not isinstance(cur, list):
            raise MissingField(path)
        if "=" in selector:
            match = _select(cur, [selector.partition("=")])
            if not match and "&" in selector:
                # Several conditions joined by `&`: `[op=dot&program_id=7]`.
                match = _select(cur, [c.partition("=") for c in selector.split("&")])
            if not match:
                raise MissingField(path)
            cur = match[0]
        else:
            idx = int(selector)
            if not -len(cur) <= idx < len(cur):
                raise MissingField(path)
            cur = cur[idx]
    return cur


def _select(items: list[Any], conditions: list[tuple[str, str, str]]) -> list[Any]:
    return [x for x in items if isinstance(x, Mapping) and all(
        str(x.get(key)) == want for key, _, want in conditions)]


def tool_data(snapshot: Mapping[str, Any], tool: str) -> Any:
    """The `data` of a tool in a snapshot when its status is DATA, else None."""
    result = snapshot.get("tools", {}).get(tool)
    if not isinstance(result, Mapping) or result.get("status") != "DATA":
        return None
    return result.get("data")


def get(snapshot: Mapping[str, Any], tool: str, path: str, default: Any = None) -> Any:
    data = tool_data(snapshot, tool)
    if data is None:
        return default
    try:
        return lookup(data, path)
    except MissingField:
        return default


def cite(snapshot: Mapping[str, Any], tool: str, path: str) -> dict[str, Any]:
    """An evidence item `{tool, field, value}` with the value read from the snapshot."""
    data = tool_data(snapshot, tool)
    if data is None:
        raise MissingField(f"{tool} has no data")
    return {"tool": tool, "field": path, "value": lookup(data, path)}


def cite_value(tool: str, path: str, source: Any) -> dict[str, Any]:
    """Evidence from a follow-up tool output (not part of the snapshot)."""
    return {"tool": tool, "field": path, "value": lookup(source, path)}


def percent(value: Any) -> float | None:
    """Parse xprof's percent strings ("13.4%") and numbers; None when absent or 'N/A'."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip().rstrip("%").strip()
    try:
        return float(text)
    except ValueError:
        return None


def number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        return None
