import pytest

from mldiag.analysis.judgement import evidence as ev

SNAP = {
    "tools": {
        "get_hlo_op_profile": {
            "status": "DATA",
            "data": {"category_summary": [
                {"category": "IDLE", "fraction_of_total_time": 0.13},
                {"category": "copy-done", "fraction_of_total_time": 0.84},
            ]},
        },
        "get_roofline_model": {"status": "NO_DATA", "data": {"reason": "CPU"}},
    }
}


def test_cite_copies_the_value_from_the_tool_output():
    item = ev.cite(SNAP, "get_hlo_op_profile",
                   "category_summary[category=copy-done].fraction_of_total_time")
    assert item == {"tool": "get_hlo_op_profile",
                    "field": "category_summary[category=copy-done].fraction_of_total_time",
                    "value": 0.84}
    assert ev.cite(SNAP, "get_hlo_op_profile", "category_summary[0].category")["value"] == "IDLE"


def test_cite_refuses_fields_that_do_not_exist():
    with pytest.raises(ev.MissingField):
        ev.cite(SNAP, "get_hlo_op_profile", "category_summary[category=all-reduce].top_op")
    with pytest.raises(ev.MissingField):
        ev.cite(SNAP, "get_roofline_model", "program.bound_by")


@pytest.mark.parametrize("raw,want", [("13.4%", 13.4), ("N/A", None), (4.35, 4.35), (None, None),
                                      ("0.00%", 0.0)])
def test_percent_parsing(raw, want):
    assert ev.percent(raw) == want
