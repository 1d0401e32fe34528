"""GeminiInvestigator against a fake Vertex endpoint on loopback, on the real TPU trace.

The client is a real google-genai Vertex client; only its base URL points at the fake, and a
guard refuses any connection that is not to 127.0.0.1, so no test reaches Google (no metadata
server, no token refresh).
"""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mldiag.adapters.gcp.gemini import (
    DIGEST_CHARS,
    REPORT_SCHEMA,
    GeminiInvestigator,
    snapshot_digest,
)
from mldiag.analysis.collection.collect import collect
from mldiag.analysis.collection.profile_input import ProfileSession, resolve_session
from mldiag.analysis.engine import build_analysis, investigate
from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.evidence_check import NumberPool
from mldiag.analysis.judgement.followups import FOLLOW_UP_TOOLS, FollowUps
from mldiag.analysis.judgement.triage import CATEGORIES, OPTIMAL, Triage, triage
from mldiag.analysis.report.summary import render_summary_html
from mldiag.settings import Settings
from tests.gemini.fake_vertex import (
    FakeVertex,
    Reply,
    Request,
    error,
    function_call,
    function_calls,
    json_report,
    text,
)

genai = pytest.importorskip("google.genai")
from google.genai import types  # noqa: E402
from google.oauth2.credentials import Credentials  # noqa: E402

MODEL = "gemini-2.5-flash"
MODULE = "jit_f(12190760917235803885)"


# ---------------------------------------------------------------- no traffic beyond loopback


