"""What the control commands (`capture`, `continuous`, `autocapture`) share."""

from __future__ import annotations

import argparse
import fcntl
import re

from mldiag.bootstrap import ControlPlane, control_plane
from mldiag.durations import parse_duration
from mldiag.errors import MldiagError
from mldiag.settings import Settings

_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|kib|mib|gib)?\s*$", re.IGNORECASE)


def duration(text: str) -> float:
    """A duration as gcloud takes it, in seconds (`mldiag.durations`)."""
    return parse_duration(text)


def size(text: str) -> int:
    """`2GB`, `512MiB` or plain bytes, as bytes."""
    match = _BYTES.match(text)
    if not match:
        raise ValueError(f"bad size {text!r} (examples: 2GB, 512MiB)")
    unit = (match.group(2) or "b").lower()
    scale = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20,
             "gib": 2**30}[unit]
    return int(float(match.group(1)) * scale)


def settings_of(args: argparse.Namespace) -> Settings:
    """Settings from the environment and the command's `--home`, `--project`, `--location`."""
    return Settings.from_env(home=getattr(args, "home", None),
                             project=getattr(args, "project", None),
                             location=getattr(args, "location", None))


def connect(home: str | None | Settings, *, need_runtime: bool) -> ControlPlane:
    """The control plane; locally, optionally check that `mldiag up` runs on the home."""
    settings = home if isinstance(home, Settings) else Settings.from_env(home=home)
    if settings.backend == "local":
        if not settings.state_db.is_file():
            raise MldiagError(f"no mldiag state in {settings.home} (start `mldiag up` there, or "
                              "set MLDIAG_HOME / --home)")
        if need_runtime and not runtime_running(settings):
            raise MldiagError(f"no `mldiag up` is running on {settings.home}: start it first, "
                              "it carries out captures and analyses")
    return control_plane(settings)


def runtime_running(settings: Settings) -> bool:
    """Whether a local runtime holds the home's lock."""
    lock = settings.home / "runtime.lock"
    if not lock.is_file():
        return False
    with open(lock) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


# Shared with the console, which validates captures the same way.
from mldiag.capture.requests import (  # noqa: E402
    get_run,
    reachable,
    select_targets,
    target_down,
)

__all__ = ["connect", "duration", "get_run", "reachable", "runtime_running", "select_targets",
           "settings_of", "size", "target_down"]
