"""Instrumentation is never the bottleneck: the SDK's threads and frames (its uploads, its
metrics conversion), the profiler's and JAX's traceback wrappers are told apart from the
workload's host work by collection (`collection.xspace.instrumentation`, mldiag.timeline's
`host_instrumentation`), left out of the host work the judgement names, and reported with
their time."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from mldiag.analysis.collection import jobs
from mldiag.analysis.collection.xspace.instrumentation import (
    SDK,
    SDK_THREAD_PREFIX,
    classify,
)
from mldiag.analysis.collection.xspace.scan import XSpaceScan
from mldiag.analysis.judgement import evidence as ev
from mldiag.analysis.judgement.context import Context, host_events, instrumentation_events
from mldiag.analysis.judgement.reading import read_session
from mldiag.analysis.judgement.triage import triage

SDK_ROOT = Path(__file__).resolve().parents[2] / "shared" / "mldiag" / "sdk"
MS = 10**9  # ps


def _frame(module: Path, function: str) -> str:
    """The Python tracer's name of an SDK function: `$<file>:<first line> <function>`."""
    tree = ast.parse(module.read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                and n.name == function)
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return f"${module.name}:{first} {function}"


RECORD = _frame(SDK_ROOT / "metrics.py", "record")
UPLOAD_WRITE = "$storage.py:93 write_bytes"

# (line name, [(event, start ms, duration ms), ...]): frames nest by time on their line.
Lines = list[tuple[str, list[tuple[str, float, float]]]]


def _training(user_rmtree_ms: float = 0.0) -> Lines:
    """A training thread whose 8 steps load a batch (the workload's host work) and record a
    JAX loss as an older SDK did, converting it on this thread (`__float__`); an upload
    thread of the previous session caught in the middle of its work (its `rmtree` and
    storage write are roots: the SDK frames that called them began before the trace); and a
    loader thread of the workload."""
    train: list[tuple[str, float, float]] = [("$train.py:10 main", 0.0, 100.0)]
    for i in range(8):
        t = 1.0 + 12.0 * i
        train += [("$train.py:20 load_batch", t, 4.0),
                  (RECORD, t + 5.0, 3.0),
                  ("$metrics.py:292 record_metrics", t + 5.1, 2.8),
                  ("$metrics.py:79 _number", t + 5.2, 2.6),
                  ("$array.py:338 __float__", t + 5.3, 2.4),
                  ("$traceback_util.py:190 reraise_with_filtered_traceback", t + 8.5, 2.0),
                  ("$pjit.py:263 cache_miss", t + 8.6, 0.3)]
    upload = [("$shutil.py:712 rmtree", 2.0, 10.0), ("$posix unlink", 3.0, 6.0),
              (UPLOAD_WRITE, 40.0, 10.0), ("$<unknown> write", 41.0, 9.0)]
    loader = [("$loader.py:5 produce", 0.0, 90.0), ("$time sleep", 1.0, 60.0)]
    if user_rmtree_ms:
        loader.append(("$shutil.py:712 rmtree", 70.0, user_rmtree_ms))
    return [("python", train), ("", upload), ("", loader)]


def _xplane(path: Path, lines: Lines) -> Path:
    from mldiag.sdk.xspace import XSpace

    space = XSpace()
    plane = space.planes.add(id=1, name="/host:CPU")
    ids: dict[str, int] = {}
    for n, (name, events) in enumerate(lines):
        line = plane.lines.add(id=n + 1, name=name, timestamp_ns=1_000)
        for event, start, dur in events:
            mid = ids.setdefault(event, len(ids) + 1)
            plane.event_metadata[mid].id = mid
            plane.event_metadata[mid].name = event
            line.events.add(metadata_id=mid, offset_ps=int(start * MS),
                            duration_ps=int(dur * MS))
    path.write_bytes(space.SerializeToString())
    return path


