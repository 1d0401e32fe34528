"""GeminiInvestigator: Gemini on Vertex AI forms hypotheses, calls follow-up tools, reports.

It talks to Vertex AI through `google-genai` (imported lazily, here only), not through
`vertexai.generative_models`, which google-cloud-aiplatform deprecated. The loop is manual:
the model sees the triage and a bounded digest of the health snapshot, may call at most
`MAX_FOLLOW_UPS` follow-up tools (run through `FollowUps` and recorded like the rule-based
investigator's), then writes its report in a separate call without tools, as JSON under a
response schema.

Nothing the model writes is trusted: the judgement's evidence check
(`analysis/judgement/evidence_check.py`) resolves every cited `{tool, field}` in the tool
outputs and copies the real value in, and drops a finding whose text states a number that no
tool output holds. Timeouts, API errors (429 after bounded retries with backoff, 5xx),
unparseable answers and answers with no surviving finding fall back to the rule-based
investigator; the reason is recorded in the document as `fallback`.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from mldiag.analysis import (
    CATEGORIES,
    MAX_FOLLOW_UPS,
    OPTIMAL,
    PRIORITIES,
    PRIORITY_RULES,
    TOOLS,
    FollowUpRefused,
    FollowUps,
    RuleBasedInvestigator,
    Triage,
    check_report,
    read_session,
)
from mldiag.analysis import evidence as ev
from mldiag.errors import MldiagError

if TYPE_CHECKING:
    from google import genai
    from google.genai import types

    from mldiag.settings import Settings

# Status codes worth another attempt: quota (429) and a briefly unavailable backend (503).
RETRIED_HTTP_CODES = frozenset({429, 503})
DIGEST_CHARS = 40_000
TOOL_DIGEST_CHARS = 6_000
TRIAGE_CHARS = 12_000
TOOL_OUTPUT_CHARS = 12_000
_SHRINK_STEPS = ((20, 2000), (10, 600), (5, 300), (3, 120), (2, 60), (1, 40))


class GeminiUnavailable(MldiagError):
    """The model gave no usable answer; `reason` says why (recorded on fallback).

    Permanent for this investigation (429/503 answers were already retried): the
    investigator falls back to the rule-based findings; it never leaves `investigate`.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# Parameter schemas of the follow-up tools, matching `FollowUps.call` keyword arguments
# (xprof's CLI tools for the first three, ours for kernel stats and LLO).
_PURPOSE = {"type": "STRING", "description": "One sentence: which hypothesis this call tests."}
TOOL_PARAMETERS: dict[str, dict[str, Any]] = {
    "get_hlo_neighborhood": {
        "description": (
            "HLO text of the instructions around one instruction (producers and consumers), "
            "with shapes and layouts. Use it to place a fix for an op named in the snapshot "
            "(a detector's `instruction`, an op profile's `top_op`)."),
        "properties": {
            "instruction_name": {"type": "STRING",
                                 "description": "Instruction name, e.g. copy-done.4"},
            "module_name": {"type": "STRING",
                            "description": "HLO module name as the snapshot spells it, e.g. "
                                           "jit_f(12190760917235803885)"},
            "radius": {"type": "INTEGER", "description": "Steps up and down the graph, 1-3",
                       "minimum": 1, "maximum": 3},
            "direction": {"type": "STRING", "enum": ["both", "operands", "users"]},
        },
        "required": ["instruction_name"],
    },
    "aggregate_xplane_events": {
        "description": (
            "Count, average and percentiles of the durations of timeline events whose plane "
            "and event names match regexes (durations in picoseconds). Use it for host-side "
            "work between steps (plane_regex '^/host:CPU$') or for one kind of device op."),
        "properties": {
            "plane_regex": {"type": "STRING", "description": "Regex on plane names"},
            "event_regex": {"type": "STRING", "description": "Regex on event names"},
            "min_duration_ps": {"type": "INTEGER",
                                "description": "Ignore events shorter than this"},
            "group_by": {"type": "STRING",
                         "description": "Comma-separated subset of event, plane, line"},
        },
        "required": ["plane_regex", "event_regex"],
    },
    "get_kernel_stats": {
        "description": "GPU kernels ranked by total time, with occupancy and TensorCore use "
                       "(NO_DATA on TPU and CPU traces).",
        "properties": {"limit": {"type": "INTEGER", "description": "How many kernels, 1-50",
                                 "minimum": 1, "maximum": 50}},
        "required": [],
    },
    "get_hosts": {
        "description": "The hosts whose traces the session holds.",
        "properties": {},
        "required": [],
    },
    "analyze_async_overlap": {
        "description": "How much of each async op window (copies, collectives, send/recv) is "
                       "hidden behind compute on its device: summary, by_op, by_plane and the "
                       "most exposed windows (xprof's tool; device timelines only).",
        "properties": {"top_k": {"type": "INTEGER", "description": "Most exposed windows "
                                 "to list, 1-50", "minimum": 1, "maximum": 50}},
        "required": [],
    },
    "llo_load": {
        "description": "Load the trace's events into a SQL store and list its lines with "
                       "event counts; answers LLO_DATA_ABSENT on traces without LLO lines.",
        "properties": {},
        "required": [],
    },
    "llo_query": {
        "description": "Run one SELECT against the `Events` view of the events store "
                       "(load it first with llo_load).",
        "properties": {"sql": {"type": "STRING", "description": "One SELECT statement"}},
        "required": ["sql"],
    },
}

