"""The control plane's client of a target's control endpoint (see `mldiag.sdk.control`)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from mldiag.errors import MldiagError


class TargetUnreachable(MldiagError):
    """The target's control endpoint could not be reached (refused, timed out, no such host)."""


class TargetError(MldiagError):
    """The target answered, but not with what was asked (non-2xx status, or an empty capture)."""


class TargetClient:
    """Calls one target's control endpoint at `address:control_port` with its bearer token."""

    def __init__(self, address: str, control_port: int, token: str,
                 timeout_s: float = 30.0) -> None:
        self.address = address
        self.control_port = control_port
        self.timeout_s = timeout_s
        self._token = token
        host = f"[{address}]" if ":" in address and not address.startswith("[") else address
        self._base = f"http://{host}:{control_port}"

    @property
    def endpoint(self) -> str:
        """`address:port`, as errors name it."""
        return f"{self.address}:{self.control_port}"

    def health(self) -> dict[str, Any]:
        """The target's health and continuous-profiling status."""
        return self._json("GET", "/health")

    def start_continuous(self, **options: Any) -> None:
        """Start continuous profiling with the given ring options (see RingBuffer.start)."""
        self._json("POST", "/continuous/start", options)

    def stop_continuous(self) -> None:
        """Stop continuous profiling on the target."""
        self._json("POST", "/continuous/stop", {})

    def snapshot(self, duration_s: float | None) -> bytes:
        """The merged xplane of the newest windows reaching `duration_s` back (None: all)."""
        return self._xplane("/snapshot", {"duration_s": duration_s}, self.timeout_s)

    def capture(self, duration_s: float) -> bytes:
        """The merged xplane of the next `duration_s` seconds, served from the target's ring.

        Waits for the capture itself on top of `timeout_s`.
        """
        return self._xplane("/capture", {"duration_s": duration_s},
                            self.timeout_s + duration_s)

    def _xplane(self, path: str, body: dict[str, Any], timeout_s: float) -> bytes:
        data = self._request("POST", path, body, timeout_s)
        if not data:
            raise TargetError(f"{self.endpoint}{path}: empty capture (0 bytes)")
        return data

    def _json(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        raw = self._request(method, path, body, self.timeout_s)
        try:
            answer = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TargetError(f"{self.endpoint}{path}: answer is not JSON: {e}") from e
        if not isinstance(answer, dict):
            raise TargetError(f"{self.endpoint}{path}: answer is not a JSON object")
        return answer

    def _request(self, method: str, path: str, body: dict[str, Any] | None,
                 timeout_s: float) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self._base + path, data=data, method=method,
            headers={"Authorization": f"Bearer {self._token}",
                     "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                payload: bytes = response.read()
                return payload
        except urllib.error.HTTPError as e:
            raise TargetError(f"{self.endpoint}{path}: HTTP {e.code}: {_reason(e)}") from e
        except urllib.error.URLError as e:
            raise TargetUnreachable(f"{self.endpoint} unreachable: {e.reason}") from e
        except TimeoutError as e:
            raise TargetUnreachable(
                f"{self.endpoint} unreachable: no answer within {timeout_s:g} s") from e
        except (ConnectionError, OSError) as e:
            # A connection reset or closed while the answer is read.
            raise TargetUnreachable(f"{self.endpoint} unreachable: {e}") from e


def _reason(error: urllib.error.HTTPError) -> str:
    raw = error.read()
    try:
        answer = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return raw[:200].decode(errors="replace") or str(error.reason)
    if isinstance(answer, dict) and "error" in answer:
        return str(answer["error"])
    return str(error.reason)
