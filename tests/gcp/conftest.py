"""Fixtures for the GCP suite: the shared emulators (see tests/emulators.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.emulators import emu, stop_shared_emulators

__all__ = ["emu", "jwks_endpoint"]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    stop_shared_emulators()


@contextmanager
def jwks_endpoint(public_key: Any, *, kid: str, alg: str) -> Iterator[str]:
    """A loopback endpoint serving `public_key` as a JWK set, as Google serves its keys (for
    the IAP assertion and for ID tokens); yields its URL."""
    import jwt

    family = jwt.algorithms.RSAAlgorithm if alg.startswith("RS") else jwt.algorithms.ECAlgorithm
    jwk = json.loads(family.to_jwk(public_key))
    body = json.dumps({"keys": [{**jwk, "kid": kid, "alg": alg, "use": "sig"}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/certs"
    finally:
        server.shutdown()
