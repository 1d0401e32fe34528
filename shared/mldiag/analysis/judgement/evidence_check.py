"""The evidence check: a finding stands only on numbers that tool outputs hold.

Any investigator's report goes through it (the model-written one of the Gemini adapter, and
the rule-based one in the tests): every cited `{tool, field}` must resolve in the snapshot's
or a follow-up's output, and the real value is copied in. mldiag's own pass outputs
(`mldiag.timeline`, the kernel table of the get_kernel_stats follow-up, the HLO excerpt of a
neighbourhood) count as tool outputs under their pass names, and their rows keep `from`. A
finding whose title, what or impact states a number that no tool output holds (up to the
rounding it is written with and the usual unit changes) is dropped.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.context import hlo_excerpt_of
from mldiag.analysis.judgement.followups import FOLLOW_UP_PASSES
from mldiag.analysis.judgement.model import Triage
from mldiag.analysis.judgement.reading import reading_of
from mldiag.analysis.judgement.rules import CATEGORIES
from mldiag.analysis.judgement.summary import ordered, summarize

PRIORITIES = ("P0", "P1", "P2")

# A number in prose: not part of an identifier (bf16, v5e, copy-done.4) nor a version string.
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?!\.\d)")


def _restated(value: float) -> list[float]:
    """`value` and the unit changes a report may apply to it: a fraction as a percentage, MiB
    as GiB and a fraction of a GiB as MiB, us or ms as ms or s, ps as ms, bytes as GiB. Each
    applies only where the magnitude makes it plausible, so the pool stays sparse enough to
    catch invented numbers."""
    out = [value]
    if value <= 1.0:
        out += [value * 100.0, value * 1024.0]  # a fraction as %, GiB as MiB
    if value >= 100.0:
        out += [value / 1024.0, value / 1e3]
    if value >= 1e6:
        out.append(value / 1e9)
    if value >= 2**20:
        out.append(value / 2**30)
    return out


def _numbers_in(text: str) -> list[tuple[float, int]]:
    """Numbers written in `text`, each with its count of decimals."""
    out = []
    for token in _NUMBER.findall(text):
        decimals = len(token.split(".", 1)[1]) if "." in token else 0
        out.append((float(token), decimals))
    return out


def _trivial(value: float, decimals: int) -> bool:
    # Counts (1 host, 2 findings, 3 steps) and "100%" carry no measured claim.
    return decimals == 0 and (value <= 10 or value == 100)


class NumberPool:
    """Every number the tool outputs and the triage hold, for checking numbers in prose."""

    def __init__(self, sources: Iterable[Any]) -> None:
        base: set[float] = set()
        for source in sources:
            _collect_numbers(source, base)
        self.values = sorted({round(r, 12) for v in base for r in _restated(v)})

    def knows(self, value: float, decimals: int) -> bool:
        """Whether `value`, as written with `decimals` decimals, rounds from a pool number."""
        if _trivial(value, decimals):
            return True
        tol = 0.5 * 10.0 ** -decimals + 1e-9 * abs(value)
        i = bisect.bisect_left(self.values, abs(value) - tol)
        return i < len(self.values) and self.values[i] <= abs(value) + tol

    def unknown_in(self, text: str) -> list[str]:
        return [_fmt(v, d) for v, d in _numbers_in(text) if not self.knows(v, d)]


def _decimals(value: float) -> int:
    """Decimals a JSON number is written with, at most 2: more digits than any tool output
    holds are judged at 2 decimals."""
    text = repr(float(value))
    if "e" in text or "." not in text:
        return 0 if float(value).is_integer() else 2
    digits = text.split(".", 1)[1].rstrip("0")
    return min(len(digits), 2)


def _fmt(value: float, decimals: int) -> str:
    return f"{value:.{decimals}f}"


def _collect_numbers(value: Any, out: set[float]) -> None:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int | float):
        if math.isfinite(value):
            out.add(abs(float(value)))
    elif isinstance(value, str):
        out.update(v for v, _ in _numbers_in(value))
    elif isinstance(value, Mapping):
        for v in value.values():
            _collect_numbers(v, out)
    elif isinstance(value, list | tuple):
        for v in value:
            _collect_numbers(v, out)


def pass_outputs(snapshot: Mapping[str, Any], records: Sequence[Mapping[str, Any]]
                 ) -> list[Any]:
    """The outputs of mldiag's own passes (the snapshot's and the follow-ups'), for a
    NumberPool: numbers the report may state like any tool output's."""
    return [p.get("data") for p in ev.passes(snapshot).values()] + [
        hlo_excerpt_of(r.get("data")) for r in records if r.get("tool") == "get_hlo_neighborhood"]


