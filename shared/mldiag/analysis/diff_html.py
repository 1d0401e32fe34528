"""diff.html, and the report's "What changed" section, in summary.html's style: built by
`mldiag.analysis.report.diff` on the report's templates. This module keeps the names its
callers import.

The page follows summary.html's rules: one document, one inline style block (the shared
stylesheet), inline markup only, no scripts and no network fetches, every profile-derived
string escaped, unknown values shown as "n/a".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mldiag.analysis.report.diff import render_diff_html, what_changed
from mldiag.analysis.report.page import render_fragment


def render_what_changed(regression: Mapping[str, Any]) -> str:
    """The "What changed" section at the top of an alert-triggered session's summary.html:
    the diff against the run's healthy baseline, or why there is none."""
    return render_fragment("report/macros.html", "section", what_changed(regression))


__all__ = ["render_diff_html", "render_what_changed"]
