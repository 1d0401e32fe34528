"""The XProf viewer of one session: this session alone, xprof's own data, one build at a time,
and caches keyed by the hosts' generations and the xprof version."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from mldiag import viewer as viewer_module
from mldiag import viewer_cache
from mldiag.model import XPLANE_SUFFIXES, SessionRecord, parse_object_name
from mldiag.viewer import ViewerError, Viewers, Workspace
from mldiag.viewer_cache import MANIFEST, cache_key, cache_prefix
from tests.console.conftest import HOST, Site
from tests.helpers.wait import wait_until

XP = "/runs/tpu/sessions/s1/xprof/data/plugin/profile"


def test_the_frontend_is_served_under_the_session_with_its_base_and_policy(site: Site) -> None:
    viewer = site.auth("viewer")
    r = site.client.get("/runs/tpu/sessions/s1/xprof/", headers=viewer, follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"].endswith("/xprof/data/plugin/profile/")
    index = site.client.get(f"{XP}/", headers=viewer)
    assert index.status_code == 200 and "<app></app>" in index.text
    csp = index.headers["content-security-policy"]
    assert "script-src 'self' 'sha256-" in csp and "frame-ancestors 'self'" in csp
    # A tool page reloaded by the user is the frontend's own route.
    again = site.client.get(f"{XP}/overview_page?run=s1&tag=overview_page", headers=viewer)
    assert again.status_code == 200 and "<app></app>" in again.text
    bundle = site.client.get(f"{XP}/bundle.js", headers=viewer)
    assert bundle.status_code == 200 and bundle.headers["content-type"].startswith("text/java")
    config = site.client.get(f"{XP}/config", headers=viewer).json()
    assert config["hideCaptureProfileButton"] is True


def test_every_inline_handler_the_frontend_sets_is_allowed_by_its_hash_alone(site: Site
                                                                           ) -> None:
    """The frontend's Angular templates set inline event handlers (`onload="focus();"` on
    the trace viewer's iframe, `oncontextmenu="event.preventDefault()"` on its canvas);
    chromium runs one only when the policy holds its hash under 'unsafe-hashes'."""
    viewer = site.auth("viewer")
    csp = site.client.get(f"{XP}/", headers=viewer).headers["content-security-policy"]
    script_src = next(d for d in csp.split(";") if d.strip().startswith("script-src"))
    assert "'unsafe-inline'" not in script_src and "'unsafe-hashes'" in script_src
    bundle = site.client.get(f"{XP}/bundle.js", headers=viewer).text
    handlers = {json.loads(f'"{code}"') for code in
                re.findall(r'[\[,]"on[a-z]+","((?:[^"\\]|\\.)*)"', bundle)}
    assert {"focus();", "event.preventDefault()"} <= handlers
    for code in handlers:
        digest = base64.b64encode(hashlib.sha256(code.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in script_src, code


def test_only_this_session_is_listed_and_served(site: Site) -> None:
    viewer = site.auth("viewer")
    assert site.client.get(f"{XP}/runs", headers=viewer).json() == ["s1"]
    assert site.client.get(f"{XP}/runs?run_path=/", headers=viewer).json() == ["s1"]
    hosts = site.client.get(f"{XP}/hosts?run=s1&tag=overview_page", headers=viewer).json()
    assert hosts == [{"hostname": HOST}]
    ok = site.client.get(f"{XP}/data?run=s1&tag=overview_page&host={HOST}", headers=viewer)
    assert ok.status_code == 200 and "selfTimePercent" in ok.text
    # Without a token, or with another run's, nothing of it.
    anonymous = site.client.get(f"{XP}/data?run=s1&tag=overview_page&host={HOST}")
    assert anonymous.status_code == 401 and "selfTimePercent" not in anonymous.text
    other = site.client.get(f"{XP}/data?run=s1&tag=overview_page&host={HOST}",
                            headers=site.auth("viewer_other"))
    assert other.status_code in (403, 404) and "selfTimePercent" not in other.text
    # Another run, or a directory, named in the query is ignored: still this session's data.
    for extra in ("run=../../other/plugins/profile/o1", "run=s2", "session_path=/etc",
                  "run_path=/tmp"):
        r = site.client.get(f"{XP}/data?tag=overview_page&host={HOST}&{extra}", headers=viewer)
        assert r.status_code == 200 and r.content == ok.content, extra
    for bad in ("host=../../../etc/passwd", "host=other_host", "hosts=x,y",
                "module_name=../x", "host=ALL_HOSTS&module_name=/etc/passwd"):
        r = site.client.get(f"{XP}/data?run=s1&tag=graph_viewer&{bad}", headers=viewer)
        assert r.status_code == 404, bad
    for route in ("capture_profile?service_addr=127.0.0.1:1", "generate_cache?run=s1",
                  "local", "data_csv?run=s1"):
        assert site.client.get(f"{XP}/{route}", headers=viewer).status_code == 404, route


def test_every_tool_the_frontend_offers_converts_for_the_session(site: Site) -> None:
    viewer = site.auth("viewer")
    tools = site.client.get(f"{XP}/run_tools?run=s1", headers=viewer).json()
    assert {"overview_page", "trace_viewer@", "op_profile", "roofline_model",
            "memory_profile", "framework_op_stats", "hlo_stats"} <= set(tools)
    modules = site.client.get(f"{XP}/module_list?run=s1", headers=viewer).text.split(",")
    assert modules and all(modules)
    for tool in tools:
        hosts = site.client.get(f"{XP}/hosts?run=s1&tag={tool}", headers=viewer).json()
        host = hosts[0]["hostname"] if hosts else HOST
        query = f"run=s1&tag={tool}&host={host}"
        if tool in ("graph_viewer", "memory_viewer"):
            query = f"run=s1&tag={tool}&host={modules[0]}&module_name={modules[0]}"
            if tool == "graph_viewer":
                query += "&type=graph&node_name=&graph_width=3"
        r = site.client.get(f"{XP}/data?{query}", headers=viewer)
        assert r.status_code in (200, 404), (tool, r.status_code, r.text[:200])
        if tool in ("overview_page", "trace_viewer@", "op_profile", "roofline_model",
                    "hlo_stats", "framework_op_stats"):
            assert r.status_code == 200 and len(r.content) > 100, tool


def test_a_reported_session_was_prebuilt_and_its_first_open_is_a_warm_hit(
        site: Site, tmp_path: Path) -> None:
    s = site.runtime.state.get_session("tpu", "s1")
    assert s is not None
    manifest = json.loads(site.runtime.storage.read_bytes(f"{cache_prefix(s)}/{MANIFEST}"))
    assert any(f.endswith(".SSTABLE") for f in manifest["files"])
    viewers = Viewers(site.runtime.storage, tmp_path / "cache")
    ws = viewers.workspace(s)
    calls = _count_conversions(ws)
    # The frontend's own first trace request, in a 1400 px window and a 2560 px one.
    first_trace = {"run": "s1", "tag": "trace_viewer@", "host": HOST, "hosts": HOST,
                   "replace_model": "true", "new_backend": "false"}
    for route, query in (("run_tools", {"run": "s1"}),
                         ("data", {"run": "s1", "tag": "overview_page", "host": HOST}),
                         ("data", {"run": "s1", "tag": "trace_viewer@", "host": HOST}),
                         ("data", {**first_trace, "resolution": "3240"}),
                         ("data", {**first_trace, "resolution": "5920"})):
        assert ws.answer(route, query).body
    assert calls == []  # every answer came from the prebuilt caches


def _count_conversions(ws: Any) -> list[str]:
    calls: list[str] = []
    plugin = ws.plugin
    real = plugin._xspace_to_tool_data

    def counted(paths: Any, tool: str, params: Any) -> Any:
        calls.append(tool)
        return real(paths, tool, params)

    plugin._xspace_to_tool_data = counted
    return calls


def test_eight_concurrent_first_opens_all_succeed_with_one_build(site: Site,
                                                                  tmp_path: Path) -> None:
    s = site.runtime.state.get_session("tpu", "s2")
    assert s is not None
    fresh = copy.deepcopy(s)
    # Another generation: a key with no prebuilt cache, as a session not yet prebuilt.
    fresh.hosts[HOST].generation = "not-prebuilt"
    assert cache_key(fresh) != cache_key(s)
    viewers = Viewers(site.runtime.storage, tmp_path / "cache")
    counted: list[list[str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def first_open(_: int) -> int:
        barrier.wait()
        ws = viewers.workspace(fresh)
        with lock:
            if not counted:
                counted.append(_count_conversions(ws))
        return len(ws.answer("data", {"run": "s2", "tag": "trace_viewer@", "host": HOST}).body)

    with ThreadPoolExecutor(8) as pool:
        sizes = list(pool.map(first_open, range(8)))
    assert len(set(sizes)) == 1 and sizes[0] > 1000
    assert counted[0].count("trace_viewer@") <= 1


def test_a_new_generation_or_xprof_version_gets_a_new_cache(site: Site,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    s = site.runtime.state.get_session("tpu", "s1")
    assert isinstance(s, SessionRecord)
    key = cache_key(s)
    newer = copy.deepcopy(s)
    newer.hosts[HOST].generation += "1"
    assert cache_key(newer) != key
    monkeypatch.setattr("mldiag.viewer_cache.xprof_version", lambda: "9.9.9")
    assert cache_key(s) != key


def test_large_answers_are_gzipped_once_and_served_plain_to_clients_that_cannot_take_it(
        site: Site) -> None:
    import json


    viewer = site.auth("viewer")
    url = f"{XP}/data?run=s1&tag=trace_viewer@&host={HOST}"
    zipped = site.client.get(url, headers={**viewer, "Accept-Encoding": "gzip"})
    assert zipped.status_code == 200 and zipped.headers["content-encoding"] == "gzip"
    raw = site.client.get(url, headers={**viewer, "Accept-Encoding": "identity"})
    assert "content-encoding" not in raw.headers
    assert json.loads(raw.content) == json.loads(zipped.content)  # httpx decoded the gzip
    assert len(zipped.content) == len(raw.content)  # the same document, decoded


def test_junk_query_parameters_neither_convert_again_nor_grow_the_cache(
        site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The red team's junk-parameter flood (`&x=1`, `&x=2`, ... through an anyone link):
    one conversion, one cached answer, however many junk parameters come."""
    s = site.runtime.state.get_session("tpu", "s2")
    assert s is not None
    fresh = copy.deepcopy(s)
    fresh.hosts[HOST].generation = "junk-params"
    ws = Viewers(site.runtime.storage, tmp_path / "cache").workspace(fresh)
    calls = _count_conversions(ws)
    base = {"run": "s2", "tag": "overview_page", "host": HOST}
    first = ws.answer("data", base).body
    for i in range(10):
        junk = {**base, "x": str(i), f"y{i}": "1", "use_saved_result": "false",
                "graph_width": str(i)}
        assert ws.answer("data", junk).body == first
    assert calls == ["overview_page"]
    assert len(list(ws.responses.glob("data-*.json"))) == 1
    # A parameter that does change the answer (the op profile's grouping) is kept.
    ws.answer("data", {"run": "s2", "tag": "op_profile", "host": HOST, "group_by": "program"})
    ws.answer("data", {"run": "s2", "tag": "op_profile", "host": HOST, "group_by": "category"})
    assert calls.count("op_profile") == 2
    # The answers directory is bounded: the least recently used go first.
    monkeypatch.setattr(viewer_module, "MAX_RESPONSES", 2)
    for resolution in ("1000", "2000", "3000"):
        ws.answer("data", {"run": "s2", "tag": "trace_viewer@", "host": HOST,
                           "resolution": resolution})
    assert len(list(ws.responses.glob("*.json"))) == 2
    with pytest.raises(ViewerError) as e:
        ws.answer("data", {"run": "s2", "tag": "trace_viewer@", "host": HOST,
                           "resolution": "1e9; rm"})
    assert e.value.status == 400


