"""The capture stage cannot be aimed: a target record is workload-written data.

Reproduces the attack the review found on loopback: a target record pointing at a server
that answers 302 to an internal service. SDK targets now take their requests by pull and
mldiag has no control-endpoint client, so that service receives nothing (no request, no
bearer token), and the bucket holds nothing but profiles."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from mldiag.capture.egress import EgressPolicy, EgressRefused
from mldiag.messages import CaptureProfile
from mldiag.model import FAILED, TargetRecord
from mldiag.settings import Settings
from tests.helpers.pipeline import MakeRuntime
from tests.helpers.wait import wait_until

RUN = "victim"


class Recorder(BaseHTTPRequestHandler):
    """A loopback HTTP server whose answer the test chooses, recording every request."""

    answer: tuple[int, dict[str, str], bytes] = (200, {}, b"")
    seen: list[tuple[str, str, str]] = []

    def _reply(self) -> None:
        type(self).seen.append((self.command, self.path, self.headers.get("Authorization", "")))
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        status, headers, body = type(self).answer
        self.send_response(status)
        for k, v in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _reply

    def log_message(self, *args: Any) -> None:
        pass


def serve(answer: tuple[int, dict[str, str], bytes]) -> tuple[ThreadingHTTPServer, type]:
    handler = type("H", (Recorder,), {"answer": answer, "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, handler


@pytest.fixture
def internal() -> Iterator[tuple[ThreadingHTTPServer, type]]:
    server, handler = serve((200, {"Content-Type": "text/plain"}, b"SECRET internal export"))
    yield server, handler
    server.shutdown()


def _capture(rt: Any, address: str, port: int, session: str, **record: Any) -> Any:
    rt.state.ensure_run(RUN, discovered=False)
    rt.state.upsert_target(TargetRecord(run=RUN, host="h0", address=address,
                                        last_heartbeat=time.time() + 3600,
                                        **{"port": port, **record}))
    rt.start()
    rt.services.bus.publish(CaptureProfile(run=RUN, session=session, duration_s=0.2))
    s = wait_until(lambda: (x := rt.state.get_session(RUN, session)) and x.state == FAILED
                   and x, timeout=60, what=f"session {session} to fail")
    return s


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_old_records_control_endpoint_is_never_called_and_its_token_goes_nowhere(
        make_runtime: MakeRuntime, internal: tuple[ThreadingHTTPServer, type]) -> None:
    # The attack the review reproduced: a record whose control endpoint answers 302 to an
    # internal service. mldiag no longer has a control-endpoint client at all.
    inner, inner_seen = internal
    location = f"http://127.0.0.1:{inner.server_address[1]}/admin/export"
    evil, evil_seen = serve((302, {"Location": location}, b""))
    try:
        rt = make_runtime()
        s = _capture(rt, "127.0.0.1", closed_port(), "redirected",
                     control_port=evil.server_address[1], control_token="victim-token",
                     continuous="RING")
    finally:
        evil.shutdown()
    assert "from before pull delivery" in s.reason and "no longer connects" in s.reason
    assert evil_seen.seen == [] and inner_seen.seen == []  # nobody was called, token or not
    assert not [o for o in rt.storage.list(f"{RUN}/") if o.name.endswith(".xplane.pb")]


def test_metadata_link_local_and_public_addresses_are_refused(
        make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    s = _capture(rt, "169.254.169.254", 8080, "metadata")
    assert "capture refused: 169.254.169.254 resolves to 169.254.169.254 (the metadata " \
           "server)" in s.reason
    policy = EgressPolicy.from_settings(Settings(backend="gcp"))
    for address, why in (("127.0.0.1", "loopback"), ("169.254.1.1", "link-local"),
                         ("8.8.8.8", "outside the allowed networks")):
        with pytest.raises(EgressRefused, match=why):
            policy.check(address, 9999)
    assert policy.check("10.1.2.3", 9999) == "10.1.2.3"
    # GCE's IPv6 metadata address sits in fc00::/7, an allowed network by default.
    for metadata in ("fd20:ce::254", "fd00:ec2::254", "::ffff:169.254.169.254"):
        with pytest.raises(EgressRefused, match="the metadata server"):
            policy.check(metadata, 9999)
    assert policy.check("fd20:ce::1", 9999) == "fd20:ce::1"
    with pytest.raises(EgressRefused, match="port 22"):
        policy.check("10.1.2.3", 22)
    local = EgressPolicy.from_settings(Settings(backend="local"))
    assert local.check("127.0.0.1", 9999) == "127.0.0.1"
    strict = EgressPolicy.from_settings(Settings(backend="local", capture_allow_loopback="0"))
    with pytest.raises(EgressRefused, match="loopback"):
        strict.check("localhost", 9999)
    wide = EgressPolicy.from_settings(Settings(backend="gcp",
                                               capture_allowed_networks="203.0.113.0/24"))
    assert wide.check("203.0.113.7", 9999) == "203.0.113.7"


def test_targets_list_never_prints_an_old_records_control_token(
        make_runtime: MakeRuntime, capsys: pytest.CaptureFixture[str]) -> None:
    from mldiag.cli.main import main

    rt = make_runtime()
    rt.state.ensure_run(RUN, discovered=False)
    rt.state.upsert_target(TargetRecord(run=RUN, host="h0", control_port=1234,
                                        control_token="s3cret-token", last_heartbeat=time.time()))
    assert main(["targets", "list", "--run", RUN, "--json",
                 "--home", str(rt.services.settings.home)]) == 0
    out = capsys.readouterr().out
    assert '"host": "h0"' in out and "s3cret-token" not in out
    assert main(["targets", "list", "--run", RUN, "--home",
                 str(rt.services.settings.home)]) == 0
    assert "s3cret-token" not in capsys.readouterr().out
