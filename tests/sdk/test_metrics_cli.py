"""`mldiag metrics list|show --run R` reads what a workload recorded with metrics.record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mldiag.cli.main import main
from mldiag.sdk import machinelearning_run, metrics
from mldiag.sdk.metric_types import MetricType


@pytest.fixture
def recorded(sdk_home: Path) -> str:
    run = machinelearning_run(name="Metered Run")
    for i in range(30):
        metrics.record(MetricType.STEP_TIME, 0.1 + 0.001 * i, step=i)
        metrics.record(MetricType.LOSS, [2.0 / (i + 1), 4.0 / (i + 1)], step=i)
    metrics.record("phase", {"stage": "eval"}, step=30)
    run.close()  # writes what the background writer has not yet
    return run.name


def test_list_shows_each_metric_with_its_points_and_last_value(
        recorded: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["metrics", "list", "--run", recorded]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["METRIC", "UNIT", "POINTS", "STEPS"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["step_time"][1:5] == ["s", "30", "0..29", "1"]
    assert rows["step_time"][5] == "0.129"
    assert rows["loss"][1:4] == ["1", "30", "0..29"] and rows["loss"][5] == "0.1"
    assert rows["phase"][2:4] == ["1", "30..30"]

    assert main(["metrics", "list", "--run", recorded, "--json"]) == 0
    by_name = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert by_name["phase"]["last_value"] == {"stage": "eval"}
    assert by_name["step_time"]["hosts"] == ["h0"]


def test_show_gives_the_newest_points_of_a_metric(recorded: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["metrics", "show", "--run", recorded, "--name", "loss", "--last", "3"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[3], r[4], r[5]) for r in rows] == [("loss", "27", "0.107143"),
                                                  ("loss", "28", "0.103448"),
                                                  ("loss", "29", "0.1")]
    assert main(["metrics", "show", "--run", recorded, "--name", "step_time", "--json"]) == 0
    points = json.loads(capsys.readouterr().out)
    assert [p["step"] for p in points] == list(range(30))
    assert points[0]["labels"] == {"unit": "s"} and points[0]["host"] == "h0"


def test_bad_requests_fail_with_one_line(recorded: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["metrics", "list", "--run", "nope"]) == 1
    assert capsys.readouterr().err == "mldiag: error: unknown run 'nope'\n"
    assert main(["metrics", "show", "--run", recorded, "--last", "0"]) == 1
    assert "--last wants a positive number" in capsys.readouterr().err
    assert main(["metrics", "show", "--run", recorded, "--name", "absent"]) == 0
    assert "has no recorded absent" in capsys.readouterr().out
