"""Run vLLM with a run around it: `python -m mldiag.sdk.commands.run_vllm [RUN FLAGS] serve ...`.

google-cloud-mldiagnostics 1.0.10's `run_vllm`, with its flags (`--mlrun_name`,
`--mlrun_gcs_path`, `--project`, `--region`, `--jax_profiler_port`, `--run_group`,
`--configs`, `--framework`, `--phased_profiling_dir`); every other argument goes to `vllm`.
It registers the run (`serving_engine=VLLM`), then starts vLLM with the profiler variables
that vLLM's TPU worker (vllm-project/tpu-inference) reads:

- `USE_JAX_PROFILER_SERVER=True` and `JAX_PROFILER_SERVER_PORT`: rank 0 starts
  `jax.profiler.start_server(port)`. That server is registered as a push target of the run
  (`<host>-vllm`, delivery push), live while it accepts connections, so
  `mldiag profiler-session capture`, the console and auto-capture reach it.
- `PHASED_PROFILING_DIR` (from `--phased_profiling_dir` or the environment): the worker traces
  each inference phase into `<dir>/<phase>/plugins/profile/<ts>/<host>.xplane.pb`. vLLM gets a
  local staging directory; each finished phase is copied into the run's logdir as session
  `<phase>-<ts>`, and the pipeline analyses it.
- `VLLM_TORCH_PROFILER_DIR` or `--profiler-config.torch_profiler_dir` (the `/start_profile`
  API's traces): the same, as session `<ts>`.

mldiag extensions: `--vllm_command` (what to run instead of `vllm`, split like a shell line),
`--target_platform` (the server's platform; `tpu` by default, which allows native continuous
profiling), `--target_host` (the push target's name). Multi-host vLLM (Ray) is one target per
wrapper, on the host the wrapper runs on, and phased traces that other hosts write on their
own disks do not reach it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from mldiag.capture import remote
from mldiag.model import CAPTURING, PUSH, SessionRecord, TargetRecord
from mldiag.sdk import workload
from mldiag.sdk.custom_types.mlrun_types import Framework, ServingEngine
from mldiag.sdk.run import MLRun, machinelearning_run

log = logging.getLogger(__name__)

parser = argparse.ArgumentParser(
    prog="python -m mldiag.sdk.commands.run_vllm",
    description="Register a run and run vLLM with its JAX profiler server as the run's target; "
                "every argument not listed here goes to vllm.")
parser.add_argument("--mlrun_name", required=True, help="the run's name")
parser.add_argument("--mlrun_gcs_path", default=None,
                    help="gs://BUCKET[/PREFIX] of the run (optional locally)")
parser.add_argument("--project", default=None)
parser.add_argument("--region", default="us-central1")
parser.add_argument("--jax_profiler_port", default=9999, type=int,
                    help="port of vLLM's JAX profiler server (JAX_PROFILER_SERVER_PORT)")
parser.add_argument("--run_group", default="")
parser.add_argument("--configs", default=None, help="the run's configs, a JSON object")
parser.add_argument("--framework", default=None, choices=["pytorch", "jax", "PYTORCH", "JAX"],
                    help="the workload's framework (default: $MLRUN_FRAMEWORK, else pytorch)")
parser.add_argument("--phased_profiling_dir", default=None,
                    help="turn on vLLM's phased profiling; its traces go to the run's logdir "
                         "(a local value is the staging directory)")
parser.add_argument("--vllm_command", default="vllm", help="the command to run (mldiag)")
parser.add_argument("--target_platform", default="tpu", choices=["tpu", "gpu", "cpu"],
                    help="the profiler server's platform (mldiag)")
parser.add_argument("--target_host", default=None,
                    help="the push target's host name (mldiag; default <host>-vllm)")

POLL_S = 1.0


def _configs(raw: str | None) -> dict[str, object] | None:
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        log.error("--configs is not JSON, ignored: %.80s", raw)
        return None
    if not isinstance(value, dict):
        log.error("--configs must be a JSON object, not %s; ignored", type(value).__name__)
        return None
    return value


def _torch_profiler_dir(args: list[str], staging: str) -> tuple[list[str], str | None]:
    """`args` with vLLM's torch profiler directory (`--profiler-config.torch_profiler_dir=D`
    or `--profiler-config '{"torch_profiler_dir": D, ...}'`) pointed at `staging`; and D."""
    out: list[str] = []
    found: str | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            out.extend(args[i:])
            break
        for flag in ("--profiler-config.torch_profiler_dir", "--profiler-config"):
            if arg == flag and i + 1 < len(args):
                value, i = args[i + 1], i + 1
                break
            if arg.startswith(flag + "="):
                value = arg[len(flag) + 1:]
                break
        else:
            out.append(arg)
            i += 1
            continue
        if flag == "--profiler-config":
            try:
                config = json.loads(value)
            except json.JSONDecodeError:
                config = None
            if isinstance(config, dict) and "torch_profiler_dir" in config:
                found = str(config["torch_profiler_dir"])
                config["torch_profiler_dir"] = staging
                value = json.dumps(config)
        else:
            found, value = value, staging
        out.append(f"{flag}={value}")
        i += 1
    return out, found


def _regular_xplanes(root: Path) -> list[Path]:
    """The `*.xplane.pb` regular files under `root`, walked without following symlinks: a
    symlinked file or directory is never taken (it could lead to any file of the host)."""
    found = []
    for top, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(top, d)))
        for f in sorted(files):
            path = Path(top) / f
            if f.endswith(".xplane.pb") and stat.S_ISREG(path.lstat().st_mode):
                found.append(path)
    return found


def read_inside(root: Path, path: Path) -> bytes:
    """The bytes of the regular file `path` under `root`, opened one path segment at a time
    with O_NOFOLLOW from `root`: OSError when a segment is a symlink (also one swapped in
    after the walk), or the file is not a regular file. Nothing outside `root` is read."""
    parts = path.relative_to(root).parts
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise OSError(f"{path} is not inside {root}")
    flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(root, flags | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open(parts[-1], flags, dir_fd=fd)
    finally:
        os.close(fd)
    with os.fdopen(leaf, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        return f.read()


@dataclass
class TraceCollector:
    """Copies the xplanes vLLM writes under local staging roots into the run's logdir.

    A file is taken once its size and mtime held for one poll (or at the end, when vLLM has
    exited). Under a root, `[<label>/]plugins/profile/<ts>/<host>.xplane.pb` becomes session
    `[<label>-]<ts>`; deeper files (a phase's per-rank `dp_rank_N/` sandbox, which the worker
    moves up when the phase ends) are not finished yet and are left alone.

    Only regular files inside a root are copied: the walk follows no symlink, and each file
    is opened segment by segment with O_NOFOLLOW (`read_inside`), so a link to a private file
    (or a directory swapped for a link) is skipped with the reason, never uploaded.
    """

    run: MLRun
    roots: list[Path]
    sessions: dict[str, list[str]] = field(default_factory=dict)
    _seen: dict[Path, tuple[int, float]] = field(default_factory=dict)
    _done: set[Path] = field(default_factory=set)

    def __post_init__(self) -> None:
        # Each root once, resolved: below it, nothing is followed.
        self.roots = [r.resolve() for r in self.roots]

    def candidates(self) -> list[tuple[Path, str, str]]:
        """The xplanes under the roots, as (path, session, host): regular files only, found
        without following a symlink (of a file or of a directory on the way)."""
        out = []
        for root in self.roots:
            for path in _regular_xplanes(root):
                parts = path.relative_to(root).parts
                if len(parts) < 4 or parts[-4:-2] != ("plugins", "profile") or len(parts) > 5:
                    continue
                host = parts[-1][: -len(".xplane.pb")]
                session = "-".join([*parts[:-4], parts[-2]])
                out.append((path, session, host))
        return out

    def poll(self, final: bool = False) -> None:
        ready: dict[str, list[tuple[Path, str]]] = {}
        for path, session, host in self.candidates():
            if path in self._done:
                continue
            try:
                st = path.lstat()
            except OSError:
                continue  # gone meanwhile
            mark = (st.st_size, st.st_mtime)
            if final or self._seen.get(path) == mark:
                ready.setdefault(session, []).append((path, host))
            self._seen[path] = mark
        for session, files in ready.items():
            self._upload(session, files)

    def _root_of(self, path: Path) -> Path:
        return next(r for r in self.roots if path.is_relative_to(r))

    def _upload(self, session: str, files: list[tuple[Path, str]]) -> None:
        run = self.run
        self._done.update(p for p, _ in files)
        readable: list[tuple[Path, str, bytes]] = []
        for path, host in files:
            root = self._root_of(path)
            try:
                readable.append((path, host, read_inside(root, path)))
            except OSError as e:
                # A symlink (or a directory swapped for one since the walk), or gone.
                log.error("mldiag: vLLM trace %s skipped: not a regular file inside %s (%s)",
                          path, root, e)
        if not readable:
            return
        try:
            name = workload.session_name(session)
            hosts = sorted({workload.safe_segment("host name", h) for _, h, _ in readable})
        except ValueError as e:
            log.error("mldiag: vLLM trace %s skipped: %s", readable[0][0], e)
            return
        now = time.time()
        if name not in self.sessions:
            # The session waits for exactly the hosts vLLM wrote, not the run's live targets.
            run.plane.state.create_session(SessionRecord(
                run=run.name, session=name, state=CAPTURING, kind="programmatic",
                trigger="manual", expected_hosts=hosts, created_at=now, updated_at=now))
        for path, host, data in readable:
            object_name = f"{run.session_dir(name)}/{workload.safe_segment('host name', host)}"
            run.plane.storage.write_bytes(f"{object_name}.xplane.pb", data)
            self.sessions.setdefault(name, []).append(host)
            log.info("mldiag: vLLM trace %s → session %s", path, name)


class PushTarget:
    """vLLM's JAX profiler server as a push target of the run, live while it accepts
    connections and its process runs."""

    def __init__(self, run: MLRun, host: str, port: int, platform: str) -> None:
        address = os.environ.get("MLDIAG_TARGET_ADDRESS") or (
            "127.0.0.1" if run.plane.settings.backend == "local"
            else socket.gethostbyname(socket.gethostname()))
        self.run = run
        self.record = TargetRecord(
            run=run.name, host=host, port=port, framework="vllm", address=address,
            delivery=PUSH, platform=platform, registered_at=time.time(), heartbeat_s=2.0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, pid: int) -> None:
        self.record.pid = pid
        self.run.plane.state.upsert_target(self.record)
        self._thread = threading.Thread(target=self._beat, name="mldiag-vllm-target",
                                        daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        r = self.record
        while not self._stop.wait(r.heartbeat_s / 2):
            if remote.accepts_connections(f"{r.address}:{r.port}"):
                try:
                    self.run.plane.state.update_target(r.run, r.host, r.port,
                                                       last_heartbeat=time.time())
                except Exception as e:  # noqa: BLE001 - a missed beat must not stop vLLM
                    log.warning("mldiag: heartbeat of %s failed: %s", r.host, e)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        r = self.record
        self.run.plane.state.update_target(r.run, r.host, r.port, last_heartbeat=0.0)


def main(args: Sequence[str] | None = None) -> int:
    """Run vLLM under a registered run; returns vLLM's exit code."""
    mine, rest = parser.parse_known_args(args)
    logging.basicConfig(level=logging.INFO)
    name = (mine.framework or os.environ.get("MLRUN_FRAMEWORK") or "pytorch").upper()
    framework = Framework[name] if name in Framework.__members__ else Framework.PYTORCH
    # The wrapper profiles nothing itself: vLLM's worker does, behind its own server.
    run = machinelearning_run(
        name=mine.mlrun_name, run_group=mine.run_group, configs=_configs(mine.configs),
        gcs_path=mine.mlrun_gcs_path, project=mine.project, region=mine.region,
        metrics_record_interval_sec=-1, framework=framework,
        serving_engine=ServingEngine.VLLM, metric_only_run=True, monitor=False)
    env = dict(os.environ)
    env["USE_JAX_PROFILER_SERVER"] = "True"
    env["JAX_PROFILER_SERVER_PORT"] = str(mine.jax_profiler_port)

    staging = Path(tempfile.mkdtemp(prefix=f"mldiag-vllm-{run.name}-"))
    roots: list[Path] = []
    phased = mine.phased_profiling_dir or os.environ.get("PHASED_PROFILING_DIR")
    if phased:
        root = (Path(phased) / run.name if "://" not in phased else staging / "phased")
        root.mkdir(parents=True, exist_ok=True)
        env["PHASED_PROFILING_DIR"] = str(root)
        roots.append(root)
    api_root = staging / "api"
    rest, torch_dir = _torch_profiler_dir(list(rest), str(api_root))
    torch_dir = torch_dir or os.environ.get("VLLM_TORCH_PROFILER_DIR")
    if torch_dir:
        api_root.mkdir(parents=True, exist_ok=True)
        env["VLLM_TORCH_PROFILER_DIR"] = str(api_root)
        roots.append(api_root)
    for root in roots:
        log.info("mldiag: vLLM writes traces under %s; they go to run %s", root, run.name)

    host = mine.target_host or f"{workload.hostname()}-vllm"
    target = PushTarget(run, workload.safe_segment("host name", host), mine.jax_profiler_port,
                        mine.target_platform)
    collector = TraceCollector(run, roots)
    command = [*shlex.split(mine.vllm_command), *rest]
    log.info("mldiag: running %s", " ".join(command))
    proc = subprocess.Popen(command, env=env)

    def forward(signum: int, frame: FrameType | None) -> None:
        proc.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    target.start(proc.pid)
    try:
        while proc.poll() is None:
            try:
                proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
            collector.poll()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
        target.stop()
        collector.poll(final=True)
        run.close()
        shutil.rmtree(staging, ignore_errors=True)
    log.info("mldiag: vllm exited with %s; sessions: %s", proc.returncode,
             ", ".join(collector.sessions) or "none")
    return int(proc.returncode)


if __name__ == "__main__":
    sys.exit(main())