def _loopback(host: Any) -> bool:
    if host in ("localhost", None):
        return True
    try:
        return ipaddress.ip_address(str(host)).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse DNS lookups and connections to anything but loopback."""
    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
            raise ConnectionRefusedError(f"test network guard: {address} is not loopback")
        return real_connect(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not _loopback(host):
            raise socket.gaierror(f"test network guard: no lookup of {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    for var in ("GOOGLE_API_KEY", "GEMINI_API_KEY", "GOOGLE_CLOUD_PROJECT",
                "GOOGLE_CLOUD_LOCATION", "GOOGLE_GENAI_USE_VERTEXAI"):
        monkeypatch.delenv(var, raising=False)


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def snapshot(tpu_logdir: Path) -> dict[str, Any]:
    return collect(tpu_logdir)


@pytest.fixture(scope="module")
def verdict(snapshot: dict[str, Any]) -> Triage:
    result = triage(snapshot)
    assert result.status == "NEEDS_ATTENTION"
    return result


@pytest.fixture(scope="module")
def session(tpu_logdir: Path) -> ProfileSession:
    return resolve_session(tpu_logdir)


@pytest.fixture
def fake() -> Iterator[FakeVertex]:
    with FakeVertex(token="test-token") as server:
        yield server


def _client(fake: FakeVertex) -> Any:
    return genai.Client(
        vertexai=True, project="p", location="us-central1",
        credentials=Credentials(token="test-token"),
        http_options=types.HttpOptions(base_url=fake.url))


def _investigator(fake: FakeVertex, **kwargs: Any) -> GeminiInvestigator:
    kwargs.setdefault("backoff_s", 0.01)
    kwargs.setdefault("timeout_s", 20.0)
    return GeminiInvestigator(client=_client(fake), model=MODEL, **kwargs)


def _run(snapshot: dict[str, Any], verdict: Triage, session: ProfileSession,
         investigator: GeminiInvestigator) -> dict[str, Any]:
    return investigate(snapshot, verdict, investigator, session=session)


# The report a careful model writes for the TPU trace after two follow-up calls.
COPY_DONE = "category_summary[category=copy-done]"
GOOD_TRANSFER = {
    "category": "data_transfer", "priority": "P0",
    "title": "copy-done takes 83.6% of device time: the input is streamed from host memory",
    "what": ("`copy-done.4` waits for `copy-start.4`, which copies param.2, an "
             "f32[5,1024,1024,256] array held in pinned host memory (S(5)), into HBM on every "
             "call; the 6 copy-done ops take 304033.212 ms of 363729.6988 ms profiled."),
    "evidence": [
        {"tool": "get_hlo_op_profile", "field": f"{COPY_DONE}.fraction_of_total_time",
         "value": "0.8359"},
        {"tool": "get_hlo_op_profile", "field": f"{COPY_DONE}.total_self_time_ms",
         "value": "304033.212"},
        {"tool": "get_hlo_op_profile", "field": f"{COPY_DONE}.top_op", "value": "copy-done.4"},
    ],
    "impact": {"value": 83.59, "unit": "% of device time",
               "text": "up to 83.6% of device time is spent waiting for host-to-device copies"},
    "fix": ("Place the array in device memory once: `x = jax.device_put(x, "
            "NamedSharding(mesh, P(), memory_kind='device'))` outside the jitted function, "
            "instead of passing a `pinned_host` array each call."),
}
# The same finding by a model that did not look at the HLO: no shapes it has not seen.
PLAIN_TRANSFER = {**GOOD_TRANSFER, "what": (
    "`copy-done.4` and 5 other copy-done ops wait for asynchronous copies; together they take "
    "304033.212 ms of 363729.6988 ms profiled.")}
GOOD_ROOFLINE = {
    "category": "memory_bound", "priority": "P1",
    "title": "HBM-bandwidth-bound at 4.35% roofline efficiency",
    "what": ("The program runs at 0.0419 FLOP/byte, far below the ridge point of 560.442 "
             "FLOP/byte, and reaches 4.35% of its roofline."),
    "evidence": [
        {"tool": "get_roofline_model", "field": "program.roofline_efficiency_percent",
         "value": "4.35%"},
        {"tool": "get_roofline_model", "field": "program.operational_intensity_flop_per_byte",
         "value": "0.0419"},
        {"tool": "get_roofline_model", "field": "program.bound_by_ridge_point_flop_per_byte",
         "value": "560.442"},
    ],
    "impact": {"value": 95.65, "unit": "% of device time",
               "text": "up to 95.65% of device time is headroom against the roofline"},
    "fix": "Remove the host copy first, then fuse the broadcast-add into its consumer.",
}
GOOD_IDLE = {
    "category": "idle", "priority": "P1", "title": "Device idle 13.4% of the profiled time",
    "what": "No device op runs for 13.4% of the time (duty cycle 86.5%).",
    "evidence": [
        {"tool": "get_xprof_overview", "field": "performance_summary.device_idle_time_percent",
         "value": "13.4%"},
        {"tool": "get_xprof_overview", "field": "performance_summary.device_duty_cycle_percent",
         "value": "86.5%"},
    ],
    "impact": {"value": 13.4, "unit": "% of device time",
               "text": "13.4% of device time has no op running"},
    "fix": "Overlap input with compute and remove per-step host syncs.",
}
HYPOTHESES = [
    {"category": "data_transfer", "status": "confirmed", "basis": "get_hlo_neighborhood",
     "statement": "copy-done.4 waits for a host-to-device copy of a parameter"},
    {"category": "communication", "status": "refuted", "basis": "get_hlo_op_profile",
     "statement": "all-reduce is a small share of device time"},
]
SUMMARY = ("This TPU v6 Lite profile needs attention. Host-to-device copies (copy-done) take "
           "83.6% of device time because an input lives in pinned host memory. The program "
           "reaches 4.35% of its roofline and the device is idle 13.4% of the time. Peak memory "
           "is 20.02 of 31.25 GiB.")


def report(*findings: dict[str, Any], summary: str = SUMMARY) -> dict[str, Any]:
    return {"summary": summary, "hypotheses": HYPOTHESES,
            "findings": [copy.deepcopy(f) for f in findings]}


def neighborhood_call() -> Reply:
    return function_call("get_hlo_neighborhood", instruction_name="copy-done.4",
                         module_name=MODULE, radius=1,
                         purpose="Find what copy-done.4 copies and who waits for it")


# ------------------------------------------------------------------------------- tests


def test_happy_path_two_calls_then_a_checked_report(fake, snapshot, verdict, session):
    fake.enqueue(
        neighborhood_call(),
        function_call("get_hosts", purpose="Confirm every host's trace is present"),
        text("The copy source is in S(5), host memory. Ready to report."),
        json_report(report(GOOD_TRANSFER, GOOD_ROOFLINE, GOOD_IDLE)),
    )
    doc = _run(snapshot, verdict, session, _investigator(fake))

    assert doc["investigator"] == f"gemini:{MODEL}"
    assert "fallback" not in doc
    assert [f["category"] for f in doc["findings"]] == ["data_transfer", "memory_bound", "idle"]
    assert [f["id"] for f in doc["findings"]] == ["F1", "F2", "F3"]
    assert doc["summary"] == SUMMARY
    assert doc["hypotheses"][0]["status"] == "confirmed"
    # Follow-ups ran through FollowUps, recorded like the rule-based investigator's.
    assert [(f["tool"], f["status"]) for f in doc["follow_ups"]] == [
        ("get_hlo_neighborhood", "DATA"), ("get_hosts", "DATA")]
    first = doc["follow_ups"][0]
    assert first["args"] == {"instruction_name": "copy-done.4", "module_name": MODULE,
                             "radius": 1}
    assert first["purpose"] == "Find what copy-done.4 copies and who waits for it"
    assert "copy-start.4" in first["data"]["text"]
    # Evidence values are the tool outputs' own (strings the model wrote become numbers).
    assert doc["findings"][0]["evidence"][0]["value"] == 0.8359
    assert doc["evidence_check"] == {"checked": 3, "kept": 3, "dropped": [], "corrected": []}
    assert doc["model"]["calls"] == 4 and doc["model"]["prompt_tokens"] > 0

    # What the fake saw: the token, the Vertex path, declarations, tool outputs fed back.
    assert not fake.rejected
    assert {r.model for r in fake.requests} == {MODEL}
    first_req = fake.requests[0]
    declared = {d["name"] for d in first_req.body["tools"][0]["functionDeclarations"]}
    assert declared == set(FOLLOW_UP_TOOLS)
    assert "P0 (critical)" in json.dumps(first_req.body["systemInstruction"])
    prompt = first_req.body["contents"][0]["parts"][0]["text"]
    assert "NEEDS_ATTENTION" in prompt and "category_summary" in prompt
    assert len(prompt) < 80_000
    answer = fake.requests[1].function_responses()[0]
    assert answer["name"] == "get_hlo_neighborhood"
    assert "copy-start.4" in answer["response"]["data"]["text"]
    # The report is its own call: no tools, JSON under the schema.
    final = fake.requests[-1]
    assert not final.has_tools
    assert final.generation_config["responseMimeType"] == "application/json"
    assert set(final.generation_config["responseSchema"]["properties"]) == set(
        REPORT_SCHEMA["properties"])


def test_analysis_json_from_a_gemini_investigation(fake, snapshot, verdict, session):
    fake.enqueue(neighborhood_call(), text("Confirmed."),
                 json_report(report(GOOD_TRANSFER, GOOD_ROOFLINE)))
    doc = _run(snapshot, verdict, session, _investigator(fake))
    analysis = build_analysis(snapshot, verdict, doc)

    assert analysis["investigator"] == f"gemini:{MODEL}"
    # The page's summary is written from the final list of findings, as every page's is; the
    # model's own is kept beside it and shown under provenance.
    top = analysis["findings"][0]
    assert analysis["summary"].startswith(
        f"This TPU v6 Lite profile (1 host(s)) needs attention: "
        f"{sum(f['priority'] == 'P0' for f in analysis['findings'])} P0 and "
        f"{sum(f['priority'] == 'P1' for f in analysis['findings'])} P1 finding(s)")
    assert f"Top issue ({top['priority']}): {top['title'].rstrip('.')}" in analysis["summary"]
    assert analysis["investigator_summary"] == SUMMARY
    assert len(analysis["follow_ups"]) == 1
    for f in analysis["findings"]:
        assert f["category"] in CATEGORIES and f["priority"] in ("P0", "P1", "P2")
        assert f["what"] and f["fix"] and f["impact"]["unit"]
        for e in f["evidence"]:
            assert set(e) == {"tool", "field", "value"}
            # The same check as tests/integration: evidence is copied from the snapshot.
            if e["tool"] in snapshot["tools"]:
                assert ev.lookup(snapshot["tools"][e["tool"]]["data"], e["field"]) == e["value"]
    html = render_summary_html(analysis, snapshot)
    assert f"gemini:{MODEL}" in html
    assert "Host-to-device copies (copy-done) take 83.6% of device time" in html


def test_at_most_four_tool_calls_when_the_model_keeps_asking(fake, snapshot, verdict, session):
    def responder(request: Request) -> Reply:
        if request.has_tools:
            return function_calls(("get_hosts", {"purpose": "again"}),
                                  ("get_hosts", {"purpose": "and again"}),
                                  ("get_hosts", {"purpose": "once more"}))
        return json_report(report(PLAIN_TRANSFER))

    fake.responder = responder
    doc = _run(snapshot, verdict, session, _investigator(fake))

    assert doc["investigator"] == f"gemini:{MODEL}"
    assert len(doc["follow_ups"]) == 4
    assert [r.has_tools for r in fake.requests] == [True, True, False]
    refused = [r["response"] for r in fake.requests[-1].function_responses()]
    assert len(refused) == 3
    assert "status" in refused[0] and "budget" in refused[1]["error"]
    assert "budget" in refused[2]["error"]


def test_bad_tool_requests_are_answered_without_spending_the_budget(
        fake, snapshot, verdict, session):
    fake.enqueue(
        function_calls(("get_trace_viewer", {"purpose": "not a follow-up tool"}),
                       ("get_hlo_neighborhood", {"purpose": "no instruction"})),
        text("Done."),
        json_report(report(PLAIN_TRANSFER)),
    )
    doc = _run(snapshot, verdict, session, _investigator(fake))
    assert doc["investigator"] == f"gemini:{MODEL}"
    assert doc["follow_ups"] == []
    errors = [r["response"]["error"] for r in fake.requests[1].function_responses()]
    assert "unknown tool" in errors[0] and "missing argument 'instruction_name'" in errors[1]


def test_hallucinated_numbers_are_dropped_or_corrected(fake, snapshot, verdict, session):
    invented = copy.deepcopy(GOOD_IDLE)
    invented["title"] = "Device idle 27.3% of the profiled time"
    invented["impact"] = {"value": 27.3, "unit": "% of device time",
                          "text": "27.3% of device time has no op running"}
    wrong_value = copy.deepcopy(GOOD_ROOFLINE)
    wrong_value["evidence"][0]["value"] = "14.35%"
    ghost_field = copy.deepcopy(PLAIN_TRANSFER)
    ghost_field["evidence"].append({"tool": "get_hlo_op_profile",
                                    "field": "category_summary[category=infeed].top_op",
                                    "value": "infeed.1"})
    fake.enqueue(text("No calls needed."),
                 json_report(report(ghost_field, wrong_value, invented,
                                    summary=SUMMARY + " Fixing it saves 41.7 ms per step.")))
    doc = _run(snapshot, verdict, session, _investigator(fake))

    assert doc["investigator"] == f"gemini:{MODEL}"
    assert [f["category"] for f in doc["findings"]] == ["data_transfer", "memory_bound"]
    check = doc["evidence_check"]
    assert check["checked"] == 3 and check["kept"] == 2
    assert check["dropped"] == [{"finding": invented["title"],
                                 "reason": "states numbers found in no tool output: 27.3"}]
    fixes = {c["item"]: c for c in check["corrected"]}
    roofline = fixes["evidence get_roofline_model.program.roofline_efficiency_percent"]
    assert (roofline["from"], roofline["to"]) == ("14.35%", "4.35%")
    assert doc["findings"][1]["evidence"][0]["value"] == "4.35%"
    assert fixes["evidence get_hlo_op_profile.category_summary[category=infeed].top_op"][
        "to"] is None
    assert len(doc["findings"][0]["evidence"]) == 3
    # The summary stated an invented number: the rule-based summary replaces it.
    assert "41.7" in fixes["summary"]["from"] and "41.7" not in doc["summary"]
    assert "needs attention" in doc["summary"]


def test_no_surviving_finding_falls_back(fake, snapshot, verdict, session):
    invented = copy.deepcopy(GOOD_TRANSFER)
    invented["what"] = "The 7 copy-done ops take 512345.5 ms."
    fake.enqueue(text("Done."), json_report(report(invented)))
    doc = _run(snapshot, verdict, session, _investigator(fake))
    assert doc["investigator"] == "rule-based"
    assert doc["fallback"]["from"] == f"gemini:{MODEL}"
    assert doc["fallback"]["reason"] == "no finding survived the evidence check (1 of 1 dropped)"
    assert "512345.5" in doc["fallback"]["evidence_check"]["dropped"][0]["reason"]
    assert doc["findings"] and doc["findings"][0]["priority"] == "P0"


def test_malformed_json_falls_back_to_rule_based(fake, snapshot, verdict, session):
    fake.enqueue(text("Done."),
                 text('{"summary": "The copy-done ops", "findings": [{"category": "data_tr',
                      finish="MAX_TOKENS"))
    doc = _run(snapshot, verdict, session, _investigator(fake))
    assert doc["investigator"] == "rule-based"
    assert doc["fallback"]["from"] == f"gemini:{MODEL}"
    assert doc["fallback"]["reason"].startswith("malformed JSON report")
    assert "MAX_TOKENS" in doc["fallback"]["reason"]
    assert any(f["category"] == "data_transfer" for f in doc["findings"])
    analysis = build_analysis(snapshot, verdict, doc)
    assert analysis["investigator"] == "rule-based"


def test_http_429_is_retried_with_backoff(fake, snapshot, verdict, session):
    naps: list[float] = []
    fake.enqueue(error(429, "Resource exhausted. Please try again later."),
                 text("Done."), json_report(report(PLAIN_TRANSFER)))
    investigator = _investigator(fake, backoff_s=0.5, sleep=naps.append)
    doc = _run(snapshot, verdict, session, investigator)
    assert doc["investigator"] == f"gemini:{MODEL}"
    assert len(fake.requests) == 3 and len(naps) == 1 and 0.5 <= naps[0] <= 0.625


def test_persistent_429_falls_back_after_bounded_retries(fake, snapshot, verdict, session):
    naps: list[float] = []
    fake.responder = lambda request: error(429, "Resource exhausted.")
    doc = _run(snapshot, verdict, session,
               _investigator(fake, max_attempts=3, backoff_s=0.5, sleep=naps.append))
    assert doc["investigator"] == "rule-based"
    assert doc["fallback"]["reason"].startswith(
        "Vertex AI HTTP 429 RESOURCE_EXHAUSTED after 3 attempts")
    assert len(fake.requests) == 3
    assert len(naps) == 2 and naps[1] >= 2 * 0.5  # exponential


def test_http_500_falls_back(fake, snapshot, verdict, session):
    fake.enqueue(error(500, "Internal error encountered."))
    doc = _run(snapshot, verdict, session, _investigator(fake))
    assert doc["investigator"] == "rule-based"
    assert doc["fallback"]["reason"] == (
        "Vertex AI HTTP 500 INTERNAL: Internal error encountered.")
    assert len(fake.requests) == 1


def test_timeout_falls_back(fake, snapshot, verdict, session):
    fake.enqueue(Reply(body={}, delay_s=5.0))
    started = time.monotonic()
    doc = _run(snapshot, verdict, session, _investigator(fake, timeout_s=0.5))
    assert time.monotonic() - started < 4.0
    assert doc["investigator"] == "rule-based"
    assert doc["fallback"]["reason"].startswith("timeout: no answer from Vertex AI within 0.5 s")


def test_optimal_triage_gets_one_call_without_tools(fake, snapshot, verdict, session):
    healthy = dataclasses.replace(verdict, status=OPTIMAL, hypotheses=[])
    fake.enqueue(json_report(report(summary="This profile looks healthy.")))
    with FollowUps(session, max_calls=0) as follow_ups:
        doc = _investigator(fake).investigate(snapshot, healthy, follow_ups)
    assert doc["investigator"] == f"gemini:{MODEL}"
    assert doc["findings"] == [] and doc["follow_ups"] == []
    assert [r.has_tools for r in fake.requests] == [False]


def test_from_settings_reads_the_base_url_from_the_environment(fake, snapshot, verdict,
                                                               session):
    settings = Settings(project="p", location="us-central1", gemini_model="gemini-2.5-pro",
                        gemini_timeout_s=7.0)
    investigator = GeminiInvestigator.from_settings(
        settings, credentials=Credentials(token="test-token"),
        env={"MLDIAG_GEMINI_BASE_URL": fake.url})
    assert investigator.name == "gemini:gemini-2.5-pro" and investigator.timeout_s == 7.0
    fake.enqueue(text("Done."), json_report(report(PLAIN_TRANSFER)))
    doc = _run(snapshot, verdict, session, investigator)
    assert doc["investigator"] == "gemini:gemini-2.5-pro"
    assert fake.requests[0].path == (
        "/v1beta1/projects/p/locations/us-central1/publishers/google/models/"
        "gemini-2.5-pro:generateContent")
    assert fake.requests[0].headers["Authorization"] == "Bearer test-token"


@pytest.mark.parametrize("project", ["", "p"])
def test_missing_credentials_fall_back_without_traffic(project, fake, snapshot, verdict,
                                                       session, tmp_path, monkeypatch):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    env = {"MLDIAG_GEMINI_BASE_URL": fake.url} if project else {}
    investigator = GeminiInvestigator.from_settings(Settings(project=project), env=env)
    doc = _run(snapshot, verdict, session, investigator)
    assert doc["investigator"] == "rule-based"
    assert "DefaultCredentialsError" in doc["fallback"]["reason"]
    assert not fake.requests and not fake.rejected


def test_wrong_token_is_an_api_error_and_falls_back(fake, snapshot, verdict, session):
    fake.token = "another-token"
    doc = _run(snapshot, verdict, session, _investigator(fake))
    assert doc["fallback"]["reason"].startswith("Vertex AI HTTP 401 UNAUTHENTICATED")
    assert fake.rejected and not fake.requests


def test_number_pool_accepts_rounding_and_unit_changes_only():
    pool = NumberPool([{"fraction": 0.8359, "mib": 20480.09, "ps": 2.5e9, "text": "13.4%"}])
    assert pool.unknown_in("83.6% of time, 20.00 GiB, 2.5 ms, 13.4% idle, 84% overall") == []
    assert pool.unknown_in("83.7% of time, 21.5 GiB, 13.45%") == ["83.7", "21.5", "13.45"]
    # Identifiers and counts carry no claim: bf16, copy-done.4, v5e, 3 steps.
    assert pool.unknown_in("bf16 copy-done.4 on v5e over 3 steps") == []


def test_snapshot_digest_is_bounded_and_keeps_field_paths(snapshot):
    huge = copy.deepcopy(snapshot)
    huge["tools"]["get_hlo_op_profile"]["data"]["grouped_operations"]["copy-done"] *= 5000
    huge["tools"]["get_xprof_overview"]["data"]["blob"] = "x" * 3_000_000
    digest = snapshot_digest(huge)
    assert len(json.dumps(digest)) <= DIGEST_CHARS
    ops = digest["get_hlo_op_profile"]["data"]
    path = f"{COPY_DONE}.fraction_of_total_time"
    assert ev.lookup(ops, path) == ev.lookup(snapshot["tools"]["get_hlo_op_profile"]["data"], path)


def test_importing_mldiag_does_not_import_google_genai():
    code = ("import sys, mldiag, mldiag.analysis.engine, mldiag.adapters.gcp.gemini; "
            "assert 'google.genai' not in sys.modules, 'google.genai imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