def test_queries_xprof_cannot_answer_are_short_4xx_without_a_traceback(site: Site) -> None:
    viewer = site.auth("viewer")
    for query in ("tag=perf_counters&names_only=1",
                  "tag=perf_counters&names_only=1&device_type=../../x",
                  f"tag=graph_viewer&host={HOST}",
                  "tag=trace_viewer@&resolution=abc"):
        r = site.client.get(f"{XP}/data?run=s1&{query}", headers=viewer)
        assert 400 <= r.status_code < 500, (query, r.status_code, r.text[:300])
        assert "Traceback" not in r.text and len(r.text) < 300, (query, r.text[:300])
        assert r.headers.get("x-content-type-options") == "nosniff", query


def test_a_session_too_large_for_the_prebuild_is_skipped_once_with_the_reason(
        site: Site) -> None:
    """A prebuild that would not fit the instance's memory is not started (the instance and
    the message's redelivery would be killed over and over): a note says why, and the first
    open converts on demand."""
    from dataclasses import replace

    from mldiag import stages
    from mldiag.messages import PrebuildViewer
    from mldiag.model import REPORTED

    reported = site.runtime.state.get_session("tpu", "s1")
    assert reported is not None and reported.state == REPORTED
    # The same session under a version whose caches were never built.
    big = copy.deepcopy(reported)
    big.hosts = {h: replace(r, generation=f"{r.generation}-big") for h, r in big.hosts.items()}
    big.version = reported.version + 2  # a version of its own: the claims are its own
    services = replace(site.runtime.services,
                       settings=replace(site.runtime.services.settings, memory_budget="16M"),
                       state=_FixedState(big, site.runtime.state))
    message = PrebuildViewer(run="tpu", session="s1", version=big.version)
    stages.prebuild_viewer(message, services)
    prefix = cache_prefix(big)
    storage = site.runtime.storage
    assert storage.stat(f"{prefix}/{MANIFEST}") is None
    note = json.loads(storage.read_bytes(f"{prefix}/{viewer_cache.SKIPPED}"))
    assert note["reason"].startswith("not prebuilt: its largest host is 0.8 MB")
    assert "over this instance's memory budget of 16.0 MiB" in note["reason"]
    assert note["needs_bytes"] > note["budget_bytes"] == 16 * 1024**2
    # Delivered again, it does nothing more.
    stages.prebuild_viewer(message, services)
    assert json.loads(storage.read_bytes(f"{prefix}/{viewer_cache.SKIPPED}")) == note


