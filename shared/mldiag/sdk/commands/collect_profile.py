"""Trace running profiler servers into a logdir: `python -m mldiag.sdk.commands.collect_profile`.

google-cloud-mldiagnostics 1.0.10's `collect_profile`, with its flags (`--hosts`, `--port`,
`--duration_in_ms`, `--log_dir`, `--session_name`, the three tracer levels,
`--override_hostnames`, `--use_system_hostname`). Each host's server (`jax.profiler.start_server`,
torch_xla's or torch_tpu's) is traced in parallel with mldiag's remote trace, and its xplane is
written to `<log_dir>/plugins/profile/<session>/<name>.xplane.pb`, the layout `mldiag analyze`
and a run's logdir read. `<name>` is the host's entry in `--override_hostnames`, or the host
as given (`--use_system_hostname`: the name it resolves to).

`--log_dir` is a local directory: to capture into a run's bucket (and have the pipeline
analyse it) use `mldiag profiler-session capture` on registered targets instead. Upstream's
HTTP fallback (a POST to `/profiling`, for servers that are not gRPC profiler servers) is not
here.
"""

from __future__ import annotations

import argparse
import datetime
import socket
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mldiag.capture import remote
from mldiag.sdk import workload

parser = argparse.ArgumentParser(
    prog="python -m mldiag.sdk.commands.collect_profile",
    description="Trace profiler servers (jax.profiler.start_server(PORT) in the workload) for "
                "a duration; one xplane per host under LOG_DIR/plugins/profile/SESSION/.")
parser.add_argument("--hosts", required=True, help="comma-separated hosts to trace")
parser.add_argument("--port", required=True, type=int, help="the profiler servers' port")
parser.add_argument("--duration_in_ms", required=True, type=int)
parser.add_argument("--log_dir", required=True, help="a local directory")
parser.add_argument("--session_name", default="", help="default: the start time")
parser.add_argument("--host_tracer_level", default=2, type=int)
parser.add_argument("--device_tracer_level", default=1, type=int)
parser.add_argument("--python_tracer_level", default=1, type=int)
parser.add_argument("--override_hostnames", default="",
                    help="comma-separated names for the trace files, one per host")
parser.add_argument("--use_system_hostname", action="store_true",
                    help="name each file by the name its host resolves to")


def _names(hosts: list[str], override: str, system: bool) -> list[str]:
    if system and override:
        raise ValueError("--use_system_hostname and --override_hostnames are mutually "
                         "exclusive. Specify only one.")
    if override:
        names = [n.strip() for n in override.split(",")]
        if len(names) != len(hosts):
            raise ValueError("Number of hosts and override_hostnames must be equal if "
                             "override_hostnames is provided.")
        for n in names:
            if not n or " " in n or ":" in n:
                raise ValueError(f"Hostname {n!r} in override_hostnames must be non-empty, "
                                 "without spaces or colons.")
        return names
    if system:
        return [socket.getfqdn(h).split(".")[0] for h in hosts]
    return hosts


def collect(hosts: list[str], port: int, duration_ms: int, log_dir: str, session: str = "",
            host_tracer_level: int = 2, device_tracer_level: int = 1,
            python_tracer_level: int = 1, names: list[str] | None = None) -> list[Path]:
    """Trace every host's server at once; returns the files written (raises the first
    host's CaptureFailed after writing the others)."""
    if "://" in log_dir:
        raise ValueError(f"--log_dir {log_dir}: a local directory (use `mldiag "
                         "profiler-session capture` to capture into a run's bucket)")
    session = workload.session_name(
        session or datetime.datetime.now(datetime.UTC).strftime("%Y_%m_%d_%H_%M_%S"))
    out = Path(log_dir) / "plugins" / "profile" / session
    names = names or hosts

    def one(host: str, name: str) -> Path:
        data = remote.remote_trace(
            f"{host}:{port}", duration_ms / 1000, host_tracer_level=host_tracer_level,
            device_tracer_level=device_tracer_level, python_tracer_level=python_tracer_level)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{workload.safe_segment('host name', name)}.xplane.pb"
        path.write_bytes(data)
        return path

    with ThreadPoolExecutor(max(1, min(len(hosts), 10)),
                            thread_name_prefix="mldiag-collect") as pool:
        futures = [pool.submit(one, h, n) for h, n in zip(hosts, names, strict=True)]
    written, errors = [], []
    for f in futures:
        try:
            written.append(f.result())
        except remote.CaptureFailed as e:
            errors.append(e)
    if errors:
        raise errors[0]
    return written


def main(args: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status."""
    a = parser.parse_args(args)
    hosts = [h.strip() for h in a.hosts.split(",") if h.strip()]
    print(f"Starting remote profile for {a.hosts} on {a.port}...", flush=True)
    try:
        written = collect(hosts, a.port, a.duration_in_ms, a.log_dir, a.session_name,
                          a.host_tracer_level, a.device_tracer_level, a.python_tracer_level,
                          _names(hosts, a.override_hostnames, a.use_system_hostname))
    except (ValueError, remote.CaptureFailed) as e:
        print(f"collect_profile: {e}", file=sys.stderr)
        return 1
    for path in written:
        print(f"Dumped profiling information in: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
