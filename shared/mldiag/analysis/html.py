"""summary.html, the report of one analysed session: built by `mldiag.analysis.report`
(a view model drawn by the Jinja2 templates it shares with the console). This module keeps
the names its callers import."""

from __future__ import annotations

from markupsafe import Markup

from mldiag.analysis.report.model import prose
from mldiag.analysis.report.page import content_security_policy, style_hash
from mldiag.analysis.report.summary import render_summary_html


def prose_html(value: object) -> Markup:
    """A finding's text as HTML: escaped, with its `code` spans as <code> (as the report
    shows them; the console's pages use it too)."""
    return prose(value)


__all__ = ["content_security_policy", "prose_html", "render_summary_html", "style_hash"]