def test_a_prebuild_that_would_outlast_its_deadline_is_skipped_with_the_reason(
        site: Site) -> None:
    """In the collect job the prebuild has the task's deadline: one estimated over it is
    not started (it would be killed at the deadline, and retried), and the note says so."""
    from dataclasses import replace

    from mldiag import stages
    from mldiag.messages import PrebuildViewer
    from mldiag.viewer_prebuild import prebuild_seconds

    late = _unbuilt(site, "late")
    took = prebuild_seconds(late)
    assert 0 < took < 1
    settings = replace(site.runtime.services.settings, in_job=True, viewer_memory_budget="4G",
                       viewer_deadline_s=took / 2)
    services = replace(site.runtime.services, jobs=_Jobs(), settings=settings,
                       state=_FixedState(late, site.runtime.state))
    stages.prebuild_viewer(PrebuildViewer(run="tpu", session="s1", version=late.version),
                           services)
    prefix = cache_prefix(late)
    storage = site.runtime.storage
    assert storage.stat(f"{prefix}/{MANIFEST}") is None
    note = json.loads(storage.read_bytes(f"{prefix}/{viewer_cache.SKIPPED}"))
    assert re.fullmatch(r"not prebuilt: prebuilding its 1 hosts \(0\.00 GiB\) would take "
                        r"about 0\.\d\d s, over its deadline of 0\.\d\d s", note["reason"])
    # Within the deadline, it is built.
    settings = replace(settings, viewer_deadline_s=took * 10)
    done = _unbuilt(site, "in-time")
    services = replace(services, settings=settings, state=_FixedState(done, site.runtime.state))
    stages.prebuild_viewer(PrebuildViewer(run="tpu", session="s1", version=done.version),
                           services)
    assert storage.stat(f"{cache_prefix(done)}/{MANIFEST}") is not None


class _FixedState:
    """A state store that knows one session; claims and the rest go to `inner`."""

    def __init__(self, session: SessionRecord, inner: Any = None) -> None:
        self.session = session
        self.inner = inner

    def get_session(self, run: str, session: str) -> SessionRecord | None:
        return self.session

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _Jobs:
    """A JobRunner that records what it was asked to start."""

    def __init__(self) -> None:
        self.started: list[Any] = []

    def run(self, message: Any) -> str:
        self.started.append(message)
        return f"executions/e{len(self.started)}"


def _unbuilt(site: Site, tag: str) -> SessionRecord:
    """The reported session under a version whose caches were never built."""
    from dataclasses import replace

    reported = site.runtime.state.get_session("tpu", "s1")
    assert reported is not None
    big = copy.deepcopy(reported)
    big.hosts = {h: replace(r, generation=f"{r.generation}-{tag}") for h, r in big.hosts.items()}
    # A version of its own: the original's prebuild claim is done.
    big.version = reported.version + 1 + sum(map(ord, tag))
    return big


