"""diff.html and the report's "What changed" section: self-contained, escaped, honest."""

from __future__ import annotations

import json
import re
from pathlib import Path

from mldiag.analysis.report.diff import render_diff_html
from mldiag.analysis.report.summary import render_summary_html
from tests.helpers.html import (
    IMG,
    IMG_ESCAPED,
    SCRIPT,
    SCRIPT_ESCAPED,
    assert_safe_document,
    hostile_diff,
)

DATA = Path(__file__).parent / "data"


def test_diff_html_is_a_safe_self_contained_page_in_the_reports_style():
    page = render_diff_html(hostile_diff(label=IMG))
    assert_safe_document(page)
    assert IMG not in page and IMG_ESCAPED in page
    assert SCRIPT not in page and SCRIPT_ESCAPED in page
    # The report's stylesheet, under the same hash-only policy.
    summary = render_summary_html({}, {})
    style = re.findall(r"<style>(.*?)</style>", page, re.S)
    assert style == re.findall(r"<style>(.*?)</style>", summary, re.S)
    assert 'content="default-src \'none\'; style-src \'sha256-' in page
    for section in ("What changed", "KPIs", "Op deltas", "HLO changes", "Kernel deltas",
                    "Findings", "Config and environment"):
        assert f"<h2>{section}</h2>" in page
    assert "layout change" in page and "<code>wrapped_copy</code>" in page
    assert "diff_sessions" in page  # where mldiag goes further than xprof's diff


def test_the_report_of_a_compared_session_starts_with_what_changed():
    snapshot = json.loads((DATA / "health_snapshot_tpu.json").read_text())
    report = json.loads((DATA / "analysis_tpu.json").read_text())
    doc = hostile_diff()
    report["regression"] = {
        "baseline": {"run": "r", "session": "before", "version": 1, "status": "OPTIMAL",
                     "why": "most recent OPTIMAL session"},
        "headline": doc["headline"], "explanation": doc["explanation"],
        "comparability": doc["comparability"], "diff_html": "diff.html"}
    page = render_summary_html(report, snapshot)
    assert page.index('id="what-changed"') < page.index('id="summary"')
    assert '<a href="#what-changed">What changed</a>' in page
    assert 'href="diff.html"' in page and "most recent OPTIMAL session" in page
    section = page[page.index('id="what-changed"'):page.index('id="summary"')]
    assert "layout change recompiled" in section


def test_a_report_without_a_baseline_says_so():
    snapshot = json.loads((DATA / "health_snapshot_tpu.json").read_text())
    report = json.loads((DATA / "analysis_tpu.json").read_text())
    report["regression"] = {"baseline": None, "reason": "No baseline to compare with: run r "
                            "has no healthy (OPTIMAL) session before this one."}
    page = render_summary_html(report, snapshot)
    section = page[page.index('id="what-changed"'):page.index('id="summary"')]
    assert "No baseline to compare with" in section and "diff.html" not in section


def test_the_what_changed_sentence_is_said_once_in_the_report():
    """An alert-triggered session's summary leads with the "what changed" sentence: the
    report's summary section does not say it again under the section that does."""
    snapshot = json.loads((DATA / "health_snapshot_tpu.json").read_text())
    report = json.loads((DATA / "analysis_tpu.json").read_text())
    headline = "Since r/before, step time rose from 10.00 to 50.00 ms (+400%)."
    report["summary"] = f"{headline} This TPU profile needs attention: 1 P0 finding(s)."
    report["regression"] = {
        "baseline": {"run": "r", "session": "before", "version": 1, "status": "OPTIMAL",
                     "why": "most recent OPTIMAL session"},
        "headline": headline, "explanation": [], "comparability": {}, "diff_html": "diff.html"}
    page = render_summary_html(report, snapshot)
    assert page.count("step time rose from 10.00 to 50.00 ms") == 1
    summary = page[page.index('id="summary"'):]
    assert "This TPU profile needs attention" in summary


def test_a_dropped_file_s_report_says_it_was_dropped_into_the_bucket():
    snapshot = json.loads((DATA / "health_snapshot_tpu.json").read_text())
    report = json.loads((DATA / "analysis_tpu.json").read_text())
    report["session"]["capture"] = {"kind": "dropped", "trigger": "manual"}
    page = render_summary_html(report, snapshot)
    assert "Capture: <b>dropped into the bucket (nothing asked for it)</b>" in page
