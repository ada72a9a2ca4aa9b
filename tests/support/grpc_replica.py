"""An in-process fake KServe gRPC replica (grpc.aio on 127.0.0.1) and a client front for gateway tests: every
method answered as raw bytes, scripted failures and stalls, a load report on every call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from fleetserve.gateway.server import GatewayHandle
from fleetserve.wire import LOAD_REPORT_HEADER, encode_load_report

SERVICE = "/inference.GRPCInferenceService/"
GRPC_INFER = SERVICE + "ModelInfer"
GRPC_STREAM = SERVICE + "ModelStreamInfer"


@dataclass
class GrpcReplica(grpc.GenericRpcHandler):
    """A gRPC replica answering every method with ``name|method|request`` as raw bytes, reporting its load.

    Modes: ``ok``, ``unavailable`` (overloaded), ``invalid`` (the client's fault), ``hang`` (until cancelled:
    ``cancelled`` is set then), ``slow`` (answers after ``delay_s``). The load report says ``queue_depth`` and
    the calls in progress.
    """

    name: str
    mode: str = "ok"
    delay_s: float = 0.0
    queue_depth: int = 0
    inflight: int = 0
    calls: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    received: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    server: Any = None
    port: int = 0

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        async def stream(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
                         ) -> AsyncIterator[bytes]:
            self.calls.append(details.method)
            async for request in requests:
                yield f"{self.name}|".encode() + request

        if details.method == GRPC_STREAM:
            return grpc.stream_stream_rpc_method_handler(stream)

        async def behaviour(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            self.calls.append(details.method)
            self.metadata = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
            self.received.set()
            report = encode_load_report(self.queue_depth, self.inflight)
            context.set_trailing_metadata(((LOAD_REPORT_HEADER, report),))
            if self.mode == "unavailable":
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.name} is overloaded")
            if self.mode == "invalid":
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "input 'x' has the wrong shape")
            self.inflight += 1
            try:
                if self.mode == "hang":
                    await asyncio.sleep(3600)
                if self.mode == "slow":
                    await asyncio.sleep(self.delay_s)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
            finally:
                self.inflight -= 1
            return f"{self.name}|{details.method}|".encode() + request

        return grpc.unary_unary_rpc_method_handler(behaviour)

    async def start(self) -> GrpcReplica:
        self.server = grpc.aio.server(handlers=[self])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return self

    @property
    def url(self) -> str:
        # The HTTP side is never used; the gateway reaches the gRPC port with backend_grpc_port_offset=0.
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        await self.server.stop(0)


@dataclass
class GrpcFront:
    """A gateway with a gRPC listener, and ONE client channel to it."""

    gateway: GatewayHandle
    channel: grpc.aio.Channel

    async def call(self, method: str = GRPC_INFER, request: bytes = b"x", **kwargs: Any) -> bytes:
        response: bytes = await self.channel.unary_unary(method)(request, **kwargs)
        return response


StartGrpcFront = Callable[..., Awaitable[tuple[GrpcFront, list[GrpcReplica]]]]