def test_a_session_too_large_for_the_function_s_prebuild_goes_to_the_collect_job(
        site: Site) -> None:
    """Over the function's memory, with a collect job: the job is started on the message,
    once (a redelivery finds the hand-off claimed), and nothing is written here."""
    from dataclasses import replace

    from mldiag import stages
    from mldiag.messages import PrebuildViewer

    big = _unbuilt(site, "job")
    jobs = _Jobs()
    services = replace(site.runtime.services, jobs=jobs,
                       settings=replace(site.runtime.services.settings, memory_budget="16M"),
                       state=_FixedState(big, site.runtime.state))
    message = PrebuildViewer(run="tpu", session="s1", version=big.version)
    stages.prebuild_viewer(message, services)
    stages.prebuild_viewer(message, services)
    assert jobs.started == [message]
    prefix = cache_prefix(big)
    storage = site.runtime.storage
    assert storage.stat(f"{prefix}/{MANIFEST}") is None
    assert storage.stat(f"{prefix}/{viewer_cache.SKIPPED}") is None


def test_the_collect_job_prebuilds_with_its_own_memory_or_says_why_not(site: Site) -> None:
    """In the job, the prebuild's budget is MLDIAG_VIEWER_MEMORY_BUDGET (the job's memory,
    no workers beside it): within it the caches are built; over it, skipped with the reason
    naming the job's budget."""
    from dataclasses import replace

    from mldiag import stages
    from mldiag.messages import PrebuildViewer

    storage = site.runtime.storage
    settings = replace(site.runtime.services.settings, memory_budget="16M", in_job=True,
                       viewer_memory_budget="4G")
    built = _unbuilt(site, "in-job")
    services = replace(site.runtime.services, jobs=_Jobs(), settings=settings,
                       state=_FixedState(built, site.runtime.state))
    stages.prebuild_viewer(PrebuildViewer(run="tpu", session="s1", version=built.version),
                           services)
    manifest = json.loads(storage.read_bytes(f"{cache_prefix(built)}/{MANIFEST}"))
    assert any(b.startswith("data?") and "overview_page" in b for b in manifest["built"])
    assert services.jobs.started == []  # type: ignore[union-attr]

    over = _unbuilt(site, "over-job")
    services = replace(services, settings=replace(settings, viewer_memory_budget="32M"),
                       state=_FixedState(over, site.runtime.state))
    stages.prebuild_viewer(PrebuildViewer(run="tpu", session="s1", version=over.version),
                           services)
    note = json.loads(storage.read_bytes(f"{cache_prefix(over)}/{viewer_cache.SKIPPED}"))
    assert "over the collect job's memory budget of 32.0 MiB" in note["reason"]
    assert note["budget_bytes"] == 32 * 1024**2


