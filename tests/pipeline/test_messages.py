"""Wire messages: round trips, and clear reasons for every kind of bad payload."""

from __future__ import annotations

import json

import pytest

from mldiag.errors import PoisonMessage
from mldiag.messages import (
    AnalyzeSession,
    InvestigateSession,
    Message,
    ProfileObjectFinalized,
    RenderReport,
    parse,
    topic_of,
)


@pytest.mark.parametrize("message", [
    ProfileObjectFinalized(bucket="b", name="r/plugins/profile/s/h.xplane.pb", generation="7",
                           size=12),
    AnalyzeSession(run="r", session="s", version=2),
    InvestigateSession(run="r", session="s", version=1),
    RenderReport(run="r", session="s", version=3),
])
def test_round_trip_as_json_and_bytes(message: Message) -> None:
    wire = message.to_json()
    assert parse(wire) == message
    assert parse(wire.encode()) == message
    assert parse(json.loads(wire)) == message


def test_kind_may_be_omitted_when_the_topic_says_it() -> None:
    msg = parse('{"run": "r", "session": "s", "version": 1}', topic="analysis-requests")
    assert msg == AnalyzeSession(run="r", session="s", version=1)
    assert topic_of(msg) == "analysis-requests"


def test_optional_size_defaults_to_zero() -> None:
    msg = parse({"kind": "ProfileObjectFinalized", "bucket": "b", "name": "n", "generation": "1"})
    assert isinstance(msg, ProfileObjectFinalized) and msg.size == 0


@pytest.mark.parametrize(("payload", "reason"), [
    ("{not json", "not JSON"),
    (b"\xff\xfe\x00", "not JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('"AnalyzeSession"', "expected a JSON object, got str"),
    ('{"kind": "DeleteEverything"}', "unknown message kind 'DeleteEverything'"),
    ('{"run": "r"}', "unknown message kind None"),
    ('{"kind": "AnalyzeSession", "run": "r"}', "AnalyzeSession: missing field(s) session, version"),
    ('{"kind": "AnalyzeSession", "run": "r", "session": "s", "version": "1"}',
     "AnalyzeSession.version: expected int, got '1'"),
    ('{"kind": "AnalyzeSession", "run": "r", "session": "s", "version": true}',
     "AnalyzeSession.version: expected int, got True"),
    ('{"kind": "RenderReport", "run": "", "session": "s", "version": 1}',
     "RenderReport.run: must not be empty"),
    ('{"kind": "RenderReport", "run": 5, "session": "s", "version": 1}',
     "RenderReport.run: expected str, got 5"),
    ('{"kind": "ProfileObjectFinalized", "bucket": "b", "name": "n", "generation": "1", '
     '"size": "big"}', "ProfileObjectFinalized.size: expected int, got 'big'"),
])
def test_bad_payloads_are_poison_with_a_clear_reason(payload: str | bytes, reason: str) -> None:
    with pytest.raises(PoisonMessage) as info:
        parse(payload)
    assert reason in str(info.value)


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    msg = parse({"kind": "AnalyzeSession", "run": "r", "session": "s", "version": 1,
                 "added_later": True})
    assert msg == AnalyzeSession(run="r", session="s", version=1)
