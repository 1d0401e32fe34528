"""A follow-up tool's answer and arguments read as words in the report, never as a Python or
JSON dump (issue 35: the async-overlap result showed as `summary={'count': 2395, ...`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from mldiag.analysis.engine import _summarize_result
from mldiag.analysis.report.summary import render_summary_html

DATA = Path(__file__).parents[1] / "data"
OVERLAP = {"summary": {"count": 2395, "span_ps": 1128484756863960, "exposed_ps": 1,
                       "hidden_fraction": 0.999999, "exposed_fraction": 1e-9},
           "by_op": {"copy": {"count": 2395, "span_ps": 11}},
           "top_exposed": [{"plane": "/device:TPU:1", "name": "copy-start", "op": "copy"}],
           "concurrency": [], "thresholds": {"hidden": 0.9, "exposed": 0.1}}
DUMP = re.compile(r"[{}\[\]]|'\w+':|\"\w+\":|\bTrue\b|\bFalse\b|\bNone\b")


def test_a_tool_s_answer_reads_as_words() -> None:
    line = _summarize_result({"status": "DATA", "data": OVERLAP})
    assert not DUMP.search(line), line
    assert line.startswith("summary: count 2395, span_ps 1128484756863960")
    assert "top_exposed: 1 item(s), the first (plane /device:TPU:1" in line
    assert "concurrency: none" in line and "thresholds: hidden 0.9, exposed 0.1" in line


def test_the_report_s_follow_ups_show_no_dumps() -> None:
    snapshot = json.loads((DATA / "health_snapshot_tpu.json").read_text())
    report = json.loads((DATA / "analysis_tpu.json").read_text())
    report["follow_ups"] = [{
        "tool": "analyze_async_overlap", "args": {"top_k": 10, "strict": False},
        "purpose": "how much of each async copy is hidden", "status": "DATA",
        "elapsed_ms": 3.0, "result_summary": _summarize_result(
            {"status": "DATA", "data": OVERLAP})}]
    page = render_summary_html(report, snapshot)
    row = page[page.index("analyze_async_overlap"):]
    row = row[:row.index("</tr>")]
    text = re.sub(r"<[^>]+>", " ", row).replace("&#39;", "'").replace("&#34;", '"')
    assert not DUMP.search(text), text
    assert "top_k 10, strict no" in text
