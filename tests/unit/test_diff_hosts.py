"""`mldiag diff` of two pods compares them host by host: each host's step, lateness and waits
before and after, and a straggler that appeared or went away is named in the sentence and on
diff.html."""

from __future__ import annotations

import json
import re
from pathlib import Path

from mldiag.analysis.diff.compare import build_diff
from mldiag.analysis.diff.hosts import host_diff
from mldiag.analysis.diff.sides import Side
from mldiag.analysis.report.diff import render_diff_html
from tests.helpers.html import assert_safe_document
from tests.helpers.pods import pod_hosts

GOLDENS = Path(__file__).parent / "report" / "goldens"


def _side(case: str, label: str) -> Side:
    return Side(label, json.loads((GOLDENS / case / "health_snapshot.json").read_text()),
                json.loads((GOLDENS / case / "analysis.json").read_text()))


def test_a_straggler_that_appeared_is_named_host_by_host() -> None:
    doc = build_diff(_side("planted_pod_balanced", "balanced"),
                     _side("planted_pod_straggler", "slow-input"))
    pods = doc["hosts"]
    assert [s["host"] for s in pods["stragglers"]["appeared"]] == ["host2"]
    assert pods["stragglers"]["went_away"] == [] and pods["stragglers"]["stayed"] == []
    assert doc["headline"].endswith("Straggler host2 (40.27 ms late per step) appeared.")
    first = pods["rows"][0]
    assert first["host"] == "host2" and first["on"] == "both"
    assert not first["a"]["straggler"] and first["b"]["straggler"]
    # B's own figures, and the delta from A's.
    assert first["b"]["lateness_ms"] == 40.27 and first["b"]["host_wait_ms"] == 41.177
    assert first["delta"]["lateness_ms"] == round(40.27 - first["a"]["lateness_ms"], 3)
    # The others now wait for it at the collectives.
    assert all(r["delta"]["collective_wait_ms"] > 39 for r in pods["rows"][1:])

    back = build_diff(_side("planted_pod_straggler", "slow-input"),
                      _side("planted_pod_balanced", "balanced"))
    assert [s["host"] for s in back["hosts"]["stragglers"]["went_away"]] == ["host2"]
    assert back["headline"].endswith("Straggler host2 went away.")

    page = render_diff_html(doc)
    assert_safe_document(page)
    assert '<a href="#hosts">Hosts</a>' in page
    section = page[page.index('<section id="hosts">'):].split("</section>", 1)[0]
    assert "Appeared in B</b>: straggler <span class=\"mono\">host2</span>, 40.27 ms" in section
    row = re.search(r"<tr>(.*?)</tr>", section.split("<tbody>", 1)[1])
    assert row and "straggler in B (new)" in row.group(1)
    assert "→ +40.27 ms" in row.group(1)


def test_one_side_without_hosts_adds_no_host_comparison() -> None:
    a = _side("planted_pod_straggler", "a")
    b = _side("planted_host_bound", "b")
    doc = build_diff(a, b)
    assert "hosts" not in doc and 'id="hosts"' not in render_diff_html(doc)
    assert host_diff(pod_hosts(4, 12), None) is None


def test_hosts_on_one_side_only_and_a_straggler_in_both() -> None:
    a, b = pod_hosts(4, 12, straggler=1), pod_hosts(6, 12, straggler=1)
    b["stragglers"][0]["lateness_ms_per_step"] = 10.0
    pods = host_diff(a, b)
    assert pods is not None
    assert pods["stragglers"]["appeared"] == pods["stragglers"]["went_away"] == []
    assert pods["stragglers"]["stayed"][0]["b"]["lateness_ms_per_step"] == 10.0
    new = {r["host"]: r for r in pods["rows"] if r["on"] == "B only"}
    assert set(new) == {"host4", "host5"} and new["host4"]["a"] is None
    assert new["host4"]["delta"]["step_ms"] is None
    assert pods["rows"][0]["host"] == "host1"  # the straggler of both sides first


def test_a_slower_collective_that_is_mostly_waiting_is_said_to_be_waiting() -> None:
    from mldiag.analysis.diff.explain import _waiting
    from mldiag.analysis.diff.sides import Profile, Side

    hosts = pod_hosts(4, 12)
    op = hosts["collective_split"]["ops"][0]["op"]
    side = Profile(side=Side("B", snapshot={}, analysis={"hosts": hosts}), name="B")
    late = hosts["stragglers"][0]["host"]
    assert _waiting(side, op) == f", 98% of it on B waiting for {late}, not transfer"
    assert _waiting(side, "fusion.1") == ""
    balanced = Profile(side=Side("B", snapshot={}, analysis={}), name="B")
    assert _waiting(balanced, op) == ""
