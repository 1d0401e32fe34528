"""The embedded pipeline in tests: fast settings, the scenario's names, and what a test
inspects (session states, the bus's durable queue, the analysis artifacts)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mldiag.adapters.local.state import SqliteStateStore
from mldiag.bootstrap import LocalRuntime
from mldiag.model import FAILED, REPORTED, SessionRecord
from tests.helpers.wait import wait_until

# make_runtime(**settings): a runtime built by bootstrap on the test's home
# (tests/pipeline/conftest.py).
MakeRuntime = Callable[..., LocalRuntime]

# Short windows so each scenario takes about a second; correctness never depends on them.
FAST = {"settle_s": 0.3, "stability_s": 0.1, "poll_s": 0.02, "retry_backoff_s": 0.05,
        "max_attempts": 3}

# The run and session of the stages' scenarios (tests/pipeline).
RUN, SESSION = "myrun", "s1"
ARTIFACTS = {"health_snapshot.json", "triage.json", "investigation.json", "analysis.json",
             "summary.html"}


def object_name(host: str, session: str = SESSION, run: str = RUN) -> str:
    return f"{run}/plugins/profile/{session}/{host}.xplane.pb"


def session_of(rt: LocalRuntime, session: str = SESSION, run: str = RUN) -> SessionRecord:
    s = rt.state.get_session(run, session)
    assert s is not None, f"no session {run}/{session}"
    return s


def wait_state(rt: LocalRuntime, *states: str, session: str = SESSION, version: int = 1,
               timeout: float = 60.0) -> SessionRecord:
    def done() -> SessionRecord | None:
        s = rt.state.get_session(RUN, session)
        return s if s is not None and s.state in states and s.version == version else None

    return wait_until(done, timeout=timeout,
                      what=f"{RUN}/{session} v{version} to reach {'/'.join(states)}")


def finished(rt: LocalRuntime, run: str, session: str, *,
             timeout: float = 120.0) -> SessionRecord:
    """The session once REPORTED or FAILED."""
    def done() -> SessionRecord | None:
        s = rt.state.get_session(run, session)
        return s if s is not None and s.state in (REPORTED, FAILED) else None

    return wait_until(done, timeout=timeout, interval=0.1,
                      what=f"session {run}/{session} to finish")


def analysis_dir(rt: LocalRuntime, session: str = SESSION) -> Path:
    return rt.storage.root / RUN / "plugins" / "profile" / session / "analysis"


def assert_reported_once(rt: LocalRuntime, version: int = 1) -> None:
    s = session_of(rt)
    assert (s.state, s.version, s.reported_version) == (REPORTED, version, version)
    assert s.verdict in ("OPTIMAL", "NEEDS_ATTENTION") and s.reason == ""
    base = analysis_dir(rt)
    assert ARTIFACTS <= {p.name for p in base.iterdir()}
    assert ARTIFACTS <= {p.name for p in (base / f"v{version}").iterdir()}
    assert s.report_path == (base / "summary.html").as_uri()
    analysis = json.loads((base / "analysis.json").read_text())
    assert analysis["status"] == s.verdict and analysis["session"]["version"] == version
    assert "<html" in (base / "summary.html").read_text().lower()


def bus_messages(state: SqliteStateStore, topic: str | None = None) -> list[dict[str, Any]]:
    """The rows of the bus's durable queue (the in-process bus keeps them in state.db)."""
    sql = "SELECT id, topic, payload, state, attempts, last_error FROM messages"
    args: tuple[str, ...] = ()
    if topic is not None:
        sql, args = sql + " WHERE topic = ?", (topic,)
    rows = state.connection().execute(sql + " ORDER BY id", args).fetchall()
    keys = ("id", "topic", "payload", "state", "attempts", "last_error")
    out = [dict(zip(keys, r, strict=True)) for r in rows]
    for row in out:
        try:
            row["body"] = json.loads(row["payload"])
        except ValueError:
            row["body"] = None
    return out


def kinds(rt: LocalRuntime, kind: str) -> list[dict[str, Any]]:
    """The bus's messages of one kind (AnalyzeSession, RenderReport, ...)."""
    return [m for m in bus_messages(rt.state)
            if isinstance(m["body"], dict) and m["body"].get("kind") == kind]


def finalized_names(state: SqliteStateStore) -> list[str]:
    """Object names of every finalize event published so far, in order."""
    return [m["body"]["name"] for m in bus_messages(state, "profile-objects")
            if isinstance(m["body"], dict) and "name" in m["body"]]