_STRING = {"type": "STRING"}
REPORT_SCHEMA: dict[str, Any] = {
    "type": "OBJECT",
    "properties": {
        "summary": {"type": "STRING",
                    "description": "3-5 sentences: verdict, top issue, key metrics."},
        "hypotheses": {"type": "ARRAY", "items": {
            "type": "OBJECT",
            "properties": {
                "category": {"type": "STRING", "enum": list(CATEGORIES)},
                "statement": _STRING,
                "status": {"type": "STRING", "enum": ["confirmed", "refuted", "untested"]},
                "basis": {"type": "STRING",
                          "description": "Which tool output confirms or refutes it"},
            },
            "required": ["category", "statement", "status"],
        }},
        "findings": {"type": "ARRAY", "items": {
            "type": "OBJECT",
            "properties": {
                "category": {"type": "STRING", "enum": list(CATEGORIES)},
                "priority": {"type": "STRING", "enum": list(PRIORITIES)},
                "title": _STRING,
                "what": {"type": "STRING", "description": "Root cause, with tensor shapes and "
                                                          "layouts where relevant"},
                "evidence": {"type": "ARRAY", "items": {
                    "type": "OBJECT",
                    "properties": {
                        "tool": _STRING,
                        "field": {"type": "STRING",
                                  "description": "Field path inside the tool's output"},
                        "value": {"type": "STRING",
                                  "description": "The value at that path, as written there"},
                    },
                    "required": ["tool", "field", "value"],
                }},
                "impact": {"type": "OBJECT", "properties": {
                    "value": {"type": "NUMBER", "nullable": True},
                    "unit": {"type": "STRING",
                             "description": "'% of step', '% of device time', 'ms' or 'GiB'"},
                    "text": _STRING,
                }, "required": ["value", "unit", "text"]},
                "fix": {"type": "STRING",
                        "description": "A concrete code or config change"},
            },
            "required": ["category", "priority", "title", "what", "evidence", "impact", "fix"],
        }},
    },
    "required": ["summary", "hypotheses", "findings"],
}

SYSTEM_INSTRUCTION = f"""\
You are mldiag's performance investigator for JAX workloads profiled with XProf. You get a
triage of one profile (headline metrics, the OPTIMAL checks, the hypotheses it raised) and a
reading of the session (device kind, steps or window and how many, per-host figures, each
headline metric with its unit and who measured it) and a digest of the health snapshot: the
outputs of {len(TOOLS)} collection tools, keyed by tool name, lists cut to their first items.
Decide nothing the reading already says (CPU, GPU or TPU; steps or window; one step or many):
take it from the reading.

Work like this:
1. Form hypotheses about the bottlenecks from the triage and the snapshot.
2. Test the strongest ones with the follow-up tools. You may make at most {MAX_FOLLOW_UPS}
   calls in all; each costs seconds, so call only what can change a finding.
3. When asked for the final report, answer with JSON only, following the response schema.

Finding categories (use exactly these names): {", ".join(CATEGORIES)}.
Priority rules:
{PRIORITY_RULES}
Missing data is never evidence of health: say what could not be judged.

Every number you state must be copied from a tool output; never compute, estimate or invent
one. Evidence items are {{tool, field, value}}: `tool` is the tool name (an xprof tool, or one of
mldiag's own passes, named `mldiag.<pass>` in the digest), `field` a path inside
that tool's output (dots for keys, [i] for list positions, [key=value] to select a list item,
e.g. category_summary[category=copy-done].fraction_of_total_time), `value` the value found
there, as written. In title, what and impact, state only numbers that appear in the tool outputs
or the triage (a fraction may be written as a percentage), without thousands separators; put
advice constants (tile sizes, flags) in fix. Findings whose numbers cannot be traced are
discarded. Each fix must be a concrete JAX code or config change.
"""

