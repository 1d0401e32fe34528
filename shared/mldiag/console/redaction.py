"""What analysis_viewer reads of a session's stored documents (analysis.json, its snapshot,
diff.json), and so of the report and diffs drawn from them: the same, less the addresses and
server paths a failure leaves there.

Those who may view profiles (and so targets) read the documents whole. For the others, the
places a document keeps locations (`failed_hosts` reasons, a session's `path`, a run's
`storage_prefix`) and the session's own failure reasons are collected, and each occurrence of
those strings anywhere in the document (a finding quotes a reason) is replaced by the string
with its locations replaced (`without_locations`). Only those exact strings change: the
rest of the report (a source line such as `train.py:183`) reads as written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from mldiag.model import SessionRecord

# What a failure reason may hold that only those who may view profiles see: URLs and bucket
# URIs, absolute paths, IP addresses, and host:port.
_HEX = r"[0-9A-Fa-f]{1,4}"
_LOCATIONS = (
    (re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>)]*"), "[location]"),
    (re.compile(r"(?<![\w.~-])(?:~|\.{1,2})?/[^\s'\"<>,;)]+"), "[path]"),
    (re.compile(r"\[[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*\](?::\d+)?"), "[address]"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?\b"), "[address]"),
    # IPv6, whole (seven colons) or compressed (with `::`); not a time such as 12:30:45.
    (re.compile(rf"(?<![\w:.])(?:(?:{_HEX}:){{7}}{_HEX}|(?:{_HEX}(?::{_HEX})*)?::"
                rf"(?:{_HEX}(?::{_HEX})*)?)(?![\w:])"), "[address]"),
    # host:port (a name starting with a letter, so that a time is not one).
    (re.compile(r"\b[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)*:\d{2,5}\b"),
     "[address]"),
)


def without_locations(text: str) -> str:
    """`text` with its addresses and server paths replaced by placeholders."""
    for pattern, placeholder in _LOCATIONS:
        text = pattern.sub(placeholder, text)
    return text

# Keys whose string value is a server location (a bucket URI or path).
_LOCATION_KEYS = frozenset({"path", "storage_prefix", "report_path", "uri"})


def _collect(doc: Any, found: set[str]) -> None:
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "failed_hosts":
                reasons = value.values() if isinstance(value, dict) else (
                    value if isinstance(value, list) else ())
                for reason in reasons:
                    found.add(str(reason))
                    # A pod's list holds "host: reason"; findings quote the reason alone.
                    found.add(str(reason).partition(": ")[2])
            elif key in _LOCATION_KEYS and isinstance(value, str):
                found.add(value)
                # A tool's message names the directory itself (the local bucket's).
                found.add(value.removeprefix("file://"))
            _collect(value, found)
    elif isinstance(doc, list):
        for value in doc:
            _collect(value, found)


def session_reasons(*sessions: SessionRecord) -> list[str]:
    """The failure reasons the sessions' records hold (the session's and its hosts')."""
    return [r for s in sessions for r in (s.reason, *(h.reason for h in s.hosts.values()))]


def redacted(doc: Any, also: Iterable[str] = ()) -> Any:
    """`doc` (JSON data) with every location it keeps, and every string of `also`, replaced
    wherever it occurs by its text without locations."""
    found: set[str] = set(also)
    _collect(doc, found)
    pairs = sorted(((raw, without_locations(raw)) for raw in found if raw),
                   key=lambda pair: len(pair[0]), reverse=True)
    pairs = [(raw, safe) for raw, safe in pairs if raw != safe]

    def fix(value: Any) -> Any:
        if isinstance(value, str):
            for raw, safe in pairs:
                if raw in value:
                    value = value.replace(raw, safe)
            return value
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        return value

    return fix(doc) if pairs else doc
