"""A large host's time windows shared by the tasks of the collect job (Cloud Run's task index
and count; locally, processes of the local job runner): the other tasks convert windows and
publish them, task 0 combines them with the rest of the collection; a task that dies leaves
its windows to task 0 once their claims lapse; published windows are reused."""

from __future__ import annotations

import html
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mldiag.analysis.collection.collect import collect
from mldiag.analysis.collection.hosts.window_tasks import convert_windows
from mldiag.messages import AnalyzeSession
from mldiag.model import REPORTED
from mldiag.stages.window_shards import StoredWindows
from tests.helpers.pipeline import RUN, SESSION, MakeRuntime, analysis_dir, object_name, wait_state
from tests.helpers.wait import wait_until

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def large_host(tpu_eight_copies: Path) -> Path:
    (xplane,) = tpu_eight_copies.glob("plugins/profile/*/*.xplane.pb")
    return xplane


def _windows(xplane: Path) -> dict[str, int]:
    # Any host is "large" here, and cut in 4 windows.
    return {"window_min_bytes": 1, "window_bytes": xplane.stat().st_size // 4 + 1}


def _op_profile(snapshot: dict[str, object]) -> object:
    return snapshot["tools"]["get_hlo_op_profile"]["data"]  # type: ignore[index]


def test_the_collect_job_s_tasks_share_a_large_host_s_windows(
        make_runtime: MakeRuntime, large_host: Path) -> None:
    rt = make_runtime(function_max_host_bytes=100_000, collect_job="local",
                      collect_job_tasks=2, **_windows(large_host))
    rt.start()
    rt.storage.write_bytes(object_name("h0"), large_host.read_bytes())
    s = wait_state(rt, REPORTED, timeout=240)
    log = (rt.services.settings.home / "collect-job.log").read_text()
    assert "Traceback" not in log
    base = analysis_dir(rt)
    snapshot = json.loads((base / "health_snapshot.json").read_text())
    collection = snapshot["collection"]
    assert snapshot["tools"]["get_xprof_overview"]["status"] == "DATA"
    assert collection["skipped"] == [] and collection["killed"] == []
    # Every window was built once, by one task or the other, and published under the version.
    by_task = collection["windows_by_task"]
    assert sorted(by_task) == ["0", "1", "2", "3"] and set(by_task.values()) <= {0, 1}
    assert 1 in by_task.values(), by_task  # task 1 claimed its share before task 0 got there
    published = sorted(p.name for p in (base / f"v{s.version}" / "windows").glob("*.json"))
    assert published == [f"window{k}.json" for k in range(4)]
    # The same figures as the windows converted in one process.
    alone = collect(large_host, tools=("get_hlo_op_profile",), **_windows(large_host))
    assert _op_profile(snapshot) == _op_profile(alone)
    # The report says who converted the windows.
    summary = html.unescape((base / "summary.html").read_text())
    counts = ", ".join(f"task {t}: {list(by_task.values()).count(t)}"
                       for t in sorted(set(by_task.values())))
    assert f"its 4 time windows were converted by the collect job's tasks ({counts})" in summary


def _exchange(rt: object, task: int) -> StoredWindows:
    """Task `task`'s view of version 1 of the session's 4 windows."""
    prefix = object_name("h0").rsplit("/", 1)[0] + "/analysis/v1/windows"
    return StoredWindows(rt.services, prefix=prefix,  # type: ignore[attr-defined]
                         claim_base=f"window:{RUN}/{SESSION}#v1", windows=4, task=task)


def test_a_dead_task_s_windows_are_taken_over_by_task_0_once_their_claims_lapse(
        make_runtime: MakeRuntime, large_host: Path) -> None:
    """Task 1 of an earlier execution published window 2; this execution's task 1 claimed
    windows 1 and 3 and died (its claims lapse after 3 s). Task 0 reuses window 2 and builds
    the others itself."""
    rt = make_runtime(in_job=True, collect_job_tasks=2, **_windows(large_host))
    earlier = _exchange(rt, 1)
    assert earlier.take(2)
    assert convert_windows(large_host, earlier, 4, [2])["done"] == {"2": "DATA"}
    earlier.close()
    for k in (1, 3):
        assert rt.state.claim(f"window:{RUN}/{SESSION}#v1/{k}of4", "a-task-that-died", 3.0,
                              time.time())
    rt.start()
    rt.storage.write_bytes(object_name("h0"), large_host.read_bytes())
    wait_state(rt, REPORTED, timeout=240)
    base = analysis_dir(rt)
    snapshot = json.loads((base / "health_snapshot.json").read_text())
    assert snapshot["collection"]["windows_by_task"] == {"0": 0, "1": 0, "2": 1, "3": 0}
    # The cut came with the published window: task 0 cut each window it took over alone.
    assert snapshot["collection"]["jobs"]["split_windows"]["elapsed_ms"] == 0.0
    assert sorted(p.name for p in (base / "v1" / "windows").glob("*.json")) == [
        f"window{k}.json" for k in range(4)]
    alone = collect(large_host, tools=("get_hlo_op_profile",), **_windows(large_host))
    assert _op_profile(snapshot) == _op_profile(alone)


def test_published_windows_are_reused_by_task_0(
        make_runtime: MakeRuntime, large_host: Path) -> None:
    """Task 0 retried after the other task published every window: it converts none again."""
    rt = make_runtime(in_job=True, collect_job_tasks=2, **_windows(large_host))
    other = _exchange(rt, 1)
    assert all(other.take(k) for k in range(4))
    done = convert_windows(large_host, other, 4, [0, 1, 2, 3])
    other.close()
    assert done["done"] == {str(k): "DATA" for k in range(4)}
    rt.start()
    rt.storage.write_bytes(object_name("h0"), large_host.read_bytes())
    wait_state(rt, REPORTED, timeout=240)
    snapshot = json.loads((analysis_dir(rt) / "health_snapshot.json").read_text())
    assert snapshot["collection"]["windows_by_task"] == {str(k): 1 for k in range(4)}
    assert snapshot["tools"]["get_xprof_overview"]["status"] == "DATA"


def test_a_task_other_than_the_first_exits_cleanly_with_nothing_to_share(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    rt = make_runtime()
    rt.storage.write_bytes(object_name("h0"), xplane_bytes)
    rt.start()
    wait_state(rt, REPORTED)
    message = AnalyzeSession(run=RUN, session=SESSION, version=1).to_json()
    env = {**rt.services.settings.to_env(), "MLDIAG_JOB_MESSAGE": message,
           "CLOUD_RUN_TASK_INDEX": "1", "CLOUD_RUN_TASK_COUNT": "3",
           "PYTHONPATH": str(REPO / "shared"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "mldiag.job"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not (analysis_dir(rt) / "v1" / "windows").exists()
    bad = subprocess.run([sys.executable, "-m", "mldiag.job"],
                         env={**env, "CLOUD_RUN_TASK_INDEX": "one"}, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "CLOUD_RUN_TASK_INDEX" in bad.stderr


def test_a_task_other_than_the_first_builds_its_share_of_a_viewer_prebuild(
        make_runtime: MakeRuntime, xplane_bytes: bytes) -> None:
    """Task 1 of a collect job given a PrebuildViewer message builds its share of the
    session's windowed hosts (here the one host, nobody holding it), with its part for task
    0's manifest; where the caches are built already, it does nothing."""
    import shutil

    from mldiag.messages import PrebuildViewer
    from mldiag.viewer_cache import MANIFEST, cache_prefix
    from mldiag.viewer_prebuild import part_name

    rt = make_runtime()
    rt.storage.write_bytes(object_name("h0"), xplane_bytes)
    rt.start()
    s = wait_state(rt, REPORTED)
    bucket = Path(rt.services.settings.home) / "bucket"
    cache = bucket / cache_prefix(s)
    wait_until((cache / MANIFEST).is_file, timeout=60, interval=0.1,
               what="the viewer prebuild's manifest")
    assert rt.wait_idle(30)
    rt.stop()
    shutil.rmtree(cache)  # as if the session had been handed to the job
    env = {**rt.services.settings.to_env(), "MLDIAG_VIEWER_MEMORY_BUDGET": "310M",
           "MLDIAG_WINDOW_BYTES": "300000",
           "MLDIAG_JOB_MESSAGE": PrebuildViewer(run=RUN, session=SESSION,
                                                version=s.version).to_json(),
           "CLOUD_RUN_TASK_INDEX": "1", "CLOUD_RUN_TASK_COUNT": "2",
           "PYTHONPATH": str(REPO / "shared"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "mldiag.job"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    part = json.loads((cache / part_name("h0")).read_text())
    assert part["windows"] >= 2 and not (cache / MANIFEST).exists()
    for k in range(part["windows"]):
        assert (cache / "plugins" / "profile" / SESSION / f"h0.window{k:02d}.SSTABLE").is_file()
    (cache / part_name("h0")).unlink()
    (cache / MANIFEST).write_text("{}")
    again = subprocess.run([sys.executable, "-m", "mldiag.job"], env=env, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert not (cache / part_name("h0")).exists()