def _collected(tmp_path: Path, lines: Lines) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the host-work follow-up, its instrumentation) as the timeline pass collects them."""
    with XSpaceScan(_xplane(tmp_path / "h.xplane.pb", lines)) as scan:
        found = jobs.host_python_events(scan)
    assert found is not None
    return found["data"], found["instrumentation"]


def _context(events: dict[str, Any], measured: dict[str, Any] | None) -> Context:
    data: dict[str, Any] = {"steps_analyzed": 8, "step_time_ms_average": 12.0,
                            "compute_busy_ms_average": 4.8, "host_wait_ms_average": 7.2,
                            "host_wait_percent": 60.0, "steps_mostly_waiting": 8}
    if measured is not None:
        data["host_instrumentation"] = measured
    snapshot = {"tools": {}, "passes": {ev.TIMELINE: {"status": "DATA", "data": data}}}
    ctx = Context(snapshot, triage({"tools": {}, "session": {}}))
    ctx.results["host_events"] = {"status": "DATA", "data": events}
    return ctx


def _ms(measured: dict[str, Any], event: str) -> float:
    return next((r["instrumentation_ps"] for r in measured["by_event"] if r["event"] == event),
                0) / MS


def test_collection_tells_the_sdks_work_from_the_workloads(tmp_path: Path) -> None:
    events, measured = _collected(tmp_path, _training())
    # The older SDK's conversion on the training thread: all of it, under `metrics.record`.
    assert _ms(measured, "$array.py:338 __float__") == pytest.approx(8 * 2.4)
    assert _ms(measured, RECORD) == pytest.approx(8 * 3.0)
    # The upload caught mid-way: its thread is the SDK's, named by its storage write.
    assert _ms(measured, "$shutil.py:712 rmtree") == pytest.approx(10.0)
    assert _ms(measured, "$posix unlink") == pytest.approx(6.0)
    (thread,) = measured["threads"]
    assert "storage.py:93 write_bytes" in thread["why"] and thread["busy_ms"] == 20.0
    # The workload's own frames hold no instrumentation but what they call of it.
    assert _ms(measured, "$train.py:20 load_batch") == 0.0
    assert _ms(measured, "$time sleep") == 0.0
    assert _ms(measured, "$train.py:10 main") == pytest.approx(8 * 3.0)
    # JAX's traceback filter is instrumentation, but what it wraps (dispatch) is not.
    assert _ms(measured, "$pjit.py:263 cache_miss") == 0.0
    assert [w["event"] for w in measured["wrappers"]] == [
        "$traceback_util.py:190 reraise_with_filtered_traceback"]
    # Nothing hidden: instrumentation's own time, frame by frame.
    assert measured["instrumentation_ms"] == pytest.approx(8 * 3.0 + 20.0)
    frames = {f["event"]: f for f in measured["frames"]}
    assert frames[RECORD]["count"] == 8 and frames[RECORD]["kind"] == SDK
    assert {r["event"] for r in events["aggregates"]} >= {
        r["event"] for r in measured["by_event"]}


def test_the_sdks_upload_and_metric_conversion_are_never_the_host_work(
        tmp_path: Path) -> None:
    events, measured = _collected(tmp_path, _training())
    ctx = _context(events, measured)
    picked = [row["event"] for _, row in host_events(ctx, step_ms=12.0, steps=8)]
    assert picked == ["$train.py:20 load_batch"]
    named = instrumentation_events(ctx, step_ms=12.0, steps=8)
    assert named and RECORD.lstrip("$") in named  # named as instrumentation, not hidden
    # Without collection's classification (an older snapshot), the rmtree and the
    # `__float__` are blamed: what this change is for.
    before = [row["event"] for _, row in host_events(_context(events, None), 12.0, 8)]
    assert "$shutil.py:712 rmtree" in before and "$array.py:338 __float__" in before


def test_the_host_bound_finding_names_the_workloads_host_work_and_instrumentations_time(
        tmp_path: Path) -> None:
    from mldiag.analysis.judgement.rules import host_bound

    events, measured = _collected(tmp_path, _training())
    ctx = _context(events, measured)
    (h,) = host_bound.hypotheses(read_session(ctx.snapshot))
    f = host_bound.finding(h, ctx)
    busy, _, rest = f["what"].partition("Not counted as the cause:")
    assert "`train.py:20 load_batch`" in busy
    assert "rmtree" not in busy and "__float__" not in busy and "storage.py" not in busy
    assert "Instrumentation ran 44.0 ms of host Python time" in rest
    assert "load_batch" in f["fix"] and "rmtree" not in f["fix"]
    assert {"tool": ev.TIMELINE, "field": "host_instrumentation.instrumentation_ms",
            "value": 44.0, "from": list(ev.PASSES[ev.TIMELINE])} in f["evidence"]


def test_the_workloads_own_call_of_the_same_function_is_still_its(tmp_path: Path) -> None:
    # The loader thread removes files too: its rmtree is the workload's, the upload's is not.
    events, measured = _collected(tmp_path, _training(user_rmtree_ms=9.0))
    assert _ms(measured, "$shutil.py:712 rmtree") == pytest.approx(10.0)
    picked = [row["event"] for _, row in host_events(_context(events, measured), 12.0, 8)]
    assert "$shutil.py:712 rmtree" in picked


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and (
        getattr(n.func, "attr", None) == name or getattr(n.func, "id", None) == name)]


def _string(node: ast.expr, module: ast.Module) -> str:
    if isinstance(node, ast.Constant):
        return str(node.value)
    # A module constant (`THREAD_NAME`).
    assert isinstance(node, ast.Name), ast.dump(node)
    for stmt in module.body:
        if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == node.id for t in stmt.targets):
            assert isinstance(stmt.value, ast.Constant)
            return str(stmt.value.value)
    raise AssertionError(f"{node.id} is not a module constant")


def test_the_sdk_names_every_thread_and_each_is_known_as_its() -> None:
    found = 0
    for path in sorted(SDK_ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for call in _calls(tree, "Thread"):
            kw = {k.arg: k.value for k in call.keywords}
            assert "name" in kw, f"{path.name}:{call.lineno}: an unnamed thread"
            assert _string(kw["name"], tree).startswith(SDK_THREAD_PREFIX)
            target = kw["target"]
            func = target.attr if isinstance(target, ast.Attribute) else getattr(
                target, "id", None)
            assert func is not None
            # The thread's body is the SDK's: what it runs is instrumentation.
            kind = classify(_frame(path, func))
            assert kind is not None and kind[0] == SDK and kind[2], (path.name, func)
            found += 1
        for call in _calls(tree, "ThreadPoolExecutor"):
            kw = {k.arg: k.value for k in call.keywords}
            assert "thread_name_prefix" in kw, f"{path.name}:{call.lineno}: unnamed threads"
            assert _string(kw["thread_name_prefix"], tree).startswith(SDK_THREAD_PREFIX)
            found += 1
    assert found >= 10
    # What the upload thread runs, begun before a trace that records its callees.
    for module, func in (("run.py", "_upload_trace"), ("profiler.py", "_read_trace"),
                         ("profiler.py", "_discard")):
        kind = classify(_frame(SDK_ROOT / module, func))
        assert kind is not None and kind[0] == SDK and kind[2], func


def test_a_workloads_frame_named_like_an_sdk_function_is_the_workloads() -> None:
    # Names any module may define need the SDK's own first line.
    assert classify("$run.py:3 run") is None
    assert classify("$state.py:12 update") is None
    assert classify("$train.py:40 record") is None
    assert classify(RECORD) is not None
    assert classify("$sys setprofile") is not None  # the Python tracer's own hook


def test_the_step_function_is_the_users_frame_though_warm_up_made_its_average_long() -> None:
    """The eager step function is called once a step; a left-out warm-up step's long call
    makes its average longer than a judged step, but it does not enclose the loop: the
    host-loop fix still points at it, not at JAX's `util.py` (CI once said `util.py:183`)."""
    from mldiag.analysis.judgement.rules.host_bound import _user_frames

    events = {"aggregates": [
        {"event": "$host_loop.py:22 step", "count": 8, "total_duration_ps": 8 * 14 * MS,
         "avg_duration_ps": 14 * MS},
        {"event": "$util.py:183 check_arraylike", "count": 640, "total_duration_ps": 20 * MS,
         "avg_duration_ps": MS // 32},
        {"event": "$train.py:5 main", "count": 1, "total_duration_ps": 120 * MS,
         "avg_duration_ps": 120 * MS}]}
    assert _user_frames(_context(events, None), step_ms=12.0)[0] == "host_loop.py:22 step"
