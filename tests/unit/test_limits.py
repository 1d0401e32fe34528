"""One set of limits, one message each, wherever a value comes in: the limit's own check, the
CLI's and the console's request builder, the capture stage, the auto-capture policy, the SDK's
ring and its control endpoint (tests/sdk/test_control.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mldiag import limits
from mldiag.bootstrap import control_plane
from mldiag.capture.requests import capture_request, continuous_request
from mldiag.errors import MldiagError
from mldiag.model import AutoCapturePolicy
from mldiag.sdk.continuous import RingBuffer
from mldiag.settings import Settings

DURATION = "capture duration must be in (0, 300] s, not 301 s"
WINDOW = "continuous window must be in [0.1, 300] s, not 0.01 s"
RING = "continuous max_bytes must be in [1.0 MiB, 64.00 GiB], not 1000000000000000000 bytes"


def test_each_check_names_the_value_and_the_limit() -> None:
    with pytest.raises(limits.LimitExceeded, match=r"^capture duration must be in \(0, 300\]"):
        limits.check_capture_duration(301)
    for bad in (0, -1, float("nan"), True, "5", None):
        with pytest.raises(limits.LimitExceeded):
            limits.check_capture_duration(bad)
    assert limits.check_capture_duration(300) == 300.0
    with pytest.raises(limits.LimitExceeded, match=r"^continuous window"):
        limits.check_window(0.01)
    with pytest.raises(limits.LimitExceeded, match="^continuous max_bytes"):
        limits.check_ring_bytes(10**18)
    with pytest.raises(limits.LimitExceeded, match="at most 256 hosts, not 257"):
        limits.check_hosts(257)
    with pytest.raises(limits.LimitExceeded, match="h0: 3.00 GiB exceeds the per-host cap "
                                                   "of 2.00 GiB"):
        limits.check_host_bytes("h0", 3 * 1024**3, cap=10 * 1024**3)  # settings cannot raise it
    assert limits.check_session_bytes({"a": 1, "b": 2}, cap=3) == 3
    with pytest.raises(limits.LimitExceeded, match="hold 4 B|over the per-session cap"):
        limits.check_session_bytes({"a": 2, "b": 2}, cap=3)


def test_settings_may_lower_the_caps_but_not_raise_them() -> None:
    assert Settings.from_env({"MLDIAG_MAX_SESSION_BYTES": "1000"}).max_session_bytes == 1000
    with pytest.raises(ValueError, match="MLDIAG_MAX_HOST_BYTES=4294967296: must be in"):
        Settings.from_env({"MLDIAG_MAX_HOST_BYTES": str(4 * 1024**3)})


def test_the_auto_capture_policy_allows_what_a_capture_allows() -> None:
    assert AutoCapturePolicy(duration_s=300).duration_s == 300
    with pytest.raises(ValueError, match=r"^capture duration must be in \(0, 300\] s, not "
                                         r"301 s$"):
        AutoCapturePolicy(duration_s=301)


def test_the_cli_and_console_requests_refuse_with_the_same_message(tmp_path: Path) -> None:
    plane = control_plane(Settings(home=tmp_path))
    plane.state.ensure_run("r", discovered=False, now=0.0)
    with pytest.raises(MldiagError) as e:
        capture_request(plane, "r", "s1", duration_s=301)
    assert str(e.value) == DURATION
    with pytest.raises(MldiagError) as e:
        continuous_request(plane, "r", "start", options={"window_s": 0.01})
    assert str(e.value) == WINDOW
    with pytest.raises(MldiagError) as e:
        continuous_request(plane, "r", "start", options={"max_bytes": 10**18})
    assert str(e.value) == RING


def test_the_sdk_ring_refuses_with_the_same_message(tmp_path: Path) -> None:
    ring = RingBuffer(tmp_root=tmp_path)
    with pytest.raises(ValueError) as e:
        ring.start(window_s=0.01)
    assert str(e.value) == WINDOW
    with pytest.raises(ValueError) as e:
        ring.start(window_s=1.0, max_bytes=10**18)
    assert str(e.value) == RING
    assert not ring.active
