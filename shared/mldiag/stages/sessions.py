"""What the analysis stages ask of a session: whether a message is still its current work,
where its analysis objects live, and which generations of its hosts to read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from mldiag.analysis import ProfileSession
from mldiag.errors import PoisonMessage
from mldiag.messages import SessionMessage
from mldiag.model import SessionRecord
from mldiag.stages.services import Services


def stage_key(stage: str, msg: SessionMessage) -> str:
    return f"{stage}:{msg.run}/{msg.session}#v{msg.version}"


def current(services: Services, msg: SessionMessage,
            states: tuple[str, ...]) -> SessionRecord | None:
    """The session if this message is still its current work, else None (a duplicate)."""
    if services.state.get_run(msg.run) is None:
        raise PoisonMessage(f"unknown run {msg.run!r}")
    s = services.state.get_session(msg.run, msg.session)
    if s is None:
        raise PoisonMessage(f"unknown session {msg.run}/{msg.session}")
    if s.version != msg.version or s.state not in states:
        return None
    return s


def profile_session(s: SessionRecord, local_dir: Path) -> ProfileSession:
    hosts = sorted(h for h, r in s.hosts.items() if r.status == "ARRIVED")
    paths = tuple(local_dir / s.hosts[h].object_name.rsplit("/", 1)[1] for h in hosts)
    return ProfileSession(run=s.run, name=s.session, path=local_dir, xplanes=paths)


def generations(s: SessionRecord) -> dict[str, str]:
    """object name -> the generation registered for this version (what it must read)."""
    return {r.object_name: r.generation for r in s.hosts.values() if r.generation}


def analysis_dir(s: SessionRecord) -> str:
    any_host = next(iter(s.hosts.values()))
    return f"{any_host.object_name.rsplit('/', 1)[0]}/analysis"


def read_json(services: Services, name: str) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(services.storage.read_bytes(name)))
