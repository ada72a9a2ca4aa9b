"""Gateway test fixtures: scripted raw TCP servers, fake replicas (aiohttp apps), in-process gateways.

Everything listens on 127.0.0.1 on a free port and is closed when the test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from fleetserve.gateway.balancer import BalancerConfig
from fleetserve.gateway.config import GatewayConfig
from fleetserve.gateway.server import GatewayHandle, serve_gateway

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
# The gateway runs on uvloop when it is installed, so the data-plane tests run on both loops.
_BOTH_LOOPS = frozenset({"test_upstream.py", "test_proxy.py"})


def pytest_asyncio_loop_factories(config: pytest.Config,
                                  item: pytest.Item) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
    if item.path.name in _BOTH_LOOPS and item.path.parent == Path(__file__).parent:
        try:
            import uvloop
        except ImportError:
            return factories
        factories["uvloop"] = uvloop.new_event_loop
    return factories


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head (up to the blank line) and its Content-Length body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    body = await reader.readexactly(length) if length else b""
    return head, body


def response(body: bytes = b"ok", status: str = "200 OK", extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


class RawServer:
    """A TCP server running ``handler`` on each connection; counts the connections it accepted."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.url = ""

    async def start(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the test is over: asyncio logs a handler task that raised
        finally:
            writer.close()
            self._tasks.discard(task)

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()


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


@dataclass
class FakeReplica:
    """A fake KServe replica: answers ``mode`` and reports its load in response headers.

    Modes: ``ok`` (200 JSON naming the replica, after ``delay_s``), ``overloaded`` (503), ``bad``
    (400), ``hang`` (never answers), ``reset`` (closes the connection without answering),
    ``unready`` (health 503).
    """

    name: str
    mode: str = "ok"
    queue_depth: int = 0
    delay_s: float = 0.0
    hits: int = 0
    last_headers: dict[str, str] = field(default_factory=dict)
    last_body: bytes = b""
    url: str = ""
    runner: web.AppRunner | None = None

    async def _infer(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        self.last_headers = dict(request.headers)
        self.last_body = await request.read()
        load = {"X-Fleetserve-Queue-Depth": str(self.queue_depth), "X-Fleetserve-Inflight": "1"}
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.mode == "reset":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if self.mode == "overloaded":
            load["Retry-After"] = "1"
            return web.json_response({"error": "queue full"}, status=503, headers=load)
        if self.mode == "bad":
            return web.json_response({"error": "bad input from client"}, status=400, headers=load)
        payload = {"replica": self.name, "path": request.path_qs, "echo_len": len(self.last_body)}
        return web.Response(body=json.dumps(payload).encode(), content_type="application/json", headers=load)

    async def _ready(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.mode == "unready" else 200)

    async def start(self) -> FakeReplica:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v2/health/ready", self._ready)
        app.router.add_route("*", "/v2/{tail:.*}", self._infer)
        app.router.add_route("*", "/v2", self._infer)
        app.router.add_post("/inference", self._infer)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


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


StartGateway = Callable[..., Awaitable[GatewayHandle]]


def gateway_config(backends: Sequence[str], **overrides: Any) -> GatewayConfig:
    """A test gateway on a free port; health checks off unless asked for (tests drive the state)."""
    balancer = overrides.pop("balancer", None) or BalancerConfig()
    settings: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "backends": tuple(backends),
                                "health_checks": False, "balancer": balancer}
    settings.update(overrides)
    return GatewayConfig(**settings)


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