FINAL_INSTRUCTION = (
    "Write the final report now, as JSON following the response schema: your hypotheses (each "
    "confirmed, refuted or untested), the findings (strongest first) and a 3-5 sentence "
    "summary. Cite evidence by field path and copy every number from the tool outputs.")


class GeminiInvestigator:
    """Investigator backed by Gemini on Vertex AI, through `google-genai`.

    Pass `client` (a `google.genai.Client`) to reuse or fake one; otherwise a Vertex AI client
    for `project`/`location` (and `base_url`, for a private endpoint or a fake) is built on the
    first investigation, so constructing this never connects. `timeout_s` bounds each request;
    HTTP 429/503 are retried up to `max_attempts` times with exponential backoff from
    `backoff_s`.
    """

    def __init__(
        self,
        *,
        client: genai.Client | None = None,
        project: str = "",
        location: str = "us-central1",
        model: str = "gemini-2.5-flash",
        timeout_s: float = 60.0,
        base_url: str | None = None,
        credentials: Any = None,
        max_attempts: int = 4,
        backoff_s: float = 2.0,
        max_backoff_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.model = model
        self.name = f"gemini:{model}"
        self.project = project
        self.location = location
        self.timeout_s = timeout_s
        self.base_url = base_url
        self.max_attempts = max(1, max_attempts)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._credentials = credentials
        self._client = client
        self._sleep = sleep

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        client: genai.Client | None = None,
        credentials: Any = None,
        env: Mapping[str, str] | None = None,
    ) -> GeminiInvestigator:
        """Build from `Settings` (project, location, gemini_model, gemini_timeout_s) and the
        optional `MLDIAG_GEMINI_BASE_URL` environment variable."""
        env = os.environ if env is None else env
        return cls(client=client, project=settings.project, location=settings.location,
                   model=settings.gemini_model, timeout_s=settings.gemini_timeout_s,
                   base_url=env.get("MLDIAG_GEMINI_BASE_URL") or None, credentials=credentials)

    @property
    def client(self) -> genai.Client:
        """The google-genai client, built on first use."""
        if self._client is None:
            from google import genai
            from google.genai import types

            http_options = types.HttpOptions(base_url=self.base_url) if self.base_url else None
            self._client = genai.Client(
                vertexai=True, project=self.project or None, location=self.location,
                credentials=self._credentials, http_options=http_options)
        return self._client

    def investigate(
        self, snapshot: Mapping[str, Any], triage: Triage, follow_ups: FollowUps
    ) -> dict[str, Any]:
        """Run the model loop and return the investigation.json document (see module doc)."""
        started = time.perf_counter()
        session = _Session()
        try:
            doc = self._investigate(snapshot, triage, follow_ups, session)
        except GeminiUnavailable as e:
            return self._fallback(snapshot, triage, follow_ups, e.reason, session, started)
        surviving = len(doc["findings"])
        if surviving == 0 and triage.status != OPTIMAL:
            check = doc["evidence_check"]
            reason = (f"no finding survived the evidence check ({len(check['dropped'])} of "
                      f"{check['checked']} dropped)" if check["checked"] else
                      "the model reported no finding for a profile that needs attention")
            return self._fallback(snapshot, triage, follow_ups, reason, session, started,
                                  evidence_check=check)
        doc["elapsed_ms"] = round((time.perf_counter() - started) * 1000.0, 1)
        return doc

    def _investigate(
        self, snapshot: Mapping[str, Any], triage: Triage, follow_ups: FollowUps,
        session: _Session,
    ) -> dict[str, Any]:
        from google.genai import types

        timeout = types.HttpOptions(timeout=max(1, int(self.timeout_s * 1000)))
        contents: list[types.Content] = [
            types.Content(role="user", parts=[types.Part(text=build_prompt(
                snapshot, triage, follow_ups.remaining))])]
        tools_config = types.GenerateContentConfig(
            system_instruction=SYSTEM_INSTRUCTION,
            tools=[types.Tool(function_declarations=function_declarations())],
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
            temperature=0.0,
            http_options=timeout,
        )
        # A turn whose calls were all refused spends no budget; bound the turns as well.
        for _ in range(MAX_FOLLOW_UPS + 1):
            if follow_ups.remaining <= 0:
                break
            reply = _content_of(self._generate(contents, tools_config, session))
            contents.append(reply)
            calls = [p.function_call for p in reply.parts or [] if p.function_call]
            if not calls:
                break
            contents.append(types.Content(role="user", parts=[
                _run_call(call, follow_ups) for call in calls]))
        # Gemini models have rejected a JSON response type together with function tools, so
        # the report is its own call: same conversation, no tools, JSON under the schema.
        final_text = types.Part(text=FINAL_INSTRUCTION)
        if contents[-1].role == "user":
            contents[-1] = types.Content(role="user",
                                         parts=[*(contents[-1].parts or []), final_text])
        else:
            contents.append(types.Content(role="user", parts=[final_text]))
        report_config = types.GenerateContentConfig(
            system_instruction=SYSTEM_INSTRUCTION,
            response_mime_type="application/json",
            response_schema=types.Schema.model_validate(REPORT_SCHEMA),
            temperature=0.0,
            http_options=timeout,
        )
        response = self._generate(contents, report_config, session)
        report = parse_report(response)
        findings, hypotheses, summary, check = check_report(
            report, snapshot, triage, follow_ups.records)
        return {
            "investigator": self.name,
            "hypotheses": hypotheses,
            "follow_ups": follow_ups.records,
            "findings": findings,
            "summary": summary,
            "evidence_check": check,
            "model": {"name": self.model, "version": response.model_version,
                      "calls": session.calls, **session.usage},
        }

    def _generate(self, contents: list[types.Content], config: types.GenerateContentConfig,
                  session: _Session) -> types.GenerateContentResponse:
        """One generateContent call, retried on 429/503; failures become GeminiUnavailable."""
        from google.auth import exceptions as auth_errors
        from google.genai import errors

        timeouts, transport = _transport_errors()
        try:
            client = self.client
        except (auth_errors.GoogleAuthError, ValueError) as e:
            # google-genai raises ValueError when no project can be resolved.
            raise GeminiUnavailable(
                f"cannot build the Vertex AI client: {type(e).__name__}: {e}"[:400]) from e
        delay = self.backoff_s
        for attempt in range(1, self.max_attempts + 1):
            session.calls += 1
            try:
                response = client.models.generate_content(
                    model=self.model, contents=contents, config=config)
            except errors.APIError as e:
                if e.code in RETRIED_HTTP_CODES and attempt < self.max_attempts:
                    self._sleep(min(self.max_backoff_s, delay) * (1.0 + 0.25 * random.random()))
                    delay *= 2.0
                    continue
                tries = f" after {attempt} attempts" if attempt > 1 else ""
                raise GeminiUnavailable(
                    f"Vertex AI HTTP {e.code} {e.status or ''}{tries}: "
                    f"{(e.message or '')[:300]}".replace("  ", " ")) from e
            except timeouts as e:
                raise GeminiUnavailable(
                    f"timeout: no answer from Vertex AI within {self.timeout_s:g} s "
                    f"({type(e).__name__})") from e
            except transport as e:
                raise GeminiUnavailable(
                    f"cannot reach Vertex AI: {type(e).__name__}: {e}"[:400]) from e
            except auth_errors.GoogleAuthError as e:
                raise GeminiUnavailable(
                    f"no usable Google credentials: {type(e).__name__}: {e}"[:400]) from e
            session.add_usage(response)
            return response
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _fallback(
        self, snapshot: Mapping[str, Any], triage: Triage, follow_ups: FollowUps,
        reason: str, session: _Session, started: float,
        evidence_check: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        doc = RuleBasedInvestigator().investigate(snapshot, triage, follow_ups)
        doc["fallback"] = {"from": self.name, "reason": reason, "model_calls": session.calls}
        if evidence_check is not None:
            doc["fallback"]["evidence_check"] = evidence_check
        doc["elapsed_ms"] = round((time.perf_counter() - started) * 1000.0, 1)
        return doc


def _transport_errors() -> tuple[tuple[type[BaseException], ...],
                                  tuple[type[BaseException], ...]]:
    """(timeouts, other transport failures) of the HTTP stacks google-genai may use: httpx,
    its fork httpx2 (google-genai 3.x), or requests (its mTLS path)."""
    timeouts: list[type[BaseException]] = []
    transport: list[type[BaseException]] = []
    for module, timeout, other in (("httpx", "TimeoutException", "TransportError"),
                                   ("httpx2", "TimeoutException", "TransportError"),
                                   ("requests.exceptions", "Timeout", "ConnectionError")):
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        timeouts.append(getattr(found, timeout))
        transport.append(getattr(found, other))
    return tuple(timeouts), tuple(transport)


class _Session:
    """Counters of one investigation's model calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.usage: dict[str, int] = {"prompt_tokens": 0, "output_tokens": 0}

    def add_usage(self, response: types.GenerateContentResponse) -> None:
        meta = response.usage_metadata
        if meta is not None:
            self.usage["prompt_tokens"] += meta.prompt_token_count or 0
            self.usage["output_tokens"] += meta.candidates_token_count or 0


def function_declarations() -> list[types.FunctionDeclaration]:
    """The follow-up tools as Gemini function declarations (each takes a `purpose` too)."""
    from google.genai import types

    out = []
    for name, spec in TOOL_PARAMETERS.items():
        schema = {"type": "OBJECT", "properties": {**spec["properties"], "purpose": _PURPOSE},
                  "required": [*spec["required"], "purpose"]}
        out.append(types.FunctionDeclaration(
            name=name, description=spec["description"],
            parameters=types.Schema.model_validate(schema)))
    return out


def _content_of(response: types.GenerateContentResponse) -> types.Content:
    candidates = response.candidates or []
    if not candidates or candidates[0].content is None:
        feedback = response.prompt_feedback
        blocked = feedback.block_reason if feedback is not None else None
        finish = candidates[0].finish_reason if candidates else None
        raise GeminiUnavailable(f"the model returned no content (block reason {blocked}, "
                                f"finish reason {finish})")
    content = candidates[0].content
    if not content.role:
        content.role = "model"
    return content


def _run_call(call: types.FunctionCall, follow_ups: FollowUps) -> types.Part:
    """Run one requested follow-up through `FollowUps`; the answer is a function response."""
    from google.genai import types

    name = call.name or ""
    raw = dict(call.args or {})
    purpose = str(raw.pop("purpose", "") or f"requested by the model: {name}")
    spec = TOOL_PARAMETERS.get(name)
    response: dict[str, Any]
    if spec is None:
        response = {"error": f"unknown tool {name!r}; the follow-up tools are "
                             f"{', '.join(TOOL_PARAMETERS)}"}
    else:
        args, problems = _coerce_args(spec, raw)
        if problems:
            response = {"error": "; ".join(problems) + " (call not run, budget not spent)"}
        else:
            try:
                record = follow_ups.call(name, purpose, **args)
            except FollowUpRefused as e:
                response = {"error": f"not run: {e}"}
            else:
                response = {k: record[k] for k in ("status", "elapsed_ms", "error")
                            if k in record}
                if "data" in record:
                    response["data"] = fit(record["data"], TOOL_OUTPUT_CHARS)
                response["calls_left"] = follow_ups.remaining
    return types.Part.from_function_response(name=name, response=response)


def _coerce_args(spec: Mapping[str, Any], raw: Mapping[str, Any]
                 ) -> tuple[dict[str, Any], list[str]]:
    props: Mapping[str, Any] = spec["properties"]
    problems = [f"unknown argument {k!r}" for k in raw if k not in props]
    problems += [f"missing argument {k!r}" for k in spec["required"] if raw.get(k) in (None, "")]
    args: dict[str, Any] = {}
    for key, value in raw.items():
        kind = props.get(key, {}).get("type")
        if kind == "INTEGER":
            number = ev.number(value)
            if number is None or not number.is_integer():
                problems.append(f"argument {key!r} must be an integer")
                continue
            lo, hi = props[key].get("minimum"), props[key].get("maximum")
            args[key] = int(min(hi if hi is not None else number,
                                max(lo if lo is not None else number, number)))
        elif kind == "STRING" and key in props:
            allowed = props[key].get("enum")
            if allowed and value not in allowed:
                problems.append(f"argument {key!r} must be one of {allowed}")
                continue
            args[key] = str(value)
    return args, problems


def parse_report(response: types.GenerateContentResponse) -> dict[str, Any]:
    """The model's JSON report; GeminiUnavailable when it is not the object the schema asks."""
    content = _content_of(response)
    text = "".join(p.text for p in content.parts or [] if p.text and not p.thought).strip()
    # Models sometimes wrap JSON in a markdown fence despite the JSON response type.
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", text, re.DOTALL)
    if fenced:
        text = fenced.group(1)
    finish = response.candidates[0].finish_reason if response.candidates else None
    try:
        report = json.loads(text)
    except json.JSONDecodeError as e:
        raise GeminiUnavailable(f"malformed JSON report ({e.msg} at char {e.pos}; finish "
                                f"reason {finish}): {text[:120]!r}") from e
    if not isinstance(report, dict) or not isinstance(report.get("findings"), list):
        raise GeminiUnavailable(f"the JSON report is not an object with a findings list: "
                                f"{text[:120]!r}")
    return report


# ----------------------------------------------------------------------------- the prompt


def build_prompt(snapshot: Mapping[str, Any], triage: Triage, calls_left: int) -> str:
    """The first user turn: session, triage and a bounded digest of the health snapshot."""
    session = {k: v for k, v in (snapshot.get("session") or {}).items() if k != "path"}
    calls = (f"You may make up to {calls_left} follow-up tool calls." if calls_left > 0 else
             "No follow-up calls are available for this profile (triage verdict "
             f"{triage.status}).")
    return "\n\n".join([
        f"Session: {json.dumps(session, default=str)}",
        f"Triage verdict: {triage.status}. {calls}",
        "Reading (device, steps, hosts, metrics with unit and provenance, tool statuses):\n"
        + json.dumps(fit((triage.reading or read_session(snapshot)).to_dict(), TRIAGE_CHARS),
                     default=str),
        "Triage (metrics, checks, not_judged, hypotheses with their evidence):\n"
        + json.dumps(fit(triage.to_dict(), TRIAGE_CHARS), default=str),
        "Health snapshot digest (tool -> status and data):\n"
        + json.dumps(snapshot_digest(snapshot), default=str),
        "Form your hypotheses, test the strongest with follow-up calls where they can change a "
        "finding, then wait for the request for the final report.",
    ])


def snapshot_digest(snapshot: Mapping[str, Any], limit: int = DIGEST_CHARS) -> dict[str, Any]:
    """Each tool's status and data (or error), lists cut to their first items, within `limit`
    characters of JSON; list prefixes keep every `[i]` field path valid."""
    digest: dict[str, Any] = {}
    for name, result in (snapshot.get("tools") or {}).items():
        if not isinstance(result, Mapping):
            continue
        entry: dict[str, Any] = {"status": result.get("status")}
        if "data" in result:
            entry["data"] = fit(result["data"], TOOL_DIGEST_CHARS)
        if result.get("error"):
            entry["error"] = str(result["error"])[:300]
        digest[name] = entry
    # mldiag's own passes (the timeline, custom calls, async copies), cited by their pass
    # names; the detectors are listed above under their tool names already.
    for name, result in ev.passes(snapshot).items():
        if name.removeprefix(ev.PASS_PREFIX) not in digest and "data" in result:
            digest[name] = {"status": result.get("status"),
                            "data": fit(result["data"], TOOL_DIGEST_CHARS)}
    digest = fit(digest, limit)
    return digest


def fit(value: Any, limit: int) -> Any:
    """A copy of `value` whose JSON is at most about `limit` characters."""
    for items, chars in _SHRINK_STEPS:
        small = _shrink(value, items, chars)
        if len(json.dumps(small, default=str)) <= limit:
            return small
    return {"truncated_json": json.dumps(small, default=str)[:limit]}


def _shrink(value: Any, items: int, chars: int) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _shrink(v, items, chars) for k, v in value.items()}
    if isinstance(value, list | tuple):
        head = [_shrink(v, items, chars) for v in list(value)[:items]]
        if len(value) > items:
            head.append(f"[+{len(value) - items} more]")
        return head
    if isinstance(value, str) and len(value) > chars:
        return value[:chars] + f" [+{len(value) - chars} chars]"
    return value