def test_a_host_too_large_for_the_prebuild_is_viewed_window_by_window(
        site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the prebuild's budget, the host is cut in time windows, each prebuilt as a host
    of its own (its trace warm), with the session's op_stats from the collection beside
    them: the overview shows the whole host's figures; the console fetches the windows, not
    the host. Every answer built is kept, however many (a console keeps a share of them)."""
    from dataclasses import replace

    from mldiag import stages
    from mldiag.messages import PrebuildViewer
    from mldiag.stages.analysis import op_stats_name

    storage = site.runtime.storage
    reported = site.runtime.state.get_session("tpu", "s1")
    assert reported is not None
    big = _unbuilt(site, "windows")
    storage.write_bytes(op_stats_name(big), storage.read_bytes(op_stats_name(reported)))
    settings = replace(site.runtime.services.settings, in_job=True,
                       viewer_memory_budget="310M", window_bytes=300_000)
    services = replace(site.runtime.services, jobs=_Jobs(), settings=settings,
                       state=_FixedState(big, site.runtime.state))
    sessions = {(s.run, s.session) for s in site.runtime.state.list_sessions()}
    monkeypatch.setattr(viewer_module, "MAX_RESPONSES", 2)
    stages.prebuild_viewer(PrebuildViewer(run="tpu", session="s1", version=big.version),
                           services)
    manifest = json.loads(storage.read_bytes(f"{cache_prefix(big)}/{MANIFEST}"))
    windows = manifest["view"]["windows"][HOST]
    # The windows the cache keeps in XProf's layout are not uploads: no session for them
    # (there was one, analysed, cached and seen again, without end). Each file the prebuild
    # wrote published its finalize event as it was written, and the bucket's watcher skips
    # it from then on; once the bus has taken every event, none has made a session.
    cached = storage.list(cache_prefix(big))
    # The windows and stubs are stored gzipped, under the cache's own prefix: named like no
    # profile, and under a session's analysis/ besides.
    assert [o for o in cached if o.name.endswith(".xplane.pb.gz")]
    assert not [o for o in cached if o.name.endswith(XPLANE_SUFFIXES)]
    assert all(parse_object_name(o.name.removesuffix(".gz")) is None for o in cached)
    assert all(storage.reported.get(o.name) == o.generation for o in cached)
    assert site.runtime.wait_idle(30)
    assert {(s.run, s.session) for s in site.runtime.state.list_sessions()} == sessions
    assert windows >= 2
    names = [f"{HOST}.window{k:02d}" for k in range(windows)]
    for name in names:
        assert f"plugins/profile/s1/{name}.xplane.pb" in manifest["files"]
        assert f"plugins/profile/s1/{name}.SSTABLE" in manifest["files"]
        assert any(f"host={name}" in b and "trace_viewer" in b for b in manifest["built"])
    assert "plugins/profile/s1/ALL_HOSTS.op_stats_v2.pb" in manifest["files"]
    # The overview the frontend asks for first: over all hosts (here, every window).
    assert "data?host=ALL_HOSTS&run=s1&tag=overview_page" in manifest["built"]

    # A console instance that never saw the session: every host is a window, every first
    # open a warm hit, the overview the whole host's.
    monkeypatch.setattr(viewer_module, "MAX_RESPONSES", 256)
    viewers = Viewers(storage, Path(site.home) / "fresh-viewers", memory_budget=1)
    ws = viewers.workspace(big)
    assert ws.hosts == names
    # The first open's answers are here with the workspace: the overview over ALL_HOSTS (the
    # first the prebuild built: it was trimmed away once, under 45 windows' traces).
    assert ws.cached_path("data", {"run": "s1", "tag": "overview_page",
                                   "host": "ALL_HOSTS"}).is_file()
    assert sum(f.startswith("responses/") and not f.endswith(".json")
               for f in manifest["files"]) >= len(manifest["built"])
    assert not (ws.run_dir / f"{HOST}.xplane.pb").exists()
    # The first window is fetched with the workspace; the others when a request names them.
    assert (ws.run_dir / f"{names[0]}.SSTABLE").is_file()
    stub = ws.root / "stubs" / f"{HOST}.xplane.pb"

    def stood_in(name: str) -> bool:  # the host's stub (no events) in the window's place
        return (ws.run_dir / f"{name}.xplane.pb").samefile(stub)

    assert stood_in(names[-1]) and names[-1] in ws.pending
    overview = ws.answer("data", {"run": "s1", "tag": "overview_page", "host": names[0]})
    whole = viewers.storage  # the same bucket: the original version's prebuilt overview
    original = Viewers(whole, Path(site.home) / "fresh-original").workspace(reported)
    expected = original.answer("data", {"run": "s1", "tag": "overview_page", "host": HOST})
    assert json.loads(_body(overview)) == json.loads(_body(expected))
    every = ws.answer("data", {"run": "s1", "tag": "overview_page", "host": "ALL_HOSTS"})
    assert json.loads(_body(every)) == json.loads(_body(expected))
    assert stood_in(names[-1])  # a prebuilt answer
    # The op_stats tools over ALL_HOSTS, not prebuilt: converted from the session's op_stats
    # beside the stubs, with no window fetched (a 2 GB host's are 4.6 GB with their tables),
    # and the whole host's answers.
    for tag in ("framework_op_stats", "input_pipeline_analyzer"):
        got = ws.answer("data", {"run": "s1", "tag": tag, "host": "ALL_HOSTS"})
        want = original.answer("data", {"run": "s1", "tag": tag, "host": HOST})
        assert json.loads(_body(got)) == json.loads(_body(want)), tag
    assert stood_in(names[-1]) and names[-1] in ws.pending
    trace = ws.answer("data", {"run": "s1", "tag": "trace_viewer@", "host": names[-1],
                               "resolution": "4096"})
    assert b"traceEvents" in _body(trace)
    # The window came with its prebuilt answer: served, not converted again.
    assert (ws.run_dir / f"{names[-1]}.SSTABLE").is_file()
    assert trace.body == (ws.cached_path("data", {
        "run": "s1", "tag": "trace_viewer@", "host": names[-1],
        "resolution": "4096"})).read_bytes()
    # Each window's trace was built from the window itself (the workspace held a stub of it,
    # without events, for the tool and host lists): its events are there.
    for name in names:
        first = ws.answer("data", {"run": "s1", "tag": "trace_viewer@", "host": name})
        assert json.loads(_body(first))["returnedEventsSize"] > 0, name
    zoomed = ws.answer("data", {"run": "s1", "tag": "trace_viewer@", "host": names[-1],
                                "resolution": "16384"})
    assert b"traceEvents" in _body(zoomed)
    # A console worker opening the same workspace later knows what it still lacks.
    again = Workspace(ws.root, big)
    assert again.hosts == names and names[-1] not in again.pending
    # The console's budget (1 byte here) bounds conversions of hosts viewed whole: windows
    # convert from their prebuilt traces, each within the prebuild's budget.
    hosts = ws.answer("hosts", {"run": "s1", "tag": "trace_viewer@"})
    assert [h["hostname"] for h in json.loads(_body(hosts))] == names


def _two_windowed_hosts(site: Site, tag: str) -> SessionRecord:
    """The reported session under a version of its own, with a second host (the same
    profile) and the session's op_stats: both hosts windowed under 310M and 300 kB windows."""
    from dataclasses import replace

    from mldiag.stages.analysis import op_stats_name

    reported = site.runtime.state.get_session("tpu", "s1")
    assert reported is not None
    s = _unbuilt(site, tag)
    record = s.hosts[HOST]
    s.hosts = {HOST: record, "h2": replace(record, generation=f"{record.generation}-h2")}
    storage = site.runtime.storage
    storage.write_bytes(op_stats_name(s), storage.read_bytes(op_stats_name(reported)))
    return s


def _job_task(site: Site, s: SessionRecord, task: int, tasks: int) -> Any:
    """The services of task `task` of a collect job of `tasks`, as `mldiag.job` builds them."""
    from dataclasses import replace

    settings = replace(site.runtime.services.settings, in_job=True, job_task=task,
                       collect_job_tasks=tasks, viewer_memory_budget="310M",
                       window_bytes=300_000)
    return replace(site.runtime.services, jobs=_Jobs(), settings=settings,
                   owner=f"task-{task}", state=_FixedState(s, site.runtime.state))


def test_the_collect_job_s_tasks_share_a_prebuild_s_windowed_hosts(site: Site) -> None:
    """In a job of two tasks, task 1 builds its share of the windowed hosts (one host, its
    windows and their traces, and a part naming them) and task 0 the rest, then the
    session's answers over the stubs, and the manifest: the same cache as one task builds.
    A console serves the windows task 1 built warm."""
    from mldiag import stages
    from mldiag.messages import PrebuildViewer
    from mldiag.viewer_prebuild import part_name, task_share

    storage = site.runtime.storage
    alone = _two_windowed_hosts(site, "share-alone")
    stages.prebuild_viewer(PrebuildViewer(run="tpu", session="s1", version=alone.version),
                           _job_task(site, alone, 0, 1))
    one = json.loads(storage.read_bytes(f"{cache_prefix(alone)}/{MANIFEST}"))
    assert set(one["view"]["windows"]) == {HOST, "h2"}

    shared = _two_windowed_hosts(site, "share-two")
    message = PrebuildViewer(run="tpu", session="s1", version=shared.version)
    prefix = cache_prefix(shared)
    assert task_share(one["view"]["windows"], 1, 2) == [HOST]
    # Both start at once: task 0 is on its share (h2) while task 1 builds its own.
    state = site.runtime.state
    key = f"viewer-host:tpu/s1/{cache_key(shared)}/h2"
    assert state.claim(key, "task-0", 300.0, time.time())
    stages.prebuild_viewer_share(message, _job_task(site, shared, 1, 2))
    assert storage.stat(f"{prefix}/{part_name(HOST)}") is not None
    assert storage.stat(f"{prefix}/{part_name('h2')}") is None  # held by task 0
    assert storage.stat(f"{prefix}/{MANIFEST}") is None
    state.release(key, "task-0")
    stages.prebuild_viewer(message, _job_task(site, shared, 0, 2))
    two = json.loads(storage.read_bytes(f"{prefix}/{MANIFEST}"))
    assert two["view"] == one["view"]
    assert two["files"] == one["files"]
    assert sorted(two["built"]) == sorted(one["built"])

    # Task 1's windows open warm on a console that never saw the session, with the answer
    # one task built.
    window = f"{HOST}.window01"
    query = {"run": "s1", "tag": "trace_viewer@", "host": window, "resolution": "4096"}
    ws = Viewers(storage, Path(site.home) / "share-viewers", memory_budget=1).workspace(shared)
    calls = _count_conversions(ws)
    got = ws.answer("data", query)
    assert calls == []
    expected = Viewers(storage, Path(site.home) / "share-alone-viewers").workspace(
        alone).answer("data", query)
    assert json.loads(_body(got)) == json.loads(_body(expected))


def test_task_0_builds_the_hosts_of_a_task_that_never_ran(site: Site) -> None:
    """A task that never starts (or whose claim lapses) leaves no host unbuilt: task 0 takes
    every host nobody holds. (Task 1 alone takes every host too: a task that is done with
    its share takes what nobody holds.)"""
    from mldiag import stages
    from mldiag.messages import PrebuildViewer

    s = _two_windowed_hosts(site, "share-orphan")
    # Task 1 took its host and died: its claim lapses after its lease (a second here).
    assert site.runtime.state.claim(f"viewer-host:tpu/s1/{cache_key(s)}/{HOST}", "task-1",
                                    1.0, time.time())
    stages.prebuild_viewer(PrebuildViewer(run="tpu", session="s1", version=s.version),
                           _job_task(site, s, 0, 2))
    manifest = json.loads(site.runtime.storage.read_bytes(f"{cache_prefix(s)}/{MANIFEST}"))
    assert set(manifest["view"]["windows"]) == {HOST, "h2"}
    for host, count in manifest["view"]["windows"].items():
        for k in range(count):
            assert f"plugins/profile/s1/{host}.window{k:02d}.SSTABLE" in manifest["files"]


def test_a_session_not_prebuilt_too_large_for_the_console_is_refused_before_any_fetch(
        site: Site) -> None:
    """A session not prebuilt whose host would need more memory than the console has is not
    opened: its hosts are not fetched (a 2 GB host, or dozens, would fill the console's disk
    and then be refused anyway), and the 503 says whether its prebuild is still to come or
    why it was skipped. Prebuilt, it opens, and what is not among its answers gets the 503."""
    big = _unbuilt(site, "refused")
    storage = site.runtime.storage
    root = Path(site.home) / "small-viewers"
    viewers = Viewers(storage, root, memory_budget=64 * 1024**2)
    with pytest.raises(ViewerError) as e:
        viewers.workspace(big)
    assert e.value.status == 503
    assert str(e.value) == (
        f"not opened: host {HOST} is 0.8 MB: xprof's viewer conversions need about 314.4 MiB, "
        "over this console's 64.0 MiB; the viewer's caches are being prebuilt: try again in a "
        "few minutes")
    assert not [p for p in root.rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    prefix = cache_prefix(big)
    storage.write_bytes(f"{prefix}/{viewer_cache.SKIPPED}", json.dumps(
        {"reason": "not prebuilt: over the deadline"}).encode(), content_type="application/json")
    with pytest.raises(ViewerError) as e:
        viewers.workspace(big)
    assert str(e.value) == ("not opened: the viewer's caches were not prebuilt: over the "
                            f"deadline; and host {HOST} is 0.8 MB: xprof's viewer conversions "
                            "need about 314.4 MiB, over this console's 64.0 MiB")
    # A console with the memory converts it on demand.
    roomy = Viewers(storage, Path(site.home) / "roomy-viewers", memory_budget=1024**3)
    tools = json.loads(_body(roomy.workspace(big).answer("run_tools", {"run": "s1"})))
    assert "overview_page" in tools
    # Prebuilt (an empty manifest here): it opens, and a request not among its answers is
    # refused rather than converted.
    storage.write_bytes(f"{prefix}/{MANIFEST}", json.dumps({"files": []}).encode(),
                        content_type="application/json")
    ws = viewers.workspace(big)
    with pytest.raises(ViewerError) as e:
        ws.answer("data", {"run": "s1", "tag": "trace_viewer@", "host": HOST,
                           "resolution": "4096"})
    assert e.value.status == 503
    assert f"host {HOST} is 0.8 MB" in str(e.value) and "not among its prebuilt" in str(e.value)


def test_the_session_page_says_why_the_viewer_would_not_open(site: Site) -> None:
    """The session page says it before anyone clicks "Open in XProf"; a prebuilt session, or
    one the console can convert, says nothing."""
    from dataclasses import replace

    from fastapi.testclient import TestClient

    from mldiag.console.app import create_app

    page = site.client.get("/runs/tpu/sessions/s1", headers=site.auth("viewer")).text
    assert 'data-field="viewer_note"' not in page and "Open in XProf" in page
    big = _unbuilt(site, "page")
    console = replace(site.console, viewers=Viewers(
        site.runtime.storage, Path(site.home) / "page-viewers", memory_budget=64 * 1024**2),
        plane=replace(site.console.plane, state=_FixedState(big, site.runtime.state)))
    with TestClient(create_app(console), base_url="http://127.0.0.1:8790") as client:
        page = client.get("/runs/tpu/sessions/s1", headers=site.auth("viewer")).text
        note = re.search(r'data-field="viewer_note">([^<]*)<', page)
        assert note is not None, page
        assert note.group(1).startswith(f"XProf viewer: host {HOST} is 0.8 MB")
        assert note.group(1).endswith("being prebuilt: try again in a few minutes")
        opened = client.get(f"{XP}/run_tools?run=s1", headers=site.auth("viewer"))
        assert opened.status_code == 503 and "not opened: host" in opened.text
        # "Open in XProf" leads to a page that says so, not to a frontend spinning on 503s.
        index = client.get(f"{XP}/", headers=site.auth("viewer"))
        assert index.status_code == 503 and "text/html" in index.headers["content-type"]
        assert "The XProf viewer cannot open this session. Host " in index.text
        assert "<app></app>" not in index.text
    # The console that can open it serves the frontend.
    index = site.client.get(f"{XP}/", headers=site.auth("viewer"))
    assert index.status_code == 200 and "<app></app>" in index.text


def _body(response: Any) -> bytes:
    import gzip

    body = response.body
    return bytes(gzip.decompress(body) if response.content_encoding == "gzip" else body)


def test_the_trace_span_the_frontend_asks_after_a_host_switch_is_answered(site: Site) -> None:
    """After the user picks another host, the frontend asks for the whole span in
    JavaScript's numbers: `start_time_ms=5e-324` (Number.MIN_VALUE)."""
    viewer = site.auth("viewer")
    span = "start_time_ms=5e-324&end_time_ms=67831.78656943952"
    r = site.client.get(f"{XP}/data?run=s1&tag=trace_viewer%40&host={HOST}&hosts={HOST}"
                        f"&resolution=3240&{span}", headers=viewer)
    assert r.status_code == 200 and "traceEvents" in r.text
    bad = site.client.get(f"{XP}/data?run=s1&tag=trace_viewer%40&host={HOST}"
                          "&start_time_ms=5e-32x", headers=viewer)
    assert bad.status_code == 400


def test_a_session_of_many_2_gb_hosts_is_viewed_window_by_window_one_host_at_a_time() -> None:
    """Files are memory where the prebuild runs: the windowed hosts are cut one at a time,
    and what counts is the hosts viewed whole, one host with its windows while it is cut, or
    one window with its tables. 64 hosts of 1.9 GB fit the collect job's 14 GiB; a host that
    cannot be cut beside its windows says so with the need and the budget."""
    from dataclasses import replace

    from mldiag.model import HostRecord
    from mldiag.viewer_prebuild import VIEW_WINDOW_BYTES, NotPrebuilt, view_windows

    size = 1913 * 1024**2
    session = SessionRecord(run="r", session="s", state="REPORTED", hosts={
        f"h{k:02d}": HostRecord(object_name=f"r/plugins/profile/s/h{k:02d}.xplane.pb",
                                size=size, generation="1", arrived_at=0.0)
        for k in range(64)})
    windows = view_windows(session, 14 * 1024**3)
    assert windows == {h: -(-size // VIEW_WINDOW_BYTES) for h in session.hosts}
    with pytest.raises(NotPrebuilt, match=r"cutting host h00 \(1,913 MB\) into windows needs "
                                          r"about 4\.\d+ GiB .* over the prebuild's 4\.00 GiB"):
        view_windows(session, 4 * 1024**3)
    # A small host beside them is viewed whole, and its file counts.
    small = replace(session, hosts={**session.hosts, "small": HostRecord(
        object_name="r/plugins/profile/s/small.xplane.pb", size=50 * 1024**2,
        generation="1", arrived_at=0.0)})
    assert "small" not in view_windows(small, 14 * 1024**3)


def test_a_window_that_cannot_be_fetched_back_leaves_the_others_prebuilt(site: Site) -> None:
    """A window the prebuild cannot fetch back from the bucket to build its trace: its
    queries fail (logged), the other windows' traces are built and the manifest written."""
    from mldiag.stages.analysis import op_stats_name
    from mldiag.viewer_prebuild import prebuild

    storage = site.runtime.storage
    reported = site.runtime.state.get_session("tpu", "s1")
    assert reported is not None
    big = _unbuilt(site, "unfetchable")
    storage.write_bytes(op_stats_name(big), storage.read_bytes(op_stats_name(reported)))
    fetched: list[str] = []

    class Flaky:
        def __getattr__(self, name: str) -> Any:
            return getattr(storage, name)

        def fetch_to(self, name: str, path: Path) -> None:
            fetched.append(name)
            if name.endswith(f"{HOST}.window00.xplane.pb.gz"):
                raise OSError("the bucket is unreachable")
            storage.fetch_to(name, path)

    manifest = prebuild(big, Flaky(), budget_bytes=310 * 1024**2,  # type: ignore[arg-type]
                        op_stats_name=op_stats_name(big), window_bytes=300_000)
    assert any(n.endswith(f"{HOST}.window00.xplane.pb.gz") for n in fetched)
    built = [b for b in manifest["built"] if "trace_viewer" in b]
    assert not any(f"host={HOST}.window00" in b for b in built)
    assert any(f"host={HOST}.window01" in b for b in built)
    assert "data?host=ALL_HOSTS&run=s1&tag=overview_page" in manifest["built"]


def test_an_expired_cache_is_rebuilt_on_demand_and_the_page_says_so_meanwhile(
        site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bucket's lifecycle deletes a cache (terraform `viewer_cache_retention_days`): the
    next open asks the pipeline to rebuild it, the page says so until it is there, then the
    viewer opens on it. A cache expired in part (a file its manifest lists is gone) too."""
    import shutil as sh

    viewer = site.auth("viewer")
    s = site.runtime.state.get_session("tpu", "s1")
    assert s is not None
    root = site.home / "bucket" / cache_prefix(s)
    monkeypatch.setattr(viewer_cache, "EXPIRED_AFTER_S", 0.0)
    monkeypatch.setattr(viewer_module, "REBUILD_ASK_S", 0.0)
    for expire in ("whole", "in part"):
        if expire == "whole":
            sh.rmtree(root)
        else:
            next(root.rglob("*.SSTABLE")).unlink()
        # No workspace of this cache left open in the console (as after a restart).
        site.console.viewers.lost(s, viewer_cache.CacheExpired(expire))
        data = site.client.get(f"{XP}/data?run=s1&tag=overview_page&host={HOST}",
                               headers=viewer)
        page = site.client.get(f"{XP}/", headers=viewer)
        assert page.status_code == 503 and data.status_code == 503, expire
        assert "Rebuilding the viewer cache (expired)…" in page.text, expire
        assert page.headers["refresh"] == "15"
        assert "rebuilding the viewer cache (expired)" in data.json()["detail"]
        wait_until(lambda: not viewer_cache.lacks_files(site.runtime.storage, cache_prefix(s)),
                   timeout=120, what=f"the cache expired {expire} rebuilt")
        assert site.runtime.wait_idle(30)
        assert site.client.get(f"{XP}/", headers=viewer).status_code == 200
        ws = site.console.viewers.workspace(s)
        calls = _count_conversions(ws)
        ok = site.client.get(f"{XP}/data?run=s1&tag=overview_page&host={HOST}",
                             headers=viewer)
        assert ok.status_code == 200 and "selfTimePercent" in ok.text
        assert calls == [], expire  # served from the rebuilt cache


def test_a_rebuild_the_pipeline_never_does_falls_back_to_a_conversion_here(
        site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked for every REBUILD_ASK_S, given up after REBUILD_GIVE_UP_S: then the session
    opens as one never prebuilt (converted here, within the console's budget)."""
    s = _unbuilt(site, "never-rebuilt")
    s.state = "REPORTED"
    asked: list[str] = []
    now = [s.timings.get("REPORTED", s.updated_at) + viewer_cache.EXPIRED_AFTER_S + 1]
    viewers = Viewers(site.runtime.storage, tmp_path / "cache",
                      rebuild=lambda x: asked.append(x.session), clock=lambda: now[0])
    for _ in range(2):
        with pytest.raises(ViewerError, match="rebuilding the viewer cache") as e:
            viewers.workspace(s)
        assert e.value.status == 503
    assert asked == ["s1"]  # once per REBUILD_ASK_S
    now[0] += viewer_module.REBUILD_ASK_S + 1
    with pytest.raises(ViewerError, match="rebuilding"):
        viewers.workspace(s)
    assert asked == ["s1", "s1"]
    now[0] += viewer_module.REBUILD_GIVE_UP_S
    ws = viewers.workspace(s)
    assert ws.answer("run_tools", {"run": "s1"}).body
    assert asked == ["s1", "s1"]


def test_a_cache_object_that_is_not_gzip_or_unzips_too_far_is_refused(tmp_path: Path) -> None:
    from mldiag.adapters.local.storage import LocalDirStorage

    storage = LocalDirStorage(tmp_path / "bucket")
    rel = "plugins/profile/s/h.window00.xplane.pb"
    src = tmp_path / "w.xplane.pb"
    src.write_bytes(b"\0" * 4096)
    viewer_cache.put(storage, "p", rel, src)
    assert storage.stat(f"p/{rel}.gz") is not None and storage.stat(f"p/{rel}") is None
    viewer_cache.fetch(storage, "p", rel, tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == src.read_bytes()
    with pytest.raises(viewer_cache.CacheExpired, match="unzips past"):
        viewer_cache.fetch(storage, "p", rel, tmp_path / "bomb", max_bytes=1024)
    assert not (tmp_path / "bomb").exists()
    storage.write_bytes(f"p/{rel}.gz", b"not gzip")
    with pytest.raises(viewer_cache.CacheExpired, match="cannot be read"):
        viewer_cache.fetch(storage, "p", rel, tmp_path / "junk")
    with pytest.raises(viewer_cache.CacheExpired, match="lacks"):
        viewer_cache.fetch(storage, "p", "plugins/profile/s/gone.SSTABLE", tmp_path / "gone")
    # A window not fetched yet is a hard link to its host's stub, which its other windows
    # share: fetching it replaces the link, and the stub stays the stub.
    viewer_cache.put(storage, "p", rel, src)
    stub, window, other = tmp_path / "stub", tmp_path / "w0", tmp_path / "w1"
    stub.write_bytes(b"stub")
    os.link(stub, window)
    os.link(stub, other)
    viewer_cache.fetch(storage, "p", rel, window)
    assert window.read_bytes() == src.read_bytes()
    assert stub.read_bytes() == other.read_bytes() == b"stub"
    storage.write_bytes(f"p/{rel}.gz", b"not gzip")
    with pytest.raises(viewer_cache.CacheExpired):
        viewer_cache.fetch(storage, "p", rel, other)
    assert stub.read_bytes() == other.read_bytes() == b"stub"
