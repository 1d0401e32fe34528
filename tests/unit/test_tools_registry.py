"""The collection tools' registry: one spec per tool, listed once, sorted, and every table
that needs a tool's property derived from it.

Adding a tool is one spec in `registry.TOOLS` and its implementation (its jobs in `jobs.py`,
planned in `plan.plan_jobs`); these tests say what else is missing.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from mldiag.analysis.collection import collect, plan, registry
from mldiag.analysis.collection.hlo import detectors
from mldiag.analysis.collection.profile_input import ProfileSession
from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement import rules
from mldiag.analysis.report import tools as report_tools
from tests.helpers.counts import TOOL_COUNT

REPO = Path(__file__).resolve().parents[2]
NAMES = [tool.name for tool in registry.TOOLS]
# The tools whose data no `xprof` command prints: our HLO detectors, and the smart
# suggestions (xprof's `smart_suggestion` converter output). Evidence never cites these as an
# xprof command's output.
NO_XPROF_COMMAND = {*registry.DETECTORS, "get_smart_suggestions"}


def test_the_registry_is_sorted_with_each_tool_once() -> None:
    assert NAMES == sorted(NAMES)
    assert len(set(NAMES)) == len(NAMES)
    assert registry.BY_NAME == {tool.name: tool for tool in registry.TOOLS}


def test_the_snapshot_order_leaves_no_tie() -> None:
    orders = [tool.order for tool in registry.TOOLS]
    assert len(set(orders)) == len(orders)
    assert collect.COLLECTION_TOOLS == tuple(
        tool.name for tool in sorted(registry.TOOLS, key=lambda t: t.order))


def test_every_table_is_the_registry() -> None:
    order = collect.COLLECTION_TOOLS
    assert sorted(order) == NAMES
    assert list(collect.XPROF_CLI) == list(order)
    assert list(plan.TOOL_JOBS) == list(order)
    for tool in registry.TOOLS:
        assert collect.XPROF_CLI[tool.name] == (tool.xprof.argv if tool.xprof else None)
        assert plan.TOOL_JOBS[tool.name] == tool.jobs
        for job, per_byte in tool.rss_per_byte:
            assert plan.RSS_PER_BYTE[job] == per_byte
    assert ev.DETECTORS == registry.DETECTORS
    assert report_tools._DETECTORS == tuple(registry.DETECTOR_LABELS.items())


def test_each_detector_has_its_function_its_pass_and_its_category() -> None:
    assert registry.DETECTORS, "no HLO detector in the registry"
    for name in registry.DETECTORS:
        # The function of the detectors module named after the tool runs it.
        assert collect._DETECTORS[name] is getattr(detectors, name)
        assert registry.BY_NAME[name].jobs == registry.HLO_JOBS
        # Evidence cites its numbers as mldiag's pass, saying what it read.
        assert f"{ev.PASS_PREFIX}{name}" in ev.PASSES
    # Each detector raises one finding category, whose rule names it.
    assert set(rules.DETECTORS) == set(registry.DETECTORS)


def test_every_xprof_command_is_the_pinned_clis_with_its_options() -> None:
    from xprof.cli.xprof_cli import cli_main

    commands = cli_main()
    assert {t.name for t in registry.TOOLS if t.xprof is None} == NO_XPROF_COMMAND
    for tool in registry.TOOLS:
        if tool.xprof is None:
            continue
        assert tool.xprof.name in commands, f"{tool.name}: no `xprof {tool.xprof.name}`"
        params = inspect.signature(commands[tool.xprof.name]).parameters
        for option, _ in tool.xprof.options:
            assert option in params, f"{tool.name}: `xprof {tool.xprof.name}` has no --{option}"


SIZE = 64 * 1024**2


def _plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[plan.Job]]:
    """The collection's plans of one host of SIZE bytes: whole, with the copies for the
    converters, and in time windows."""
    xplane = tmp_path / "host.xplane.pb"
    with xplane.open("wb") as f:
        f.truncate(SIZE)
    session = ProfileSession(run="r", name="s", path=tmp_path, xplanes=(xplane,))
    # A TPU host with counters and Python-tracer events, as far as the plan asks.
    monkeypatch.setattr(plan, "has_counters", lambda x: True)
    monkeypatch.setattr(plan, "has_python_events", lambda x: True)
    options = {"tool_timeout_s": 60.0, "prepare_timeout_s": 60.0}
    return [plan.plan_jobs(session, reduce=False, **options),
            plan.plan_jobs(session, reduce=True, **options),
            plan.plan_jobs(session, reduce=True, windows=4, **options)]


def test_every_tool_is_planned_with_its_memory(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    plans = _plans(tmp_path, monkeypatch)
    for jobs in plans:
        planned = {j.name: j for j in jobs}
        for tool in registry.TOOLS:
            missing = [j for j in tool.jobs if j not in planned]
            assert missing == [], f"{tool.name}: jobs {missing} are not planned"
            assert all(planned[j].memory_bytes >= plan.BASE_RSS for j in tool.jobs)
            # Each tool alone plans what it needs, and nothing unknown.
            assert {j.name for j in plan.needed_jobs(jobs, [tool.name])} >= set(tool.jobs)
    for tool in registry.TOOLS:
        for key, per_byte in tool.rss_per_byte:
            job = key.removesuffix("_saved")
            assert job in tool.jobs, f"{tool.name}: {key} is the memory of none of its jobs"
            # Some plan schedules that job by this figure.
            seen = {j.memory_bytes for jobs in plans for j in jobs if j.name == job}
            assert int(plan.BASE_RSS + per_byte * SIZE) in seen, (tool.name, key, seen)
    # A tool's own memory figures never shadow the plan's shared ones.
    owned = [key for tool in registry.TOOLS for key, _ in tool.rss_per_byte]
    assert len(set(owned)) == len(owned)
    assert not set(owned) & set(plan._SHARED_RSS_PER_BYTE)


def test_an_unknown_tool_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = _plans(tmp_path, monkeypatch)[0]
    with pytest.raises(ValueError, match="unknown collection tool"):
        plan.needed_jobs(jobs, ["get_no_such_tool"])


CODE = [p for folder in ("shared", "bench", "functions", "terraform", "scripts")
        for p in sorted((REPO / folder).rglob("*")) if p.suffix in (".py", ".tf", ".j2", ".html")
        or (p.is_file() and p.parent.name == "scripts" and not p.suffix)]


def test_counts_in_the_code_are_the_registrys() -> None:
    # Code derives a count (`len(registry.TOOLS)`); prose that states one must be right.
    stated = [(str(p.relative_to(REPO)), int(m.group(1))) for p in CODE
              for m in TOOL_COUNT.finditer(p.read_text(errors="replace"))]
    assert [s for s in stated if s[1] != len(registry.TOOLS)] == []


def test_the_count_pattern_finds_counts_of_tools_only() -> None:
    found = [int(m.group(1)) for m in TOOL_COUNT.finditer(
        "runs the 15 collection tools; all 15 tools; the 15-tool snapshot; the 16 xprof "
        "tools; at most 4 tool calls; 4 follow-up tool calls; 6 follow-up tools")]
    assert found == [15, 15, 15, 16]
