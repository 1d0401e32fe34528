"""The one set of limits that the SDK, the CLI, the stages and the API all enforce.

Each limit has one check here, and each check one message, so a value refused anywhere is
refused everywhere with the same words:

- a capture (on-demand, snapshot, or the one an alert asks for) lasts at most
  `MAX_CAPTURE_S`: it runs inside one Cloud Functions invocation (540 s) with its upload;
- a continuous-profiling window lasts `MIN_WINDOW_S` to `MAX_WINDOW_S`;
- a continuous-profiling ring keeps `MIN_RING_BYTES` to `MAX_RING_BYTES` on the workload's
  disk;
- a session has at most `MAX_HOSTS_PER_SESSION` hosts (one capture thread per target);
- a host's profile is at most `MAX_HOST_BYTES` (ML Diagnostics' own per-host limit), and a
  session's profiles at most `MAX_SESSION_BYTES` in all. Settings may lower both
  (`MLDIAG_MAX_HOST_BYTES`, `MLDIAG_MAX_SESSION_BYTES`), never raise them.

Every check raises `LimitExceeded` (an `MldiagError`, and a `ValueError` for the SDK's
callers, who pass arguments); the stages turn it into a poison message or a FAILED session.
"""

from __future__ import annotations

from mldiag.errors import MldiagError

MAX_CAPTURE_S = 300.0
MIN_WINDOW_S = 0.1
MAX_WINDOW_S = 300.0
MIN_RING_BYTES = 1024**2
MAX_RING_BYTES = 64 * 1024**3
MAX_HOSTS_PER_SESSION = 256
MAX_HOST_BYTES = 2 * 1024**3
MAX_SESSION_BYTES = 64 * 1024**3


class LimitExceeded(MldiagError, ValueError):
    """A value outside one of mldiag's limits; the message names the value and the limit.

    Permanent: the same value is refused again.
    """


def _number(what: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise LimitExceeded(f"{what} must be a number, not {value!r}")
    return float(value)


def size_text(n: float) -> str:
    """Bytes as people read them: GiB from one GiB up, else MiB."""
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"


def check_capture_duration(duration_s: object) -> float:
    """A capture's duration in seconds, in (0, MAX_CAPTURE_S]."""
    value = _number("capture duration", duration_s)
    if not 0 < value <= MAX_CAPTURE_S:
        raise LimitExceeded(f"capture duration must be in (0, {MAX_CAPTURE_S:g}] s, not "
                            f"{value:g} s")
    return value


def check_window(window_s: object) -> float:
    """A continuous-profiling window in seconds, in [MIN_WINDOW_S, MAX_WINDOW_S]."""
    value = _number("continuous window", window_s)
    if not MIN_WINDOW_S <= value <= MAX_WINDOW_S:
        raise LimitExceeded(f"continuous window must be in [{MIN_WINDOW_S:g}, "
                            f"{MAX_WINDOW_S:g}] s, not {value:g} s")
    return value


def check_ring_bytes(max_bytes: object) -> int:
    """A continuous-profiling ring's size in bytes, in [MIN_RING_BYTES, MAX_RING_BYTES]."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise LimitExceeded(f"continuous max_bytes must be an integer, not {max_bytes!r}")
    if not MIN_RING_BYTES <= max_bytes <= MAX_RING_BYTES:
        raise LimitExceeded(f"continuous max_bytes must be in [{size_text(MIN_RING_BYTES)}, "
                            f"{size_text(MAX_RING_BYTES)}], not {max_bytes} bytes")
    return max_bytes


def check_hosts(count: int) -> int:
    """The number of hosts in one session, at most MAX_HOSTS_PER_SESSION."""
    if count > MAX_HOSTS_PER_SESSION:
        raise LimitExceeded(f"a session has at most {MAX_HOSTS_PER_SESSION} hosts, not "
                            f"{count}: select targets with --target")
    return count


def check_host_bytes(host: str, size: int, cap: int = MAX_HOST_BYTES) -> int:
    """One host's profile size, at most `cap` (itself at most MAX_HOST_BYTES)."""
    cap = min(cap, MAX_HOST_BYTES)
    if size > cap:
        raise LimitExceeded(f"{host}: {size_text(size)} exceeds the per-host cap of "
                            f"{size_text(cap)}")
    return size


def check_session_bytes(sizes: dict[str, int], cap: int = MAX_SESSION_BYTES) -> int:
    """A session's profiles in all, at most `cap` (itself at most MAX_SESSION_BYTES)."""
    cap = min(cap, MAX_SESSION_BYTES)
    total = sum(sizes.values())
    if total > cap:
        raise LimitExceeded(f"the session's {len(sizes)} host profile(s) hold {size_text(total)}, "
                            f"over the per-session cap of {size_text(cap)} "
                            "(MLDIAG_MAX_SESSION_BYTES)")
    return total
