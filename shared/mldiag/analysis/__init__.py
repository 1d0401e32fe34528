"""The analysis engine: collection, triage, investigation and reports.

This package's front door: the stages, the CLI, the console and the adapters import what they
use from here (`from mldiag.analysis import analyze, triage`), never from its sub-packages, so
collection/, judgement/, report/ and diff/ can move inside without touching their callers (a
test holds every module outside this package to it). Names load lazily, on first use: a
collection worker that imports one submodule does not pay for the rest.

xprof's native converters log every step at INFO level through absl; the level is read once,
when the extension loads, so the default is set here, before any xprof import. Their
errors surface to us as exceptions, which each tool result records.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# name → (module, attribute; None: the module itself). keep-sorted start
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "CATEGORIES": ("judgement.rules", "CATEGORIES"),
    "FollowUpRefused": ("judgement.followups", "FollowUpRefused"),
    "FollowUps": ("judgement.followups", "FollowUps"),
    "INSUFFICIENT_DATA": ("judgement.verdict", "INSUFFICIENT_DATA"),
    "JobsStopped": ("collection.workers", "JobsStopped"),
    "MAX_FOLLOW_UPS": ("judgement.followups", "MAX_FOLLOW_UPS"),
    "NEEDS_ATTENTION": ("judgement.triage", "NEEDS_ATTENTION"),
    "OPTIMAL": ("judgement.triage", "OPTIMAL"),
    "PRIORITIES": ("judgement.evidence_check", "PRIORITIES"),
    "PRIORITY_RULES": ("judgement.guidance", "PRIORITY_RULES"),
    "ProfileSession": ("collection.profile_input", "ProfileSession"),
    "RuleBasedInvestigator": ("judgement.investigator", "RuleBasedInvestigator"),
    "SessionReading": ("judgement.reading", "SessionReading"),
    "SessionTooLarge": ("collection.collect", "SessionTooLarge"),
    "Side": ("diff.sides", "Side"),
    "TOOLS": ("collection.registry", "TOOLS"),
    "Triage": ("judgement.model", "Triage"),
    "XSpaceScan": ("collection.xspace.scan", "XSpaceScan"),
    "after_headline": ("report.model", "after_headline"),
    "analyze": ("engine", "analyze"),
    "breakable": ("report.model", "breakable"),
    "build_analysis": ("engine", "build_analysis"),
    "build_diff": ("diff.compare", "build_diff"),
    "check_report": ("judgement.evidence_check", "check_report"),
    "collect": ("collection.collect", "collect"),
    "collect_host": ("collection.hosts.share", "collect_host"),
    "convert_windows": ("collection.hosts.window_tasks", "convert_windows"),
    "default_budget_bytes": ("collection.workers", "default_budget_bytes"),
    "evidence": ("judgement.evidence", None),
    "find_sessions": ("collection.profile_input", "find_sessions"),
    "hosts_section": ("report.hosts", "hosts_section"),
    "investigate": ("engine", "investigate"),
    "judged_over": ("judgement.verdict", "judged_over"),
    "kpi": ("diff.compare", "kpi"),
    "none_found": ("judgement.verdict", "none_found"),
    "op_stats_shards": ("collection.hosts.op_stats_shards", None),
    "parse_bytes": ("collection.workers", "parse_bytes"),
    "prose": ("report.model", "prose"),
    "read_session": ("judgement.reading", "read_session"),
    "render_diff_html": ("report.diff", "render_diff_html"),
    "render_summary_html": ("report.summary", "render_summary_html"),
    "stop_when": ("collection.workers", "stop_when"),
    "style_hash": ("report.page", "style_hash"),
    "task_windows": ("collection.hosts.window_tasks", "task_windows"),
    "triage": ("judgement.triage", "triage"),
    "validate_xplane": ("collection.profile_input", "validate_xplane"),
    "window_count": ("collection.plan", "window_count"),
    "xprof_diff": ("diff.xprof", "xprof_diff"),
}
# keep-sorted end

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    loaded = importlib.import_module(f"{__name__}.{module}")
    value = loaded if attribute is None else getattr(loaded, attribute)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    # What the lazy names are, for mypy (the import graph test leaves these out).
    from mldiag.analysis.collection.collect import SessionTooLarge as SessionTooLarge
    from mldiag.analysis.collection.collect import collect as collect
    from mldiag.analysis.collection.hosts import op_stats_shards as op_stats_shards
    from mldiag.analysis.collection.hosts.share import collect_host as collect_host
    from mldiag.analysis.collection.hosts.window_tasks import convert_windows as convert_windows
    from mldiag.analysis.collection.hosts.window_tasks import task_windows as task_windows
    from mldiag.analysis.collection.plan import window_count as window_count
    from mldiag.analysis.collection.profile_input import ProfileSession as ProfileSession
    from mldiag.analysis.collection.profile_input import find_sessions as find_sessions
    from mldiag.analysis.collection.profile_input import validate_xplane as validate_xplane
    from mldiag.analysis.collection.registry import TOOLS as TOOLS
    from mldiag.analysis.collection.workers import JobsStopped as JobsStopped
    from mldiag.analysis.collection.workers import default_budget_bytes as default_budget_bytes
    from mldiag.analysis.collection.workers import parse_bytes as parse_bytes
    from mldiag.analysis.collection.workers import stop_when as stop_when
    from mldiag.analysis.collection.xspace.scan import XSpaceScan as XSpaceScan
    from mldiag.analysis.diff.compare import build_diff as build_diff
    from mldiag.analysis.diff.compare import kpi as kpi
    from mldiag.analysis.diff.sides import Side as Side
    from mldiag.analysis.diff.xprof import xprof_diff as xprof_diff
    from mldiag.analysis.engine import analyze as analyze
    from mldiag.analysis.engine import build_analysis as build_analysis
    from mldiag.analysis.engine import investigate as investigate
    from mldiag.analysis.judgement import evidence as evidence
    from mldiag.analysis.judgement.evidence_check import PRIORITIES as PRIORITIES
    from mldiag.analysis.judgement.evidence_check import check_report as check_report
    from mldiag.analysis.judgement.followups import MAX_FOLLOW_UPS as MAX_FOLLOW_UPS
    from mldiag.analysis.judgement.followups import FollowUpRefused as FollowUpRefused
    from mldiag.analysis.judgement.followups import FollowUps as FollowUps
    from mldiag.analysis.judgement.guidance import PRIORITY_RULES as PRIORITY_RULES
    from mldiag.analysis.judgement.investigator import (
        RuleBasedInvestigator as RuleBasedInvestigator,
    )
    from mldiag.analysis.judgement.model import Triage as Triage
    from mldiag.analysis.judgement.reading import SessionReading as SessionReading
    from mldiag.analysis.judgement.reading import read_session as read_session
    from mldiag.analysis.judgement.rules import CATEGORIES as CATEGORIES
    from mldiag.analysis.judgement.triage import NEEDS_ATTENTION as NEEDS_ATTENTION
    from mldiag.analysis.judgement.triage import OPTIMAL as OPTIMAL
    from mldiag.analysis.judgement.triage import triage as triage
    from mldiag.analysis.judgement.verdict import INSUFFICIENT_DATA as INSUFFICIENT_DATA
    from mldiag.analysis.judgement.verdict import judged_over as judged_over
    from mldiag.analysis.judgement.verdict import none_found as none_found
    from mldiag.analysis.report.diff import render_diff_html as render_diff_html
    from mldiag.analysis.report.hosts import hosts_section as hosts_section
    from mldiag.analysis.report.model import after_headline as after_headline
    from mldiag.analysis.report.model import breakable as breakable
    from mldiag.analysis.report.model import prose as prose
    from mldiag.analysis.report.page import style_hash as style_hash
    from mldiag.analysis.report.summary import render_summary_html as render_summary_html
