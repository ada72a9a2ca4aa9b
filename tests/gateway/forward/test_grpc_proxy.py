"""Per-call gRPC balancing: in-test grpc.aio replicas behind the proxy, one client channel in front."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest

from fleetserve.gateway.balance import Balancer, BalancerConfig
from fleetserve.gateway.balance.discovery import Insert
from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.forward.grpc_proxy import GrpcProxy, grpc_target, start_grpc_server
from fleetserve.gateway.metrics import GatewayMetrics
from fleetserve.telemetry.tracing import parse_traceparent
from fleetserve.wire import LOAD_REPORT_HEADER, encode_load_report
from tests.support.gateways import gateway_config

SERVICE = "/inference.GRPCInferenceService/"
INFER = SERVICE + "ModelInfer"
STREAM = SERVICE + "ModelStreamInfer"


@dataclass
class GrpcReplica(grpc.GenericRpcHandler):
    """A replica answering every method with ``name|method|request`` as raw bytes."""

    name: str
    mode: str = "ok"  # ok | unavailable | invalid | hang
    calls: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    server: Any = None
    port: int = 0

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        async def stream(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
                         ) -> AsyncIterator[bytes]:
            self.calls.append(details.method)
            async for request in requests:
                yield f"{self.name}|".encode() + request

        if details.method == STREAM:
            return grpc.stream_stream_rpc_method_handler(stream)

        async def behaviour(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            self.calls.append(details.method)
            self.metadata = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
            context.set_trailing_metadata(((LOAD_REPORT_HEADER, encode_load_report(4, 1, 32)),))
            if self.mode == "unavailable":
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.name} is overloaded")
            if self.mode == "invalid":
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "input 'x' has the wrong shape")
            if self.mode == "hang":
                await asyncio.sleep(3600)
            return f"{self.name}|{details.method}|".encode() + request

        return grpc.unary_unary_rpc_method_handler(behaviour)

    async def start(self) -> GrpcReplica:
        self.server = grpc.aio.server(handlers=[self])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return self

    @property
    def endpoint(self) -> Endpoint:
        # The HTTP side is never used here; the label points the proxy at the gRPC port.
        return Endpoint.from_url(f"http://127.0.0.1:{self.port}", labels={"grpc_port": str(self.port)})

    async def stop(self) -> None:
        await self.server.stop(0)


@dataclass
class Front:
    balancer: Balancer
    metrics: GatewayMetrics
    channel: grpc.aio.Channel

    async def call(self, method: str = INFER, request: bytes = b"x", **kwargs: Any) -> bytes:
        response: bytes = await self.channel.unary_unary(method)(request, **kwargs)
        return response


StartFront = Callable[..., Awaitable[tuple[Front, list[GrpcReplica]]]]


@pytest.fixture
async def front() -> AsyncIterator[StartFront]:
    """The proxy on a free port in front of ``n`` replicas, and ONE client channel to it."""
    cleanup: list[Callable[[], Awaitable[Any]]] = []

    async def start(n: int, **balancer: Any) -> tuple[Front, list[GrpcReplica]]:
        fleet = [await GrpcReplica(f"g{i}").start() for i in range(n)]
        cleanup.extend(r.stop for r in fleet)
        metrics = GatewayMetrics()
        config = gateway_config(["http://127.0.0.1:1"], request_timeout_ms=2000)
        lb = Balancer(BalancerConfig(**balancer), rng=random.Random(3), observer=metrics)
        for replica in fleet:
            lb.apply(Insert(replica.endpoint))
        proxy = GrpcProxy(config, lb, metrics)
        server, port = await start_grpc_server(proxy, "127.0.0.1", 0)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        cleanup.extend([channel.close, lambda: server.stop(0), proxy.close])
        return Front(lb, metrics, channel), fleet

    yield start
    for step in reversed(cleanup):
        await step()


async def test_calls_on_one_channel_spread_across_replicas(front: StartFront) -> None:
    gw, fleet = await front(2)
    replies = await asyncio.gather(*(gw.call(request=str(i).encode()) for i in range(20)))
    replies += [await gw.call(request=b"seq") for _ in range(20)]
    assert all(r.split(b"|")[1] == INFER.encode() for r in replies)
    assert sorted(r.split(b"|")[2] for r in replies[:20]) == sorted(str(i).encode() for i in range(20))
    assert len(fleet[0].calls) + len(fleet[1].calls) == 40
    assert min(len(fleet[0].calls), len(fleet[1].calls)) >= 5


async def test_every_service_method_is_forwarded(front: StartFront) -> None:
    gw, _ = await front(1)
    for method in ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer"):
        assert await gw.call(SERVICE + method, b"q") == f"g0|{SERVICE}{method}|q".encode()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.call("/other.Service/Method")
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_stream_stays_on_one_replica(front: StartFront) -> None:
    gw, fleet = await front(2)

    async def requests() -> AsyncIterator[bytes]:
        for i in range(3):
            yield str(i).encode()

    replies = [reply async for reply in gw.channel.stream_stream(STREAM)(requests())]
    (replica,) = [r for r in fleet if r.calls]
    assert replies == [f"{replica.name}|{i}".encode() for i in range(3)]
    assert replica.calls == [STREAM]


async def test_unavailable_replica_is_retried_on_another(front: StartFront) -> None:
    gw, (busy, idle) = await front(2, policy="round-robin")
    busy.mode = "unavailable"
    assert [await gw.call() for _ in range(6)] == [b"g1|" + INFER.encode() + b"|x"] * 6
    assert len(busy.calls) >= 1 and len(idle.calls) == 6
    assert gw.metrics.retries._value.get() == len(busy.calls)


async def test_stopped_replica_is_retried_on_another(front: StartFront) -> None:
    gw, (dead, _) = await front(2, policy="round-robin")
    await dead.stop()
    assert [await gw.call() for _ in range(6)] == [b"g1|" + INFER.encode() + b"|x"] * 6


async def test_other_errors_pass_through_and_are_not_retried(front: StartFront) -> None:
    gw, fleet = await front(2)
    for replica in fleet:
        replica.mode = "invalid"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.call()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "input 'x' has the wrong shape"
    assert len(fleet[0].calls) + len(fleet[1].calls) == 1


async def test_no_replica_is_unavailable(front: StartFront) -> None:
    gw, _ = await front(0)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.call()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no healthy replica" in (info.value.details() or "")


async def test_client_deadline_is_forwarded(front: StartFront) -> None:
    gw, (replica,) = await front(1)
    replica.mode = "hang"
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.call(timeout=0.2)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 1.0


async def test_metadata_trace_and_reported_load(front: StartFront) -> None:
    gw, (replica,) = await front(1)
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await gw.call(metadata=(("traceparent", trace), ("x-request-id", "abc"), ("x-tenant", "t1")))
    sent = parse_traceparent(replica.metadata["traceparent"])
    assert sent is not None and sent.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert sent.parent_id != "00f067aa0ba902b7"
    assert (replica.metadata["x-request-id"], replica.metadata["x-tenant"]) == ("abc", "t1")
    (row,) = gw.balancer.snapshot()
    assert row["reported_queue_depth"] == 4
    assert row["pending"] == 0


def test_grpc_target_uses_label_or_port_offset() -> None:
    assert grpc_target(Endpoint.from_url("http://10.0.0.5:8000"), 1) == "10.0.0.5:8001"
    assert grpc_target(Endpoint.from_url("http://[::1]:8000"), 1) == "[::1]:8001"
    labelled = Endpoint.from_url("http://h:8000", labels={"grpc_port": "9000"})
    assert grpc_target(labelled, 1) == "h:9000"