class _Outputs:
    """Tool outputs by tool name (mldiag's passes by pass name): the snapshot's first, then
    the follow-up records'."""

    def __init__(self, snapshot: Mapping[str, Any], records: Sequence[Mapping[str, Any]]):
        self.data: dict[str, list[Any]] = {}
        self.computed_from: dict[str, list[str]] = {}
        for name, result in (snapshot.get("tools") or {}).items():
            if isinstance(result, Mapping) and "data" in result and name not in ev.DETECTORS:
                self.data.setdefault(name, []).append(result["data"])
        for name, result in ev.passes(snapshot).items():
            if "data" in result:
                self.data.setdefault(name, []).append(result["data"])
                self.computed_from[name] = list(result.get("from") or ())
        for record in records:
            if "data" not in record:
                continue
            tool = str(record.get("tool"))
            self.data.setdefault(FOLLOW_UP_PASSES.get(tool, tool), []).append(record["data"])
            excerpt = hlo_excerpt_of(record["data"]) if tool == "get_hlo_neighborhood" else None
            if excerpt is not None:
                self.data.setdefault(ev.HLO_EXCERPT, []).append(excerpt)

    def resolve(self, tool: str, field: str) -> tuple[bool, Any]:
        for data in self.data.get(tool, []):
            try:
                return True, ev.lookup(data, field)
            except (ev.MissingField, ValueError):
                continue
        return False, None


def _same(stated: Any, actual: Any) -> bool:
    """Whether a cited value says what the tool output says (numbers up to stated rounding)."""
    if stated == actual:
        return True
    if isinstance(actual, Mapping | list):
        if isinstance(stated, str):
            try:
                return bool(json.loads(stated) == actual)
            except json.JSONDecodeError:
                return False
        return False
    a_text, s_text = str(actual).strip(), str(stated).strip()
    if a_text == s_text:
        return True
    a_num, s_num = ev.percent(a_text), ev.percent(s_text)
    if a_num is None or s_num is None:
        return False
    numbers = _numbers_in(s_text)
    decimals = numbers[0][1] if numbers else 0
    tol = max(0.5 * 10.0 ** -decimals, 1e-9 * abs(a_num)) * (1 + 1e-9)
    if abs(a_num - s_num) <= tol:
        return True
    # A fraction cited as a percentage ("83.59%" for 0.8359) says the same thing.
    return s_text.endswith("%") and not a_text.endswith("%") and abs(a_num * 100 - s_num) <= tol


def _brief(value: Any) -> Any:
    text = json.dumps(value, default=str)
    return value if len(text) <= 200 else text[:200] + "…"


def check_report(
    report: Mapping[str, Any], snapshot: Mapping[str, Any], triage: Triage,
    records: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str, dict[str, Any]]:
    """Check a model report against the tool outputs.

    Returns (findings, hypotheses, summary, evidence_check): see `check_findings`; the summary
    is replaced by the rule-based one when it states an untraceable number, and hypotheses
    that do are marked with `unverified_numbers`.
    """
    pool = NumberPool([snapshot.get("tools"), [r.get("data") for r in records],
                       pass_outputs(snapshot, records), triage.to_dict(),
                       snapshot.get("session")])
    findings, check = check_findings(report.get("findings") or [], snapshot, records, pool)
    hypotheses = []
    for h in report.get("hypotheses") or []:
        if not isinstance(h, Mapping):
            continue
        item = {k: h.get(k) for k in ("category", "statement", "status", "basis") if k in h}
        unknown = pool.unknown_in(f"{h.get('statement', '')} {h.get('basis', '')}")
        if unknown:
            item["unverified_numbers"] = unknown
        hypotheses.append(item)
    if "summary" not in report:
        # The rule-based investigator's: written from the final list after this check.
        return findings, hypotheses, "", check
    summary = str(report.get("summary") or "").strip()
    unknown = pool.unknown_in(summary)
    if unknown or not summary:
        check["corrected"].append({
            "finding": None, "item": "summary", "from": summary[:300],
            "to": "the rule-based summary",
            "reason": (f"states numbers not in any tool output: {', '.join(unknown)}"
                       if unknown else "empty summary")})
        summary = summarize(reading_of(triage.reading or snapshot), triage, ordered(findings))
    return findings, hypotheses, summary, check


