"""Jobs for tests/unit/test_workers.py; they run inside worker processes."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any


def setup(args: Mapping[str, Any], worker: Mapping[str, Any]) -> dict[str, Any]:
    return {"group": worker["group"], **args}


def echo(ctx: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"group": ctx["group"], "pid": os.getpid(), **inputs}


def sleep(ctx: Mapping[str, Any], inputs: Mapping[str, Any]) -> str:
    time.sleep(60)
    return "woke up"


def sleep_noting_pid(ctx: Mapping[str, Any], inputs: Mapping[str, Any]) -> str:
    """A minute's sleep that first writes this worker's pid to `inputs["pid_file"]`."""
    with open(inputs["pid_file"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)
    return "woke up"


def hog(ctx: Mapping[str, Any], inputs: Mapping[str, Any]) -> int:
    blocks = []
    for _ in range(64):  # up to 4 GiB, 64 MiB at a time, touched so it is resident
        blocks.append(bytearray(64 * 1024**2))
        time.sleep(0.02)
    return len(blocks)


def crash(ctx: Mapping[str, Any], inputs: Mapping[str, Any]) -> None:
    os._exit(3)


def fail(ctx: Mapping[str, Any], inputs: Mapping[str, Any]) -> None:
    raise ValueError("bad input, line 1\nline 2")


def mapped_libs(ctx: Mapping[str, Any], inputs: Mapping[str, Any]) -> list[str]:
    """The shared objects this worker has mapped (its allocator among them)."""
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if ".so" in line})


def nap(ctx: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, float]:
    """Half a second of work, with when it ran (CLOCK_MONOTONIC is one clock for all processes)."""
    start = time.monotonic()
    time.sleep(0.5)
    return {"start": start, "end": time.monotonic()}
