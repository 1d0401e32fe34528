"""Messages of the event chain: frozen dataclasses, JSON on the wire.

Commands are imperative (`AnalyzeSession`), events past tense (`ProfileObjectFinalized`). Each
message type travels on one topic; `TOPIC_OF` is the single routing table shared by the
in-process bus and Pub/Sub.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, ClassVar

from mldiag.errors import PoisonMessage


@dataclass(frozen=True)
class Message:
    """Base of all messages; `kind` names the concrete type on the wire."""

    kind: ClassVar[str] = ""

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, **asdict(self)}, sort_keys=True)


@dataclass(frozen=True)
class ProfileObjectFinalized(Message):
    """An object was written to the profile bucket (GCS finalize, or the local watcher)."""

    kind: ClassVar[str] = "ProfileObjectFinalized"
    bucket: str
    name: str
    generation: str
    size: int = 0

    @property
    def event_key(self) -> str:
        return f"{self.bucket}/{self.name}#{self.generation}"


@dataclass(frozen=True)
class SessionMessage(Message):
    """A command about one version of one session."""

    run: str
    session: str
    version: int


@dataclass(frozen=True)
class AnalyzeSession(SessionMessage):
    """Collect the health snapshot of one version of a session."""

    kind: ClassVar[str] = "AnalyzeSession"


@dataclass(frozen=True)
class InvestigateSession(SessionMessage):
    """Investigate a session whose triage was not OPTIMAL."""

    kind: ClassVar[str] = "InvestigateSession"


@dataclass(frozen=True)
class RenderReport(SessionMessage):
    """Write analysis.json and summary.html, and mark the session REPORTED."""

    kind: ClassVar[str] = "RenderReport"


TOPIC_OF: dict[type[Message], str] = {
    ProfileObjectFinalized: "profile-objects",
    AnalyzeSession: "analysis-requests",
    InvestigateSession: "investigation-requests",
    RenderReport: "report-requests",
}
MESSAGE_TYPES: dict[str, type[Message]] = {t.kind: t for t in TOPIC_OF}


def topic_of(message: Message) -> str:
    return TOPIC_OF[type(message)]


def parse(payload: bytes | str | dict[str, Any], topic: str | None = None) -> Message:
    """Parse a wire payload into its message; raise PoisonMessage with a clear reason."""
    if isinstance(payload, bytes | str):
        try:
            data = json.loads(payload)
        except (UnicodeDecodeError, ValueError) as e:
            raise PoisonMessage(f"not JSON: {e}") from e
    else:
        data = payload
    if not isinstance(data, dict):
        raise PoisonMessage(f"expected a JSON object, got {type(data).__name__}")
    kind = data.get("kind")
    if kind is None and topic is not None:
        # Messages published by other tools may omit `kind`: the topic decides.
        kind = next((t.kind for t, name in TOPIC_OF.items() if name == topic), None)
    cls = MESSAGE_TYPES.get(str(kind))
    if cls is None:
        raise PoisonMessage(f"unknown message kind {kind!r}")
    wanted = {f.name: f for f in fields(cls)}
    missing = [n for n, f in wanted.items() if n not in data and f.default is MISSING]
    if missing:
        raise PoisonMessage(f"{cls.kind}: missing field(s) {', '.join(sorted(missing))}")
    values = {n: data[n] for n in wanted if n in data}
    for name, value in values.items():
        want = wanted[name].type
        ok = {"str": isinstance(value, str),
              "int": isinstance(value, int) and not isinstance(value, bool)}.get(str(want), True)
        if not ok:
            raise PoisonMessage(f"{cls.kind}.{name}: expected {want}, got {value!r}")
        if want == "str" and not value:
            raise PoisonMessage(f"{cls.kind}.{name}: must not be empty")
    return cls(**values)
