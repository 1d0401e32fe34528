"""The finding categories' registry: one module per category, each listed once, in order."""

from __future__ import annotations

from pathlib import Path

from mldiag.analysis.judgement import rules
from mldiag.analysis.judgement.triage import CATEGORIES


def test_every_rule_module_is_registered_once_and_sorted() -> None:
    folder = Path(rules.__file__).parent
    modules = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))
    names = [r.__name__.rsplit(".", 1)[1] for r in rules.RULES]
    assert names == modules
    # A module is named after the category it judges.
    assert [r.CATEGORY for r in rules.RULES] == names
    assert CATEGORIES == tuple(names)


def test_raise_order_leaves_no_tie_between_rules() -> None:
    # Hypotheses of equal priority and impact keep the rules' raise order: it must be total.
    orders = [r.RAISE_ORDER for r in rules.RULES]
    assert len(set(orders)) == len(orders)


def test_detector_categories_name_their_tool() -> None:
    assert rules.DETECTORS == {
        "detect_layout_mismatch_copies": ("layout_copy", "Layout-changing copy"),
        "detect_unfused_reshapes": ("unfused_reshape", "Unfused reshape/transpose chain"),
        "detect_unnecessary_convert_reduce": (
            "convert_reduce", "Low-precision tensor converted to f32 before a reduce"),
    }
    assert list(rules.DETECTORS) == ["detect_layout_mismatch_copies", "detect_unfused_reshapes",
                                     "detect_unnecessary_convert_reduce"]
