"""The control plane's client of a target's control endpoint (see `mldiag.sdk.control`)."""

from __future__ import annotations

import http.client
import json
from typing import Any

from mldiag.errors import MldiagError


class TargetUnreachable(MldiagError):
    """The target's control endpoint could not be reached (refused, timed out, no such host)."""


class TargetError(MldiagError):
    """The target answered, but not with what was asked (non-2xx status, or an empty capture)."""


class TargetClient:
    """Calls one target's control endpoint at `address:control_port` with its bearer token.

    It connects to `ip` when given (the address the egress policy checked), follows no
    redirect (a 3xx is an error: the token must never reach another server), and reads at
    most `max_bytes` of an answer."""

    def __init__(self, address: str, control_port: int, token: str,
                 timeout_s: float = 30.0, *, ip: str | None = None,
                 max_bytes: int = 2 * 1024**3) -> None:
        self.address = address
        self.control_port = control_port
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._token = token
        self._ip = ip or address

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
        raw = self._request(method, path, body, self.timeout_s, limit=1024**2)
        try:
            answer = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TargetError(f"{self.endpoint}{path}: answer is not JSON: {e}") from e
        if not isinstance(answer, dict):
            raise TargetError(f"{self.endpoint}{path}: answer is not a JSON object")
        return answer

    def _request(self, method: str, path: str, body: dict[str, Any] | None,
                 timeout_s: float, limit: int | None = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        host = f"[{self.address}]" if ":" in self.address else self.address
        conn = http.client.HTTPConnection(self._ip, self.control_port, timeout=timeout_s)
        try:
            conn.request(method, path, body=data, headers={
                "Host": f"{host}:{self.control_port}",
                "Authorization": f"Bearer {self._token}",
                "Content-Type": "application/json"})
            response = conn.getresponse()
            if 300 <= response.status < 400:
                raise TargetError(f"{self.endpoint}{path}: HTTP {response.status} redirect "
                                  "refused (a target answers itself, and its token goes "
                                  "nowhere else)")
            payload = _read_capped(response, limit or self.max_bytes, self.endpoint + path)
            if response.status >= 400:
                raise TargetError(f"{self.endpoint}{path}: HTTP {response.status}: "
                                  f"{_reason(response.status, payload)}")
            return payload
        except TimeoutError as e:
            raise TargetUnreachable(
                f"{self.endpoint} unreachable: no answer within {timeout_s:g} s") from e
        except (ConnectionError, OSError, http.client.HTTPException) as e:
            # Refused, reset or closed while the answer is read.
            raise TargetUnreachable(f"{self.endpoint} unreachable: {e}") from e
        finally:
            conn.close()


def _read_capped(response: http.client.HTTPResponse, limit: int, where: str) -> bytes:
    declared = response.getheader("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TargetError(f"{where}: answer of {int(declared):,} bytes is over the "
                          f"{limit:,}-byte cap")
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = response.read(1024**2)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > limit:
            raise TargetError(f"{where}: answer is over the {limit:,}-byte cap")
        chunks.append(chunk)


def _reason(status: int, raw: bytes) -> str:
    try:
        answer = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return raw[:200].decode(errors="replace") or str(status)
    if isinstance(answer, dict) and "error" in answer:
        return str(answer["error"])
    return str(status)
