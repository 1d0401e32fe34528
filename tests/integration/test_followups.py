"""Follow-up tools on a real trace: budget, LLO absence, HLO neighbourhoods."""

from __future__ import annotations

from pathlib import Path

import pytest

from mldiag.analysis.collection.profile_input import resolve_session
from mldiag.analysis.judgement.followups import LLO_DATA_ABSENT, FollowUpRefused, FollowUps


def test_llo_tools_answer_llo_data_absent_without_llo_lines(tpu_logdir: Path):
    with FollowUps(resolve_session(tpu_logdir)) as fu:
        load = fu.call("llo_load", "check for LLO data")
        query = fu.call("llo_query", "count LLO events", sql="SELECT COUNT(*) FROM Events")
    for rec in (load, query):
        assert rec["status"] == "NO_DATA"
        assert rec["data"]["reason"].startswith(LLO_DATA_ABSENT)


def test_events_store_loads_and_answers_sql(tpu_logdir: Path):
    from mldiag.analysis.collection.xprof_tools import XprofWorkspace
    from mldiag.analysis.judgement.followups import FollowUpRunner

    session = resolve_session(tpu_logdir)
    with XprofWorkspace(session) as ws:
        runner = FollowUpRunner(ws, session)
        info = runner.load_events_store()
        assert Path(info["path"]).is_file()
        rows = runner.query_events_store(
            "SELECT COUNT(*) AS n FROM Events WHERE hlo_op LIKE 'copy-done%'")
    assert rows[0]["n"] > 0


def test_a_follow_up_past_its_deadline_is_stopped_and_recorded(tpu_eight_copies: Path):
    with FollowUps(resolve_session(tpu_eight_copies), timeout_s=0.0) as fu:
        # Every event of the trace: a few tenths of a second, past a deadline of 0 s (the
        # fixture alone can answer before the scheduler's first look, 50 ms).
        rec = fu.call("aggregate_xplane_events", "all events", plane_regex=".*")
    assert rec["status"] == "ERROR"
    assert rec["error"] == "timed out after 0 s (worker killed)"
    assert fu.remaining == 3


def test_budget_of_four_calls_is_enforced(tpu_logdir: Path):
    with FollowUps(resolve_session(tpu_logdir)) as fu:
        for _ in range(4):
            fu.call("get_hosts", "list hosts")
        with pytest.raises(FollowUpRefused, match="budget"):
            fu.call("get_hosts", "one too many")
        with pytest.raises(FollowUpRefused, match="not a follow-up tool"):
            FollowUps(fu.session).call("get_overview", "not allowed")
    assert len(fu.records) == 4


def test_hlo_neighborhood_shows_producer_and_consumer(tpu_logdir: Path):
    with FollowUps(resolve_session(tpu_logdir)) as fu:
        rec = fu.call("get_hlo_neighborhood", "inspect", instruction_name="copy-done.4",
                      module_name="jit_f(12190760917235803885)", radius=1)
    assert rec["status"] == "DATA"
    assert "copy-start.4" in rec["data"]["text"] and "broadcast_add_fusion" in rec["data"]["text"]
