"""summary.html and diff.html stay what they were: each golden case's saved inputs render to
its saved page, byte for byte but for two spellings that HTML reads the same way.

The cases are the team's real fixtures, the planted JAX workloads (tests/e2e) and their
diffs, an alert-triggered report with "What changed", and the unit tests' hostile, CPU and
empty inputs; `make_goldens.py` wrote them.
"""

from __future__ import annotations

import re

import pytest

from tests.unit.report.make_goldens import GOLDENS, render_case

CASES = sorted(p.name for p in GOLDENS.iterdir() if p.is_dir())
# A line break between two tags is layout of the template, not of the page. A double quote
# may be escaped as a named or a numeric reference, and an apostrophe escaped or not (every
# attribute is in double quotes).
_BREAK_BETWEEN_TAGS = re.compile(r">[ \t]*\n\s*<")
_SPELLINGS = {"&#34;": "&quot;", "&#39;": "'", "&#x27;": "'"}


def normalized(page: str) -> str:
    page = _BREAK_BETWEEN_TAGS.sub("><", page)
    for numeric, named in _SPELLINGS.items():
        page = page.replace(numeric, named)
    return page


def test_every_kind_of_page_has_a_golden() -> None:
    assert {"fixture_tpu_inference_2", "fixture_gpu_multi_worker", "diff_fixture_tpu_gpu",
            "planted_host_bound", "diff_planted_stall", "planted_stall_what_changed",
            "unit_hostile", "diff_unit_hostile"} <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_the_page_equals_its_golden(case: str) -> None:
    name, page = render_case(GOLDENS / case)
    golden = (GOLDENS / case / name).read_text()
    assert page.endswith("\n") and not page.endswith("\n\n")
    got, want = normalized(page), normalized(golden)
    if got != want:
        at = next((i for i, (x, y) in enumerate(zip(got, want, strict=False)) if x != y),
                  min(len(got), len(want)))
        pytest.fail(f"{case}/{name} differs at {at}:\n  got  …{got[at - 150:at + 150]}…\n"
                    f"  want …{want[at - 150:at + 150]}…")


def test_the_normalisation_keeps_what_a_reader_sees() -> None:
    assert normalized("<p>a</p>\n  <p>b</p>") == "<p>a</p><p>b</p>"
    # A space between two inline tags is text: it must survive.
    assert normalized("<b>x</b> <i>y</i>") == "<b>x</b> <i>y</i>"
    assert normalized('title="&#34;"') == 'title="&quot;"'
    assert normalized("it&#39;s") == normalized("it&#x27;s") == "it's"
