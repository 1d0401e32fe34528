"""A stand-in for a TPU workload's profiler server: the gRPC service xprof's client talks to.

`tensorflow.ProfilerService` as the pinned xprof 2.24.2 client calls it (method names and
message fields read from the descriptor its C API library embeds): `Profile`,
`StartContinuousProfiling` and `StopContinuousProfiling` take and answer messages whose
content the stand-in does not need; `GetSnapshot` answers a `ProfileResponse` whose field 8
(`xspace`) is the buffer, which the client writes as `<logdir>/plugins/profile/<run>/
<host>.xplane.pb`. The status codes and texts are those a real server answers (measured on
CPU with jax's server): a continuous session already running refuses a start with
ALREADY_EXISTS "A profiling session is already running.", and a one-off trace is refused
with "Another profiling session active."

What only a TPU shows is the buffer's content: on CPU the real server's native session
records nothing, so here it is a real CPU trace the test provides.
"""

from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


@dataclass
class StandInProfiler:
    """A profiler server whose workload runs xprof's native continuous profiling."""

    buffer: bytes
    native: bool = True
    calls: list[str] = field(default_factory=list)
    port: int = 0
    _server: Any = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> StandInProfiler:
        def unary(name: str, fn: Any) -> Any:
            def call(request: bytes, context: grpc.ServicerContext) -> bytes:
                self.calls.append(name)
                return bytes(fn(context))
            return grpc.unary_unary_rpc_method_handler(
                call, request_deserializer=lambda b: b, response_serializer=lambda b: b)

        handler = grpc.method_handlers_generic_handler("tensorflow.ProfilerService", {
            "Profile": unary("Profile", self._profile),
            "StartContinuousProfiling": unary("Start", self._start),
            "StopContinuousProfiling": unary("Stop", self._stop),
            "GetSnapshot": unary("GetSnapshot", self._snapshot),
            # A real server marks the session id stopped and answers OK (mldiag's liveness
            # check asks it for an id no capture uses).
            "Terminate": unary("Terminate", lambda context: b""),
        })
        self._server = grpc.server(futures.ThreadPoolExecutor(4))
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(None)

    def _profile(self, context: grpc.ServicerContext) -> bytes:
        if self.native:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, "Another profiling session active.")
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the stand-in records no one-off trace")
        return b""

    def _start(self, context: grpc.ServicerContext) -> bytes:
        if self.native:
            context.abort(grpc.StatusCode.ALREADY_EXISTS,
                          "A profiling session is already running.")
        self.native = True
        return b""

    def _stop(self, context: grpc.ServicerContext) -> bytes:
        if not self.native:
            context.abort(grpc.StatusCode.NOT_FOUND, "No continuous profiling session found.")
        self.native = False
        return b""

    def _snapshot(self, context: grpc.ServicerContext) -> bytes:
        if not self.native:
            context.abort(grpc.StatusCode.NOT_FOUND, "No continuous profiling session found.")
        return b"\x42" + _varint(len(self.buffer)) + self.buffer
