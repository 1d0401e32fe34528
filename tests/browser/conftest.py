"""Browser tests: a real `mldiag up` on a temporary home, driven through Debian's chromium.

One `mldiag up` per module (starting it and analysing the two real profiles takes seconds),
signed in once through the one-time login URL it prints. Every browser context records the
responses of our server and the page errors, so that a test can assert none was a server
error. Screenshots go to `tests/browser/artifacts/` (or `$MLDIAG_TEST_ARTIFACTS/browser/`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Page,
    Request,
    sync_playwright,
)
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Response as PlaywrightResponse

from tests.conftest import BROWSER_VERSION
from tests.helpers.fixtures import REPO, SHARED_FIXTURES, team_fixture

ARTIFACTS = (Path(os.environ["MLDIAG_TEST_ARTIFACTS"]) / "browser"
             if os.environ.get("MLDIAG_TEST_ARTIFACTS")
             else REPO / "tests" / "browser" / "artifacts")
START_S = 60.0
REPORTED_S = 120.0
# Errors the browser reports that are not our server's doing: (page URL part, message part).
KNOWN_PAGE_ERRORS = (
    # Offline, the XProf frontend cannot load Google Charts from www.gstatic.com: it logs this
    # and boots without the charts.
    ("", "google is not defined"),
    # xprof 2.24.2's frontend: on the trace viewer, navigateWithUrl splits `hosts`, which its
    # own router hands it as a list. The trace viewer renders regardless.
    ("/trace_viewer@", "split is not a function"),
)

# Content-Security-Policy violations, reported by the page itself (`securitypolicyviolation`),
# so a blocked handler or script fails a test whether or not this chromium build also logs it
# to the console. Known ones: (source file suffix, blocked URI, why it is harmless).
KNOWN_CSP_VIOLATIONS = (
    # The v1 trace viewer probes for a packaged Chrome app with `new Function(...)` inside a
    # try/catch and runs without it.
    ("/trace_viewer_index.js", "eval", "feature probe, caught"),
)
CSP_PROBE = """
document.addEventListener('securitypolicyviolation', (e) => console.error(
  'csp-violation ' + JSON.stringify({directive: e.effectiveDirective, blocked: e.blockedURI,
                                     source: e.sourceFile, line: e.lineNumber})));
"""


@dataclass(frozen=True)
class Profile:
    """A real profile of the team's fixtures, dropped into the bucket as one session."""

    key: str
    run: str
    session: str
    source: Path
    host: str
    device: str  # what the XProf tools call the accelerator

    @property
    def path(self) -> str:
        return f"/runs/{self.run}/sessions/{self.session}"


PROFILES = {
    "tpu": Profile("tpu", "tpu_inference_2", "run1",
                   SHARED_FIXTURES / "tpu_inference_2" / "plugins" / "profile" / "run1",
                   "tpu_inference_2", "TPU"),
    "gpu": Profile("gpu", "gpu_multi_worker", "run1",
                   SHARED_FIXTURES / "gpu_multi_worker" / "plugins" / "profile" / "run1",
                   "34.83.195.179_6003", "GPU"),
}


@dataclass
class Console:
    """A running `mldiag up`: its console's address, the login URL it printed, its home."""

    url: str
    login_url: str
    home: Path
    output: list[str]

    @property
    def token(self) -> str:
        return (self.home / "admin.token").read_text().strip()

    def api(self, path: str) -> Any:
        request = urllib.request.Request(self.url + path,
                                         headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as f:
            return json.loads(f.read())

    def wait_reported(self, run: str, session: str, timeout: float = REPORTED_S) -> Any:
        deadline = time.monotonic() + timeout
        s: Any = None
        while time.monotonic() < deadline:
            try:
                s = self.api(f"/api/v1/runs/{run}/sessions/{session}")
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    raise
            else:
                if s["state"] == "REPORTED":
                    return s
                if s["state"] == "FAILED":
                    pytest.fail(f"{run}/{session} FAILED: {s['reason']}")
            time.sleep(0.2)
        pytest.fail(f"{run}/{session} not REPORTED after {timeout:.0f} s (last: {s}); "
                    "mldiag up printed:\n" + "\n".join(self.output))


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLDIAG_")}
    env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", **extra)
    return env


def _drop(profile: Profile, bucket: Path) -> None:
    team_fixture(profile.source)
    dest = bucket / profile.run / "plugins" / "profile" / profile.session
    dest.mkdir(parents=True)
    for src in profile.source.glob("*.xplane.pb"):
        # copyfile, not copy2: the team's fixtures are read-only, the bucket's objects not.
        shutil.copyfile(src, dest / src.name)


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """`mldiag up --port 0` on a new home holding both profiles, once both are REPORTED."""
    yield from start_up(tmp_path_factory, list(PROFILES.values()))


def start_up(tmp_path_factory: pytest.TempPathFactory, profiles: list[Profile],
             name: str = "mldiag-up", **env: str) -> Iterator[Console]:
    """`mldiag up --port 0` on a new home holding `profiles` (with the settings `env`), once
    every one is REPORTED; stopped when the generator is closed."""
    home = tmp_path_factory.mktemp("mldiag-home")
    for profile in profiles:
        _drop(profile, home / "bucket")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    stderr = (ARTIFACTS / f"{name}.stderr").open("w")
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("mldiag")), "up", "--port", "0", "--settle", "0.5"],
        env=clean_env(MLDIAG_HOME=str(home), **env), cwd=home, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True)
    output: list[str] = []
    started = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line.rstrip("\n"))
            if line.startswith("login (one-time): "):
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + START_S
        while not started.wait(0.1):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("mldiag up did not print its console and login URLs:\n"
                            + "\n".join(output) + f"\n(stderr in {stderr.name})")
        url = next(m[1] for line in output if (m := re.match(r"console: (http://\S+?)/?$", line)))
        login = next(line.split(": ", 1)[1] for line in output if line.startswith("login ("))
        up = Console(url=url, login_url=login, home=home, output=output)
        for profile in profiles:
            up.wait_reported(profile.run, profile.session)
        yield up
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        reader.join(timeout=5)
        stderr.close()
        (ARTIFACTS / f"{name}.stdout").write_text("\n".join(output) + "\n")


