"""Gateway test fixtures: scripted raw TCP servers, fake replicas (aiohttp apps and grpc.aio servers),
in-process gateways (with a gRPC listener too), a blackholed port.

Everything listens on 127.0.0.1 on a free port and is closed when the test ends; the classes behind the
fixtures live in ``tests/support``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import grpc.aio
import pytest

from fleetserve.gateway.balance import Remove
from fleetserve.gateway.server import GatewayHandle, serve_gateway
from tests.support.fake_replica import FakeReplica
from tests.support.gateways import StartGateway, gateway_config
from tests.support.grpc_replica import GrpcFront, GrpcReplica, StartGrpcFront
from tests.support.procs import free_port
from tests.support.rawserver import Handler, RawServer

# The gateway runs on uvloop when it is installed, so the data-plane tests run on both loops.
_BOTH_LOOPS = frozenset({"test_upstream.py", "test_http.py"})
_FORWARD_TESTS = Path(__file__).parent / "forward"


def pytest_asyncio_loop_factories(config: pytest.Config,
                                  item: pytest.Item) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
    if item.path.name in _BOTH_LOOPS and item.path.parent == _FORWARD_TESTS:
        try:
            import uvloop
        except ImportError:
            return factories
        factories["uvloop"] = uvloop.new_event_loop
    return factories


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[Handler], Awaitable[RawServer]]]:
    servers: list[RawServer] = []

    async def start(handler: Handler) -> RawServer:
        server = await RawServer(handler).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()


@pytest.fixture
def blackhole_url() -> Iterator[str]:
    """A listening port whose accept queue is full, so new connections hang in SYN-SENT."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(2):  # a backlog of 0 still queues one; Linux drops SYNs once the queue is full
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    yield f"http://127.0.0.1:{port}"
    for sock in [*fillers, listener]:
        sock.close()


@pytest.fixture
async def replicas() -> AsyncIterator[Callable[[int], Awaitable[list[FakeReplica]]]]:
    started: list[FakeReplica] = []

    async def start(n: int) -> list[FakeReplica]:
        new = [await FakeReplica(name=f"r{len(started) + i}").start() for i in range(n)]
        started.extend(new)
        return new

    yield start
    for replica in started:
        await replica.stop()


@pytest.fixture
async def gateway() -> AsyncIterator[StartGateway]:
    """Start in-process gateways (``serve_gateway``) in front of the given backend URLs."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(backends: Sequence[str], **overrides: Any) -> GatewayHandle:
            middlewares = overrides.pop("middlewares", None)
            config = gateway_config(backends, **overrides)
            return await stack.enter_async_context(
                serve_gateway(config, middlewares=middlewares, rng=random.Random(7)))

        yield start


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def grpc_front(gateway: StartGateway) -> AsyncIterator[StartGrpcFront]:
    """``n`` gRPC replicas behind an in-process gateway with a gRPC listener (``overrides``: GatewayConfig)."""
    cleanup: list[Callable[[], Awaitable[Any]]] = []

    async def start(n: int, **overrides: Any) -> tuple[GrpcFront, list[GrpcReplica]]:
        fleet = [await GrpcReplica(f"g{i}").start() for i in range(n)]
        cleanup.extend(r.stop for r in fleet)
        settings: dict[str, Any] = {"grpc_port": free_port(), "backend_grpc_port_offset": 0,
                                    "request_timeout_ms": 2000, **overrides}
        handle = await gateway([r.url for r in fleet] or ["http://127.0.0.1:1"], **settings)
        if not fleet:
            handle.balancer.apply(Remove(handle.balancer.endpoints()[0]))
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{handle.grpc_port}")
        cleanup.append(channel.close)
        return GrpcFront(handle, channel), fleet

    yield start
    for step in reversed(cleanup):
        await step()
