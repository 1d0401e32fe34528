"""What the analysis stages ask of a session: whether a message is still its current work
(and, while that work runs, whether a later host has made it moot), where its analysis
objects live, and which generations of its hosts to read."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from mldiag.analysis import JobsStopped, ProfileSession, stop_when
from mldiag.errors import MldiagError, PoisonMessage
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


# How often running work reads its session to learn whether its version was superseded.
SUPERSEDED_CHECK_S = 2.0


class Superseded(MldiagError):
    """A later host started the session's next version: this version's work is moot.

    Permanent for that work: it stops, and its message is acknowledged.
    """


def superseded_by(services: Services, msg: SessionMessage) -> str | None:
    """Why `msg`'s version is no longer the session's (a later host started the next one,
    `SessionRecord.superseded` says when), or None while it is."""
    s = services.state.get_session(msg.run, msg.session)
    if s is None or s.version == msg.version:
        return None
    return (f"version {msg.version} of {msg.run}/{msg.session} was superseded by version "
            f"{s.version}")


@contextmanager
def unless_superseded(services: Services, msg: SessionMessage) -> Iterator[None]:
    """Run `msg`'s work, stopping it at its next check once its version is superseded: the
    collection's jobs stop within SUPERSEDED_CHECK_S and their workers are killed, and
    Superseded is raised."""
    last = [time.monotonic()]

    def check() -> str | None:
        now = time.monotonic()
        if now - last[0] < SUPERSEDED_CHECK_S:
            return None
        last[0] = now
        return superseded_by(services, msg)

    with stop_when(check):
        try:
            yield
        except JobsStopped as e:
            raise Superseded(str(e)) from e


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
