"""summary.html's "Hosts" section for a pod: the per-host table worst first with stragglers
marked and the rest summarised, the host × step lateness map that stays one size at 256
hosts, and the lines on matching, clocks, partial pods and the collective split, every
figure analysis.json's own."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from mldiag.analysis.report import charts
from mldiag.analysis.report.hosts import SHOWN_HOSTS, hosts_section
from mldiag.analysis.report.model import Chart, Folded, Table
from mldiag.analysis.report.summary import render_summary_html
from tests.helpers.html import assert_safe_document
from tests.helpers.pods import pod_hosts

POD = Path(__file__).parent / "goldens" / "planted_pod_straggler"


def _inputs() -> tuple[dict, dict]:
    return (json.loads((POD / "analysis.json").read_text()),
            json.loads((POD / "health_snapshot.json").read_text()))


def _section(page: str) -> str:
    return page[page.index('<section id="hosts">'):].split("</section>", 1)[0]


def _cells(row_html: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row_html)]


def test_a_pod_page_shows_its_hosts_worst_first_with_the_straggler_marked() -> None:
    analysis, snapshot = _inputs()
    page = render_summary_html(analysis, snapshot)
    assert_safe_document(page)
    assert '<a href="#hosts">Hosts</a>' in page
    hosts = _section(page)
    table = hosts[hosts.index("<table>"):hosts.index("</table>")]
    rows = re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>", 1)[1])
    # host2 (input 40 ms slower) first, marked; figures as analysis.json has them.
    per_host = analysis["hosts"]["per_host"]
    assert [_cells(r)[0].split()[0] for r in rows] == [h["host"] for h in per_host]
    assert _cells(rows[0]) == ["host2 straggler", "42.23 ms", "0.26 ms", "41.18 ms",
                               "0.00 ms", "0.65 ms", "+40.27 ms"]
    assert "straggler" not in rows[1]
    assert "4 hosts" in hosts and "12 common steps matched by step number" in hosts
    assert "host2 -1.502 ms" in hosts  # the largest clock offset against host0
    assert "Every host has the same steps." in hosts
    assert "30.15 ms</b> waiting for the last host to arrive" in hosts
    assert "(97.6% waiting)" in hosts
    # The straggler's own cause and what it costs, as the pass wrote them.
    assert "pod_workload.py:35" in hosts and "2.339 ms instead of 42.419 ms" in hosts
    # The heat map: one row per host, each of the 12 steps a cell, host2's all late (red).
    svg = hosts[hosts.index('<svg class="heatmap"'):hosts.index("</svg>")]
    assert svg.count("<rect") == 4 * 12 + 1 + 11  # cells, the plot's ground, 11 swatches
    late = re.findall(r'fill="(#[0-9a-f]{6})"><title>host2, step \d+: \+[34]\d\.', svg)
    assert len(late) == 12 and len(set(late)) <= 2 and all(f.startswith("#c") for f in late)
    assert "lateness per step" in svg and "straggler threshold 2.12 ms" in svg
    assert "style=" not in page


def test_one_host_pages_have_no_hosts_section() -> None:
    analysis, snapshot = _inputs()
    del analysis["hosts"]
    page = render_summary_html(analysis, snapshot)
    assert '<section id="hosts">' not in page and 'href="#hosts"' not in page


def test_256_hosts_show_16_and_one_median_line_and_the_rest_folded() -> None:
    section = hosts_section(pod_hosts(256, 1000))
    assert section is not None
    tables = [b for b in section.blocks if isinstance(b, Table)]
    shown = tables[0]
    assert len(shown.rows) == SHOWN_HOSTS + 1
    assert shown.rows[0].cells[0].items[2].content == "straggler"  # type: ignore[union-attr]
    summary = shown.rows[-1].cells
    assert summary[0].items[0].content == "240 other hosts"  # type: ignore[union-attr]
    # The 240 others' medians: their step, their wait for the straggler, their lateness.
    assert summary[1] == "42.14 ms" and summary[4] == "40.00 ms" and summary[6] == "+0.00 ms"
    folded = next(b for b in section.blocks if isinstance(b, Folded))
    assert "240 hosts not shown above" in str(folded.summary)
    assert len(folded.blocks[0].rows) == 240  # type: ignore[union-attr]


def _label_boxes(geometry: dict, key: str, xkey: str) -> list[tuple[float, float]]:
    out = []
    for label in geometry[key]:
        width = len(label["text"]) * charts.CHAR_W
        x = float(label[xkey])
        out.append((x - width / 2, x + width / 2))
    return out


def test_the_heat_map_is_one_size_at_8_or_256_hosts_and_its_labels_never_overlap() -> None:
    small = next(b for b in hosts_section(pod_hosts(8, 12)).blocks  # type: ignore[union-attr]
                 if isinstance(b, Chart)).geometry
    big = next(b for b in hosts_section(pod_hosts(256, 1000)).blocks  # type: ignore[union-attr]
               if isinstance(b, Chart)).geometry
    # Bounded: 16 hosts and the summary row, 64 columns, whatever the pod's size.
    assert len(big["labels"]) == 17 and len(big["cells"]) == 17 * 64
    assert float(big["height"]) <= 17 * charts.HEAT_ROW_H + charts.HEAT_TOP + charts.HEAT_GAP \
        + charts.HEAT_BOTTOM
    assert big["width"] <= 900
    huge = hosts_section(pod_hosts(4096, 50_000))
    assert huge is not None
    assert float(big["height"]) == float(next(
        b for b in huge.blocks if isinstance(b, Chart)).geometry["height"])
    # Host labels one row apart, the summary row set apart and italic.
    ys = [float(label["y"]) for label in big["labels"]]
    assert min(b - a for a, b in zip(ys, ys[1:], strict=False)) >= charts.HEAT_ROW_H
    assert big["labels"][-1]["summary"] and big["labels"][-1]["text"] == "240 others (median)"
    # Step labels ("984-999") spaced so that no two overlap, and still every few columns.
    for g in (small, big):
        boxes = _label_boxes(g, "x_labels", "x")
        assert all(a[1] + 2 <= b[0] for a, b in zip(boxes, boxes[1:], strict=False))
        assert boxes[0][0] >= charts.HEAT_LABEL_W - 30 and boxes[-1][1] <= g["width"]
    assert len(small["x_labels"]) == 12 and len(big["x_labels"]) >= 8
    assert "each the mean of its steps" in big["x_title"]
    # Long host names are cut in the label, whole in its title.
    long = hosts_section(pod_hosts(4, 12, name="gke-tpu-v5e-pool-7f3c9-worker-"))
    g = next(b for b in long.blocks if isinstance(b, Chart)).geometry  # type: ignore[union-attr]
    assert all(len(label["text"]) <= charts.HEAT_LABEL_CHARS for label in g["labels"])
    # The end of the name, which tells a pod's hosts apart, is the part kept.
    assert g["labels"][0]["title"] == "gke-tpu-v5e-pool-7f3c9-worker-1"
    assert g["labels"][0]["text"] == "…e-pool-7f3c9-worker-1"


def test_the_colour_scale_keeps_jitter_pale_and_a_straggler_red() -> None:
    g = charts.heat_map(["0", "1"], [("a", [40.0, 0.2], [0.0, 0.0], False),
                                     ("b", [-0.2, -40.0], [40.0, 0.0], False)], 2.0)
    fills = [c["fill"] for c in g["cells"]]
    assert fills[0] == "#cf222e" and fills[3] == "#0969da"  # full late, full early
    assert fills[1] == fills[2] == "#ffffff"  # 0.2 ms of 40: no colour
    balanced = charts.heat_map(["0", "1"], [("a", [0.3, 1.5], [0.0, 0.0], False)], 2.1)
    # Under a 2.1 ms threshold, 0.3 ms has no colour and 1.5 ms a pale shade: the scale
    # reaches full colour at twice the threshold, not at the largest jitter.
    assert balanced["cells"][0]["fill"] == "#ffffff"
    assert balanced["cells"][1]["fill"] == charts._shade(2)
    assert balanced["legend_hi"] == "+4.20 ms late"


def test_a_partial_pod_names_its_hosts_with_other_steps() -> None:
    hosts = pod_hosts(6, 20, straggler=None)
    hosts["hosts_with_other_steps"] = ["host5"]
    hosts["step_ranges"][5] = {"host": "host5", "steps": 26, "first": 0, "last": 25}
    analysis, snapshot = _inputs()
    analysis = copy.deepcopy(analysis)
    analysis["hosts"] = hosts
    section = _section(render_summary_html(analysis, snapshot))
    assert "1 host(s) have steps the others lack" in section
    assert "host5 (26 steps, 0–25)" in section
    assert "No straggler: no host passes the test" in section
