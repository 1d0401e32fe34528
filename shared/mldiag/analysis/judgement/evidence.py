"""Evidence is copied out of tool outputs by field path, never typed in by hand.

A field path is dotted with list selectors: `program.bound_by`, `modules[0].top_buffers[1]`,
`category_summary[category=copy-done].fraction_of_total_time`, `ops[op=dot&program_id=7]`.

Evidence names who made the number. A row names an xprof tool (`get_hlo_op_profile`) only for
a field that `xprof <tool>` outputs for the same file, at the same path. What mldiag computes
itself is cited under its own pass name, `mldiag.<pass>` (PASSES), and the row says what it was
computed from (`from`). The snapshot files each pass under `passes`; snapshots collected before
passes had names filed them inside an xprof tool's result (the timeline pass as
get_step_trace's `host_bound_analysis`), and both layouts read the same here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# The passes' names and what each is computed from: the collection, which files them, and
# judgement, which cites them, share the leaf `collection.passes` (re-exported here).
from mldiag.analysis.collection.passes import (
    ASYNC_COPIES,
    CUSTOM_CALLS,
    PASS_PREFIX,
    PASSES,
    TIMELINE,
)
from mldiag.analysis.collection.passes import HLO_EXCERPT as HLO_EXCERPT
from mldiag.analysis.collection.passes import KERNEL_TABLE as KERNEL_TABLE
from mldiag.analysis.collection.passes import MEMORY_ALLOCATORS as MEMORY_ALLOCATORS
from mldiag.analysis.collection.registry import DETECTORS
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


# Where a snapshot collected before passes had names filed each pass: (tool, key in its data,
# key the pass's data keeps it under; None: the pass's data is the value itself).
_LEGACY: dict[str, tuple[str, str | None, str | None]] = {
    TIMELINE: ("get_step_trace", "host_bound_analysis", None),
    CUSTOM_CALLS: ("detect_layout_mismatch_copies", "custom_calls", "custom_calls"),
    ASYNC_COPIES: ("detect_layout_mismatch_copies", "async_copies", "async_copies"),
    **{f"{PASS_PREFIX}{d}": (d, None, None) for d in DETECTORS},
}


def is_pass(name: str) -> bool:
    """Whether `name` is one of mldiag's own passes (not an xprof tool)."""
    return name.startswith(PASS_PREFIX)


def pass_result(snapshot: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    """The result `{name, status, data|error, from}` of mldiag's pass `name`: its entry under
    `passes`, else (an older snapshot, or a detector, filed under `tools`) where it was filed."""
    entry = (snapshot.get("passes") or {}).get(name)
    if isinstance(entry, Mapping):
        return entry
    legacy = _LEGACY.get(name)
    if legacy is None:
        return None
    tool, key, kept_as = legacy
    result = (snapshot.get("tools") or {}).get(tool)
    if not isinstance(result, Mapping):
        return None
    if key is None:
        return {**result, "name": name, "from": list(PASSES.get(name, ()))}
    data = result.get("data") if result.get("status") == "DATA" else None
    if not isinstance(data, Mapping) or key not in data:
        return None
    value = data[key] if kept_as is None else {kept_as: data[key]}
    return {"name": name, "status": "DATA", "data": value, "from": list(PASSES.get(name, ()))}


def passes(snapshot: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Every pass result the snapshot holds, by pass name (either layout)."""
    out = {}
    for name in [*(snapshot.get("passes") or {}), *_LEGACY]:
        entry = pass_result(snapshot, name)
        if entry is not None:
            out[name] = entry
    return out


def tool_data(snapshot: Mapping[str, Any], tool: str) -> Any:
    """The `data` of a tool (or of an mldiag pass) in a snapshot when its status is DATA,
    else None."""
    result = pass_result(snapshot, tool) if is_pass(tool) else (
        snapshot.get("tools", {}).get(tool))
    if not isinstance(result, Mapping) or result.get("status") != "DATA":
        return None
    return result.get("data")


# Old readers' paths into a snapshot whose passes have their own entries: the tool and first
# key they read → the pass that now holds it (and the key its data keeps it under).
_MOVED = {(tool, key): (name, kept_as) for name, (tool, key, kept_as) in _LEGACY.items()
          if key is not None}


def get(snapshot: Mapping[str, Any], tool: str, path: str, default: Any = None) -> Any:
    """The value at `path` in a tool's (or pass's) output, or `default`.

    For reading only: a path into a tool where a pass used to be filed
    (`get_step_trace`, `host_bound_analysis.steps_analyzed`) still reads the pass, so code
    that reads either layout keeps working. Citations use `cite`, which does not."""
    data = tool_data(snapshot, tool)
    if data is not None:
        try:
            return lookup(data, path)
        except MissingField:
            pass
    head, _, rest = path.partition(".")
    bracket = head.find("[")
    key, tail = (head, "") if bracket < 0 else (head[:bracket], head[bracket:])
    moved = _MOVED.get((tool, key))
    if moved is None:
        return default
    name, kept_as = moved
    inner = (tail + ("." + rest if rest else "")).lstrip(".") if kept_as is None else (
        kept_as + tail + ("." + rest if rest else ""))
    data = tool_data(snapshot, name)
    if data is None:
        return default
    if not inner:
        return data
    try:
        return lookup(data, inner)
    except MissingField:
        return default


def cite(snapshot: Mapping[str, Any], tool: str, path: str) -> dict[str, Any]:
    """An evidence item `{tool, field, value}` with the value read from the snapshot; for an
    mldiag pass, with `from`: what the pass computed it from."""
    data = tool_data(snapshot, tool)
    if data is None:
        raise MissingField(f"{tool} has no data")
    item = {"tool": tool, "field": path, "value": lookup(data, path)}
    if is_pass(tool):
        entry = pass_result(snapshot, tool) or {}
        item["from"] = list(entry.get("from") or PASSES.get(tool, ()))
    return item


def cite_value(tool: str, path: str, source: Any,
               computed_from: tuple[str, ...] | list[str] | None = None) -> dict[str, Any]:
    """Evidence from a follow-up tool output (not part of the snapshot); an mldiag pass's
    says what it was computed from."""
    item = {"tool": tool, "field": path, "value": lookup(source, path)}
    if computed_from:
        item["from"] = list(computed_from)
    return item


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
