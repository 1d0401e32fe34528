"""Pages that must stay safe with hostile strings in them: the strings, how they look
escaped, what a safe self-contained page is, and the inputs that carry them."""

from __future__ import annotations

import copy
import re
from html.parser import HTMLParser
from typing import Any

from mldiag.analysis.diff.compare import build_diff
from mldiag.analysis.diff.sides import Side
from tests.helpers.snapshots import analysis, cpu_snapshot, hlo

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
SCRIPT_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
# Jinja2 autoescape (markupsafe) writes a double quote as &#34;, as the console does.
IMG_ESCAPED = "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;"
VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "col", "area", "base", "source"}


def cpu_inputs(report: dict[str, Any], snapshot: dict[str, Any]) -> tuple[dict, dict]:
    """The report's inputs as a CPU profile gives them: no tool with data, no finding."""
    cpu_snap = copy.deepcopy(snapshot)
    for name in list(cpu_snap["tools"]):
        cpu_snap["tools"][name] = {
            "name": name,
            "status": "NO_DATA",
            "elapsed_ms": 5.0,
            "data": {"status": "NO_DATA", "message": f"{name}: nothing for CPU"},
        }
    cpu_report = copy.deepcopy(report)
    cpu_report["session"]["device_type"] = "CPU"
    cpu_report["metrics"] = {key: None for key in cpu_report["metrics"]}
    cpu_report["findings"] = []
    cpu_report["follow_ups"] = []
    cpu_report["not_judged"] = ["compute utilization: no roofline on CPU"]
    return cpu_report, cpu_snap


class TagBalance(HTMLParser):
    """The tags and attributes of a page, and its unbalanced ones."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: set[str] = set()
        self.attributes: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._record(tag, attrs)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._record(tag, attrs)

    def _record(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attributes.update(name for name, _ in attrs)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}> with open {self.stack[-3:]}")
            return
        self.stack.pop()


def assert_safe_document(page: str) -> None:
    """The page runs nothing, loads nothing and is one balanced document."""
    lowered = page.lower()
    assert "http" not in lowered.replace('<meta http-equiv="content-security-policy"', "")
    assert "<script" not in lowered
    assert "<img" not in lowered
    assert "<link" not in lowered
    assert "url(" not in lowered
    assert "@import" not in lowered
    assert lowered.count("<html") == 1 and lowered.count("</html>") == 1
    checker = TagBalance()
    checker.feed(page)
    assert checker.errors == []
    assert checker.stack == []
    assert not checker.tags & {"script", "img", "iframe", "object", "embed", "link", "image"}
    assert not {a for a in checker.attributes if a.startswith("on") or a == "src"}
    # The only links are in-page anchors.
    assert set(re.findall(r'href="([^"#]*)', page)) <= {""}


def hostile_diff(label: str = "r/before") -> dict[str, Any]:
    """The diff of two CPU sessions (a layout copy appeared), with hostile strings in a
    finding's title, a config note and, given as `label`, a side's name."""
    a = cpu_snapshot(step_ms=5.0, wait_ms=0.2, ops={"dot.1": 4.8},
                     hlo_text=hlo(["f32[64,64]{1,0}"], {"dot.1": "dot"}))
    b = cpu_snapshot(step_ms=9.2, wait_ms=0.2, ops={"dot.1": 4.9, "wrapped_copy": 4.1},
                     hlo_text=hlo(["f32[64,64]{0,1}"], {"wrapped_copy": "fusion:copy",
                                                       "dot.1": "dot"}))
    finding = {"id": "F1", "category": "layout_copy", "priority": "P0", "title": SCRIPT,
               "evidence": []}
    return build_diff(Side(label, a, analysis(a)),
                      Side("r/after", b, analysis(b, "NEEDS_ATTENTION", [finding]),
                           context={"configs": {"note": IMG}}))