@pytest.fixture(scope="session")
def browser(request: pytest.FixtureRequest) -> Iterator[Browser]:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("the browser tests need Debian's chromium, and there is no `chromium` on "
                    "PATH: scripts/test installs it (apt-get install chromium)", pytrace=False)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        version = f"Chromium {b.version} ({path})"
        request.config.stash[BROWSER_VERSION] = version
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"\nbrowser tests: {version}")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)  # a fresh clone has no artifacts yet
        (ARTIFACTS / "chromium-version.txt").write_text(version + "\n")
        yield b
        b.close()


@dataclass
class Watch:
    """What a browser context saw of our server: every response, and every error."""

    origin: str
    # Error statuses the test means to get: anywhere, or (status, URL prefix) there only.
    allowed: frozenset[int] = frozenset()
    allowed_at: tuple[tuple[int, str], ...] = ()
    responses: list[tuple[int, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def attach(self, ctx: BrowserContext) -> None:
        ctx.on("response", self._response)
        ctx.on("requestfailed", self._failed)
        ctx.on("weberror", lambda e: self._error(f"uncaught: {e.error}",
                                                 e.page.url if e.page else ""))
        ctx.on("console", self._console)
        ctx.add_init_script(CSP_PROBE)

    def ours(self, url: str) -> bool:
        return url.startswith(self.origin + "/")

    def _response(self, r: PlaywrightResponse) -> None:
        if self.ours(r.url):
            self.responses.append((r.status, r.url))

    def _failed(self, r: Request) -> None:
        # A request cut short by the next navigation is the browser's doing, not ours.
        if self.ours(r.url) and r.failure != "net::ERR_ABORTED":
            self.errors.append(f"request failed: {r.url} ({r.failure})")

    def _error(self, text: str, page_url: str) -> None:
        path = urlparse(page_url).path
        if not any(on in path and known in text for on, known in KNOWN_PAGE_ERRORS):
            self.errors.append(f"on {page_url}: {text}")

    def _console(self, msg: ConsoleMessage) -> None:
        page_url = msg.page.url if msg.page else ""
        if msg.type == "error" and msg.text.startswith("csp-violation "):
            v = json.loads(msg.text.split(" ", 1)[1])
            if not any((v["source"] or "").endswith(src) and v["blocked"] == blocked
                       for src, blocked, _ in KNOWN_CSP_VIOLATIONS):
                self.errors.append(f"on {page_url}: CSP violation: {v}")
            return
        # Resources that failed to load are in `responses` (ours) or offline (gstatic).
        if msg.type == "error" and not msg.text.startswith("Failed to load resource"):
            self._error(f"console error: {msg.text}", page_url)

    def since(self, n: int) -> list[tuple[int, str]]:
        return self.responses[n:]

    def problems(self) -> list[str]:
        bad = [f"{status} {url}" for status, url in self.responses
               if status >= 500 or (status >= 400 and status not in self.allowed and not any(
                   status == s and url.startswith(self.origin + at) for s, at in self.allowed_at))]
        return bad + self.errors

    def check(self) -> None:
        assert not self.problems(), "\n".join(self.problems())


@dataclass
class Browse:
    """Browser contexts on the console, each with its Watch; closed at the end of a test."""

    browser: Browser
    console: Console
    opened: list[tuple[BrowserContext, Watch]] = field(default_factory=list)

    def context(self, *, signed_in: dict[str, Any] | None = None, allow: tuple[int, ...] = (),
                allow_at: tuple[tuple[int, str], ...] = ()) -> tuple[BrowserContext, Watch]:
        """A fresh context (no cookies), or one with the admin's sign-in state."""
        ctx = self.browser.new_context(viewport={"width": 1400, "height": 900},
                                       storage_state=signed_in)  # type: ignore[arg-type]
        ctx.set_default_timeout(15_000)
        watch = Watch(self.console.url, frozenset(allow), allow_at)
        watch.attach(ctx)
        self.opened.append((ctx, watch))
        return ctx, watch

    def close(self) -> None:
        for ctx, _ in self.opened:
            try:
                ctx.close()
            except PlaywrightError:
                pass  # the browser went first


@pytest.fixture
def browse(browser: Browser, console: Console) -> Iterator[Browse]:
    b = Browse(browser, console)
    yield b
    b.close()


@pytest.fixture(scope="module")
def admin_state(browser: Browser, console: Console) -> dict[str, Any]:
    """Sign in once through the one-time login URL; the cookie it sets, for every test."""
    ctx = browser.new_context()
    try:
        page = ctx.new_page()
        response = page.goto(console.login_url)
        assert response is not None and response.ok, response and response.status
        assert page.url == console.url + "/", page.url
        state: dict[str, Any] = dict(ctx.storage_state())
        return state
    finally:
        ctx.close()


Shot = Callable[..., None]


@pytest.fixture
def shot(request: pytest.FixtureRequest) -> Shot:
    """shot(page, name): a screenshot in the test's artifact folder, numbered in order."""
    folder = ARTIFACTS / re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    count = [0]

    def take(page: Page, name: str, *, full_page: bool = False) -> None:
        count[0] += 1
        page.screenshot(path=folder / f"{count[0]:02d}-{name}.png", full_page=full_page)

    return take
