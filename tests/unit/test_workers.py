"""Collection jobs in worker processes: deadlines kill, the budget holds, the run always ends."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from mldiag.analysis.collection.workers import (
    ERROR,
    Job,
    parse_bytes,
    rss_bytes,
    run_jobs,
    worker_allocator,
)

REPO = Path(__file__).resolve().parents[2]
GiB = 1024**3


@pytest.fixture(autouse=True)
def _importable_jobs(monkeypatch):
    # The workers are fresh interpreters: let them import tests.unit.worker_jobs.
    monkeypatch.setenv("PYTHONPATH", str(REPO))


def _job(name: str, fn: str, group: str = "a", **kw) -> Job:
    return Job(name=name, group=group, runner=f"tests.unit.worker_jobs:{fn}", **kw)


def _run(jobs, budget=8 * GiB, timeout=30.0, **kw):
    return run_jobs(jobs, setup="tests.unit.worker_jobs:setup", setup_args={"x": 1},
                    budget_bytes=budget, default_timeout_s=timeout, **kw)


def test_groups_run_in_separate_processes_and_inputs_flow():
    out = _run([_job("one", "echo", "a"), _job("two", "echo", "b", after=("one",))],
               inputs_for=lambda job, done: {"after": sorted(done)})
    assert out["one"].status == out["two"].status == "DATA"
    assert out["one"].value["pid"] != out["two"].value["pid"]
    assert out["two"].value["after"] == ["one"]


def test_a_job_past_its_deadline_is_killed_and_the_rest_still_run():
    started = time.monotonic()
    out = _run([_job("slow", "sleep", timeout_s=0.5), _job("next", "echo"),
                _job("other", "echo", "b")])
    assert time.monotonic() - started < 20
    assert out["slow"].status == ERROR
    assert out["slow"].killed == "timed out after 0.5 s (worker killed)"
    # A fresh worker took the killed one's remaining job.
    assert out["next"].status == "DATA" and out["other"].status == "DATA"


def test_a_worker_over_the_memory_budget_is_killed_not_the_analysis():
    out = _run([_job("hog", "hog"), _job("after", "echo")], budget=int(0.5 * GiB))
    assert out["hog"].status == ERROR
    assert "exceeded the memory budget" in out["hog"].killed
    assert "budget 0.50 GiB" in out["hog"].killed
    assert out["after"].status == "DATA"


def test_a_job_whose_estimate_exceeds_the_budget_is_skipped_with_the_reason():
    out = _run([_job("big", "echo", memory_bytes=3 * GiB), _job("needs_big", "echo",
                after=("big",), requires=("big",)), _job("small", "echo")], budget=GiB)
    assert out["big"].skipped.startswith("skipped: needs about 3.00 GiB of memory, over the "
                                         "budget of 1.00 GiB")
    assert "needs big, which failed" in out["needs_big"].skipped
    assert out["small"].status == "DATA"


def test_jobs_wait_for_memory_rather_than_run_side_by_side_over_the_budget():
    out = _run([_job("x", "echo", "a", memory_bytes=600 * 1024**2),
                _job("y", "echo", "b", memory_bytes=600 * 1024**2)], budget=GiB)
    assert out["x"].status == out["y"].status == "DATA"


def test_a_job_waiting_for_memory_lets_a_later_ready_one_of_its_worker_go_first():
    big = 600 * 1024**2
    out = _run([_job("x", "nap", "a", memory_bytes=big),
                _job("y", "nap", "b", memory_bytes=big),
                _job("z", "nap", "b")], budget=GiB)
    assert all(out[n].status == "DATA" for n in "xyz")
    x, y, z = (out[n].value for n in "xyz")
    # Worker a's x is scheduled first; y, at the head of worker b, waits for its memory, and
    # z, behind y, ready and small, runs meanwhile.
    assert y["start"] >= x["end"]
    assert z["start"] < x["end"] and z["end"] <= y["start"] + 0.05


def test_a_crashing_worker_and_a_failing_job_are_recorded():
    out = _run([_job("crash", "crash"), _job("fail", "fail", "b"), _job("ok", "echo")])
    assert out["crash"].status == ERROR and "died (exit code 3)" in out["crash"].killed
    assert out["fail"].status == ERROR and out["fail"].value == "ValueError: bad input, line 1"
    assert out["ok"].status == "DATA"


def test_killed_workers_leave_no_process_behind():
    out = _run([_job("who", "echo"), _job("slow", "sleep", timeout_s=0.3)])
    assert out["slow"].killed
    # The worker that ran both was killed and reaped: its pid is gone.
    pid = out["who"].value["pid"]
    assert rss_bytes(pid) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_sizes_parse():
    assert parse_bytes("6G") == 6 * GiB and parse_bytes("512MiB") == 512 * 1024**2
    assert parse_bytes("1000") == 1000
    with pytest.raises(ValueError, match="not a size"):
        parse_bytes("lots")


def test_workspaces_left_by_killed_processes_are_swept(tmp_path):
    import os
    import subprocess
    import sys
    import time

    from mldiag.analysis.collection.xprof_tools import sweep_stale_roots

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    gone = tmp_path / f"mldiag-xprof-{dead.stdout.strip()}-abc"
    mine = tmp_path / f"mldiag-xprof-{os.getpid()}-def"
    old = tmp_path / "mldiag-xprof-oldstyle"
    new = tmp_path / "mldiag-xprof-newstyle"
    for d in (gone, mine, old, new):
        (d / "plugins").mkdir(parents=True)
    os.utime(old, (time.time() - 7 * 3600, time.time() - 7 * 3600))
    removed = sweep_stale_roots(tmp_path)
    assert sorted(p.name for p in removed) == sorted([gone.name, old.name])
    assert mine.is_dir() and new.is_dir() and not gone.exists() and not old.exists()


def _libs(out) -> list[str]:
    assert out["libs"].status == "DATA", out["libs"].value
    return [os.path.basename(p) for p in out["libs"].value]


def test_workers_run_with_the_installed_fast_malloc_and_this_process_keeps_its_own(
        monkeypatch):
    monkeypatch.setenv("MLDIAG_WORKER_MALLOC", "auto")
    allocator = worker_allocator()
    if allocator is None:
        pytest.skip("neither tcmalloc nor jemalloc is installed (scripts/test installs "
                    "libtcmalloc-minimal4)")
    libs = _libs(_run([_job("libs", "mapped_libs")]))
    real = os.path.realpath(allocator)  # maps name the file, not the soname's link
    assert os.path.basename(real) in libs
    with open("/proc/self/maps") as f:
        assert real not in f.read()


def test_the_fast_malloc_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("MLDIAG_WORKER_MALLOC", "off")
    assert worker_allocator() is None
    libs = _libs(_run([_job("libs", "mapped_libs")]))
    assert not [lib for lib in libs if "tcmalloc" in lib or "jemalloc" in lib]


def test_a_named_malloc_that_cannot_be_preloaded_leaves_the_worker_on_glibc(
        monkeypatch, tmp_path):
    missing = tmp_path / "libnothere.so"
    monkeypatch.setenv("MLDIAG_WORKER_MALLOC", str(missing))
    assert worker_allocator() is None  # not there: not preloaded
    not_a_library = tmp_path / "libbroken.so"
    not_a_library.write_text("not an ELF file\n")
    monkeypatch.setenv("MLDIAG_WORKER_MALLOC", str(not_a_library))
    assert worker_allocator() == str(not_a_library)
    # ld.so ignores a preload that fails (with a message on stderr): the job still runs.
    assert "libbroken.so" not in _libs(_run([_job("libs", "mapped_libs")]))


class _Elsewhere:
    """RemoteJobs: `b` is another process's (never ours), `c` ours once asked twice."""

    names = frozenset({"b", "c"})

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.polls = 0

    def take(self, name: str) -> bool:
        self.asked.append(name)
        return name == "c" and self.asked.count("c") >= 2

    def poll(self):
        from mldiag.analysis.collection.workers import Outcome

        self.polls += 1
        return [Outcome("b", "DATA", {"from": "elsewhere"}, 1.0)] if self.polls == 20 else []


def test_a_job_another_process_runs_is_waited_for_and_its_outcome_flows_on():
    remote = _Elsewhere()
    out = _run([_job("b", "echo"), _job("a", "echo"), _job("c", "echo"),
                _job("d", "echo", "b", after=("b", "c"))], remote=remote,
               inputs_for=lambda job, done: {"b": done["b"].value} if job.name == "d" else {})
    # `b` never ran here: its outcome came from elsewhere, and `d` received it.
    assert out["b"].value == {"from": "elsewhere"}
    assert out["d"].value["b"] == {"from": "elsewhere"}
    # `c` ran here once it could be taken; `a`, behind `b` in the queue, did not wait for it.
    assert out["c"].status == "DATA" and "pid" in out["c"].value
    assert out["a"].status == "DATA"
    assert "b" in remote.asked