def check_findings(
    findings: Sequence[Any], snapshot: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]], pool: NumberPool,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Keep the findings whose evidence traces to tool outputs.

    An evidence item's `field` must resolve in that tool's output (the snapshot's, or a
    follow-up's); its value is replaced by the output's value, and a value that differed is
    recorded as corrected. Items that do not resolve are removed; a finding left with no
    evidence, with a category or priority outside the fixed lists, or whose title, what or
    impact states a number that is in no tool output (up to the rounding it is written with
    and the usual unit changes) is dropped. Returns (kept findings, evidence_check).
    """
    outputs = _Outputs(snapshot, records)
    kept: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    corrected: list[dict[str, Any]] = []
    for index, raw in enumerate(findings, start=1):
        label = (str(raw.get("title") or f"finding {index}") if isinstance(raw, Mapping)
                 else f"finding {index}")
        problem, finding, fixes = _check_one(raw, outputs, pool)
        if problem is not None:
            dropped.append({"finding": label, "reason": problem})
            continue
        assert finding is not None
        corrected += [{"finding": label, **c} for c in fixes]
        kept.append({"id": f"F{len(kept) + 1}", **finding})
    return kept, {"checked": len(findings), "kept": len(kept), "dropped": dropped,
                  "corrected": corrected}


def _check_one(raw: Any, outputs: _Outputs, pool: NumberPool
               ) -> tuple[str | None, dict[str, Any] | None, list[dict[str, Any]]]:
    if not isinstance(raw, Mapping):
        return "not an object", None, []
    missing = [k for k in ("category", "priority", "title", "what", "evidence", "impact", "fix")
               if not raw.get(k)]
    if missing:
        return f"missing {', '.join(missing)}", None, []
    if raw["category"] not in CATEGORIES:
        return f"category {raw['category']!r} is not one of the fixed categories", None, []
    if raw["priority"] not in PRIORITIES:
        return f"priority {raw['priority']!r} is not P0, P1 or P2", None, []
    impact = raw["impact"] if isinstance(raw["impact"], Mapping) else {"text": str(raw["impact"])}
    value = ev.number(impact.get("value"))
    fixes: list[dict[str, Any]] = []
    evidence: list[dict[str, Any]] = []
    for item in raw["evidence"] if isinstance(raw["evidence"], list) else []:
        if not isinstance(item, Mapping) or not item.get("tool") or not item.get("field"):
            fixes.append({"item": "evidence", "from": _brief(item), "to": None,
                          "reason": "evidence item without tool and field removed"})
            continue
        tool, field = str(item["tool"]), str(item["field"])
        if tool in ev.DETECTORS:
            tool = ev.PASS_PREFIX + tool  # mldiag's detectors are cited as its passes
        found, actual = outputs.resolve(tool, field)
        if not found:
            fixes.append({"item": f"evidence {tool}.{field}", "from": _brief(item.get("value")),
                          "to": None, "reason": "field not found in the tool output; removed"})
            continue
        if not _same(item.get("value"), actual):
            fixes.append({"item": f"evidence {tool}.{field}", "from": _brief(item.get("value")),
                          "to": _brief(actual),
                          "reason": "value differs from the tool output; replaced"})
        row = {"tool": tool, "field": field, "value": actual}
        if ev.is_pass(tool):
            stated = item.get("from")
            row["from"] = (list(stated) if isinstance(stated, list) and stated else
                           outputs.computed_from.get(tool) or list(ev.PASSES.get(tool, ())))
        evidence.append(row)
    if not evidence:
        return "no evidence item resolves in the tool outputs", None, fixes
    unknown = pool.unknown_in(" ".join(str(raw.get(k, "")) for k in ("title", "what")) + " "
                              + str(impact.get("text", "")))
    if value is not None and not pool.knows(abs(value), _decimals(value)):
        unknown.append(repr(value))
    if unknown:
        return (f"states numbers found in no tool output: {', '.join(dict.fromkeys(unknown))}",
                None, fixes)
    finding = {
        "category": raw["category"], "priority": raw["priority"], "title": str(raw["title"]),
        "what": str(raw["what"]), "evidence": evidence,
        "impact": {"value": value, "unit": str(impact.get("unit") or ""),
                   "text": str(impact.get("text") or "")},
        "fix": str(raw["fix"]),
    }
    return None, finding, fixes
