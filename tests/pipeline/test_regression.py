"""The regression explanation in the pipeline: a session captured on a degradation alert is
compared with its run's baseline, and its report says what changed (or that it cannot)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mldiag.bootstrap import LocalRuntime
from mldiag.cli.main import main
from mldiag.model import ANALYZING, SessionRecord
from tests.helpers.pipeline import MakeRuntime
from tests.helpers.regression import RUN, STALLED, report, reported, session_dir


@pytest.fixture
def rt(make_runtime: MakeRuntime) -> LocalRuntime:
    runtime = make_runtime()
    runtime.state.ensure_run(RUN, discovered=False)
    return runtime


def test_an_alert_session_is_compared_with_the_most_recent_optimal_one(rt: LocalRuntime):
    reported(rt, "old-ok", "OPTIMAL", 1.0)
    reported(rt, "slow", "NEEDS_ATTENTION", 2.0)
    reported(rt, "last-ok", "OPTIMAL", 3.0)
    reported(rt, "later-ok", "OPTIMAL", 9.0)  # captured after the alert: not a baseline
    a = report(rt, "auto-1")
    block = a["regression"]
    assert block["baseline"] == {"run": RUN, "session": "last-ok", "version": 1,
                                 "status": "OPTIMAL", "why": "most recent OPTIMAL session"}
    assert block["explanation"][0]["kind"] == "host_wait"
    # The verdict summary opens with the diff's one sentence.
    assert a["summary"].startswith(f"Since {RUN}/last-ok, step time rose from 10.00 to 50.00")
    # …then says what the page's final list of findings says.
    assert "needs attention: 1 P0 and 0 P1 finding(s). Top issue (P0): Host-bound" in a[
        "summary"]
    base = Path(rt.storage.root) / session_dir("auto-1") / "analysis"
    for name in ("diff.json", "v1/diff.json", "diff.html", "v1/diff.html"):
        assert (base / name).is_file(), name
    doc = json.loads((base / "diff.json").read_text())
    assert (doc["a"]["label"], doc["b"]["label"]) == (f"{RUN}/last-ok", f"{RUN}/auto-1")
    assert doc["a"]["source"] == "stored snapshot of analysis version 1"
    assert doc["explanation"][0]["delta_ms"] == pytest.approx(39.9)
    page = (base / "summary.html").read_text()
    assert page.index('id="what-changed"') < page.index('id="summary"')
    assert "waits longer for the host" in page


def test_a_pinned_baseline_wins_and_a_missing_one_falls_back(rt: LocalRuntime):
    reported(rt, "last-ok", "OPTIMAL", 3.0)
    reported(rt, "pinned", "NEEDS_ATTENTION", 2.0)
    rt.state.set_baseline(RUN, "pinned")
    assert report(rt, "auto-1")["regression"]["baseline"]["session"] == "pinned"
    rt.state.set_baseline(RUN, "ghost")
    block = report(rt, "auto-2")["regression"]["baseline"]
    assert block["session"] == "last-ok"
    assert block["why"] == ("most recent OPTIMAL session; the pinned baseline ghost is gone")


def test_without_a_baseline_the_report_says_so(rt: LocalRuntime):
    reported(rt, "slow", "NEEDS_ATTENTION", 2.0)
    a = report(rt, "auto-1")
    assert a["regression"]["baseline"] is None
    assert "no healthy (OPTIMAL) session" in a["regression"]["reason"]
    assert f"mldiag runs set-baseline {RUN} SESSION" in a["regression"]["reason"]
    assert a["summary"].startswith("This CPU profile (1 host(s)) needs attention: 1 P0 and 0 "
                                   "P1 finding(s). Top issue (P0): Host-bound.")
    base = Path(rt.storage.root) / session_dir("auto-1") / "analysis"
    assert not (base / "diff.json").exists()
    page = (base / "summary.html").read_text()
    assert "No baseline to compare with" in page[:page.index('id="summary"')]


def test_a_manually_captured_session_is_not_compared(rt: LocalRuntime):
    reported(rt, "last-ok", "OPTIMAL", 3.0)
    assert "regression" not in report(rt, "ondemand", trigger="manual")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_cli_pins_baselines_and_diffs_stored_sessions(
        rt: LocalRuntime, capsys: pytest.CaptureFixture[str], tmp_path: Path):
    home = str(rt.services.settings.home)
    reported(rt, "ok", "OPTIMAL", 1.0)
    reported(rt, "stalled", "NEEDS_ATTENTION", 2.0, snapshot=STALLED)
    rt.state.create_session(SessionRecord(run=RUN, session="pending", state=ANALYZING))
    code, out, _ = cli(capsys, "runs", "set-baseline", RUN, "stalled", "--home", home)
    assert code == 0 and "baseline stalled (its verdict is NEEDS_ATTENTION" in out
    assert rt.state.get_run(RUN).baseline == "stalled"  # type: ignore[union-attr]
    assert "baseline: stalled" in cli(capsys, "runs", "describe", RUN, "--home", home)[1]
    for argv, message in ((["nope"], "unknown session"), (["pending"], "needs a report"),
                          ([], "pass SESSION, or --clear")):
        code, _, err = cli(capsys, "runs", "set-baseline", RUN, *argv, "--home", home)
        assert code == 1 and message in err, err
    assert cli(capsys, "runs", "set-baseline", RUN, "--clear", "--home", home)[0] == 0
    assert rt.state.get_run(RUN).baseline == ""  # type: ignore[union-attr]

    out_dir = tmp_path / "d"
    code, out, _ = cli(capsys, "diff", f"{RUN}/ok", f"{RUN}/stalled", "--out", str(out_dir),
                       "--home", home, "-q")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == f"diff  {RUN}/ok → {RUN}/stalled"
    assert lines[2].startswith("  step time 10.00 → 50.00 ms: beyond run-to-run variation")
    assert "host_wait" in lines[3] and lines[3].lstrip().startswith("1.")
    assert (out_dir / "diff.html").is_file()
    doc = json.loads((out_dir / "diff.json").read_text())
    assert set(doc) >= {"kpis", "ops", "kernels", "hlo", "findings", "config", "explanation"}
    assert set(doc["explanation"][0]) >= {"change", "delta_ms", "share_of_delta", "evidence"}
    code, out, _ = cli(capsys, "diff", f"{RUN}/ok", f"{RUN}/stalled", "--out", str(out_dir),
                       "--home", home, "--json", "-q")
    assert code == 0 and json.loads(out)["explanation"][0]["kind"] == "host_wait"
    for spec, message in ((f"{RUN}/ghost", "no session"), (f"{RUN}/pending", "no report"),
                          ("not-a-thing", "neither a path")):
        code, _, err = cli(capsys, "diff", f"{RUN}/ok", spec, "--home", home, "--out",
                           str(out_dir), "-q")
        assert code == 1 and message in err, err
