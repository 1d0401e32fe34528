"""Rendering a report page: the Jinja2 environment on the templates the console shares
(`mldiag/web/templates/`, autoescaped), the one stylesheet, and its CSP hash."""

from __future__ import annotations

import base64
import functools
import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from mldiag.analysis.report.model import breakable, prose


@functools.cache
def css() -> str:
    """The stylesheet the report inlines and the console links: `mldiag/web/static/mldiag.css`."""
    return (resources.files("mldiag.web") / "static" / "mldiag.css").read_text(encoding="utf-8")


def style_hash() -> str:
    """CSP source for the page's one <style> block: ``'sha256-<base64 digest>'``."""
    digest = hashlib.sha256(css().encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


def content_security_policy() -> str:
    """The strict policy summary.html renders under (and declares in its own <meta>)."""
    return f"default-src 'none'; style-src {style_hash()}; base-uri 'none'; form-action 'none'"


@functools.cache
def environment() -> Environment:
    env = Environment(loader=PackageLoader("mldiag.web", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["prose"] = prose
    env.filters["breakable"] = breakable
    return env


@dataclass(frozen=True)
class TocEntry:
    anchor: str
    label: str
    sub: bool = False


@dataclass(frozen=True)
class Page:
    """What every report page's base draws: its title, contents, style and policy."""

    title: str
    toc: tuple[TocEntry, ...]

    @property
    def css(self) -> Markup:
        # Our own stylesheet, verbatim: its hash in the policy must match these bytes.
        return Markup(css())

    @property
    def csp(self) -> Markup:
        # Ours, not profile data; its quotes stay as they are.
        return Markup(content_security_policy())


def render(template: str, **context: Any) -> str:
    """A whole page, ending in one newline."""
    return environment().get_template(template).render(**context).rstrip("\n") + "\n"


def render_fragment(template: str, macro: str, *args: Any) -> str:
    """One macro of a template, as HTML (a section another page embeds)."""
    module = environment().get_template(template).module
    return str(getattr(module, macro)(*args))
