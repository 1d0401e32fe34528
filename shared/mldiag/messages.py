"""Messages of the event chain: frozen dataclasses, JSON on the wire.

Commands are imperative (`AnalyzeSession`), events past tense (`ProfileObjectFinalized`). Each
message type travels on one topic; `TOPIC_OF` is the single routing table shared by the
in-process bus and Pub/Sub.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
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
    # "md5:<base64>" (GCS's md5Hash, or computed locally) or "crc32c:<base64>"; "" unknown.
    content_hash: str = ""

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
class CollectHost(SessionMessage):
    """Run one host's share of a fanned-out collection (its own function instance)."""

    kind: ClassVar[str] = "CollectHost"
    host: str


@dataclass(frozen=True)
class InvestigateSession(SessionMessage):
    """Investigate a session whose triage was not OPTIMAL."""

    kind: ClassVar[str] = "InvestigateSession"


@dataclass(frozen=True)
class RenderReport(SessionMessage):
    """Write analysis.json and summary.html, and mark the session REPORTED."""

    kind: ClassVar[str] = "RenderReport"


@dataclass(frozen=True)
class PrebuildViewer(SessionMessage):
    """Build the XProf viewer's caches of a REPORTED session, so its first open is warm.

    `rebuild`: set by the console when the caches expired (the bucket's lifecycle deleted
    them), to when it found them gone (its claim is the rebuild's own)."""

    kind: ClassVar[str] = "PrebuildViewer"
    rebuild: str = ""


@dataclass(frozen=True)
class DegradationDetected(Message):
    """A monitor saw a run's performance degrade (normalised from any alert payload)."""

    kind: ClassVar[str] = "DegradationDetected"
    alert_id: str
    run: str
    source: str = "mldiag-monitor"
    summary: str = ""
    targets: list[str] = field(default_factory=list)
    detected_at: float = 0.0


@dataclass(frozen=True)
class CaptureProfile(Message):
    """Capture one profile session of a run on its targets (all when `targets` is empty).

    `capture` is "on_demand" (a remote trace of the next `duration_s`) or "snapshot" (the
    newest `duration_s` of the continuous ring). `trigger` is "manual" or "alert".
    """

    kind: ClassVar[str] = "CaptureProfile"
    run: str
    session: str
    capture: str = "on_demand"
    targets: list[str] = field(default_factory=list)
    duration_s: float = 2.0
    host_tracer_level: int = 2
    device_tracer_level: int = 1
    python_tracer_level: int = 0
    trigger: str = "manual"
    request_id: str = ""
    # Why it was requested (the alert's summary), shown with the report.
    note: str = ""


@dataclass(frozen=True)
class ContinuousProfiling(Message):
    """Start or stop continuous profiling (snapshot mode) on a run's targets."""

    kind: ClassVar[str] = "ContinuousProfiling"
    run: str
    action: str  # start | stop
    targets: list[str] = field(default_factory=list)
    device_tracer_level: int = 1
    host_tracer_level: int = 2
    python_tracer_level: int = 0
    window_s: float = 2.0
    max_bytes: int = 2 * 1024**3
    request_id: str = ""


TOPIC_OF: dict[type[Message], str] = {
    DegradationDetected: "degradation-alerts",
    CaptureProfile: "capture-requests",
    ContinuousProfiling: "capture-requests",
    ProfileObjectFinalized: "profile-objects",
    AnalyzeSession: "analysis-requests",
    CollectHost: "host-analysis-requests",
    InvestigateSession: "investigation-requests",
    RenderReport: "report-requests",
    PrebuildViewer: "viewer-requests",
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
    missing = [n for n, f in wanted.items()
               if n not in data and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise PoisonMessage(f"{cls.kind}: missing field(s) {', '.join(sorted(missing))}")
    values = {n: data[n] for n in wanted if n in data}
    for name, value in values.items():
        want = wanted[name].type
        number = isinstance(value, int | float) and not isinstance(value, bool)
        ok = {"str": isinstance(value, str),
              "int": isinstance(value, int) and not isinstance(value, bool),
              "float": number and value == value and abs(value) != float("inf"),
              "list[str]": isinstance(value, list) and all(isinstance(v, str) for v in value),
              }.get(str(want), True)
        if not ok:
            raise PoisonMessage(f"{cls.kind}.{name}: expected {want}, got {value!r}")
        if want == "str" and not value and wanted[name].default is MISSING:
            raise PoisonMessage(f"{cls.kind}.{name}: must not be empty")
        if want == "float":
            values[name] = float(value)
    return cls(**values)
