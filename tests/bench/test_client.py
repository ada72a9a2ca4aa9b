"""Contract tests every load generator client passes (parametrized over the registry)."""

from __future__ import annotations

import asyncio
import time

import pytest

from fleetserve.bench.client import CLIENTS, ClientConfig, HttpClient, RequestError, client_name, open_client
from fleetserve.bench.workloads import Payload
from tests.support.rawserver import read_request, serving
from tests.support.target import TargetServer, refused_url

PAYLOAD = Payload("/inference", b'{"texts": ["red shoe"]}', headers=(("X-Extra", "1"),))


@pytest.fixture(params=sorted(CLIENTS))
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def started(name: str, url: str, **kwargs: object) -> HttpClient:
    return await open_client(name, ClientConfig(url, **kwargs))  # type: ignore[arg-type]


async def test_sends_body_headers_and_path_prefix(name: str, server: TargetServer) -> None:
    client = await started(name, server.url + "/prefix/", headers={"Authorization": "Bearer t"})
    try:
        assert await client.send(client.prepare(PAYLOAD)) == 200
    finally:
        await client.close()
    assert server.seen.paths == ["/prefix/inference"]
    assert server.seen.bodies == [PAYLOAD.body]
    headers = server.seen.headers[0]
    assert headers["Authorization"] == "Bearer t" and headers["X-Extra"] == "1"
    assert headers["Content-Type"] == "application/json"


async def test_returns_error_statuses_and_keeps_the_connection(name: str, server: TargetServer) -> None:
    server.behaviour.status = 503
    client = await started(name, server.url, connections=1)
    try:
        statuses = [await client.send(client.prepare(PAYLOAD)) for _ in range(20)]
    finally:
        await client.close()
    assert statuses == [503] * 20
    assert len(server.seen.peers) == 1, "keep-alive: one connection for sequential requests"


async def test_bounded_connections(name: str, server: TargetServer) -> None:
    server.behaviour.delay_s = 0.02
    client = await started(name, server.url, connections=3)
    try:
        prepared = client.prepare(PAYLOAD)
        statuses = await asyncio.gather(*(client.send(prepared) for _ in range(30)))
    finally:
        await client.close()
    assert statuses == [200] * 30
    assert server.seen.peak_inflight == 3 and len(server.seen.peers) == 3


async def test_connection_refused_is_a_connect_error(name: str) -> None:
    client = await started(name, refused_url())
    try:
        with pytest.raises(RequestError) as info:
            await client.send(client.prepare(PAYLOAD))
    finally:
        await client.close()
    assert info.value.kind == "connect"


async def test_timeout(name: str, server: TargetServer) -> None:
    server.behaviour.delay_s = 1.0
    client = await started(name, server.url, timeout_s=0.2)
    begin = time.monotonic()
    try:
        with pytest.raises(RequestError) as info:
            await client.send(client.prepare(PAYLOAD))
    finally:
        await client.close()
    assert info.value.kind == "timeout"
    assert 0.2 <= time.monotonic() - begin < 0.6


async def test_connection_closed_before_the_response(name: str) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        writer.close()

    async with serving(hang_up) as server:
        client = await started(name, server.url)
        try:
            with pytest.raises(RequestError) as info:
                await client.send(client.prepare(PAYLOAD))
        finally:
            await client.close()
        assert info.value.kind == "connection"


async def test_chunked_and_connection_close_responses(name: str) -> None:
    connections = 0

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        await read_request(reader)
        writer.write(b"HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    async with serving(answer) as server:
        client = await started(name, server.url, connections=1)
        try:
            prepared = client.prepare(PAYLOAD)
            assert [await client.send(prepared) for _ in range(4)] == [201, 202, 201, 202]
        finally:
            await client.close()
    assert connections == 2


def test_auto_picks_by_scheme() -> None:
    assert client_name("auto", "http://h:1") == "fast"
    assert client_name("auto", "https://h:1") == "aiohttp"
    with pytest.raises(ValueError, match="unknown client"):
        client_name("curl", "http://h:1")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "ftp://h/"}, "url"),
        ({"url": "http://h:1/?q=1"}, "query"),
        ({"connections": 0}, "connections"),
        ({"timeout_s": 0}, "timeout"),
        ({"headers": {"X-A": "b\r\nInjected: 1"}}, "invalid header"),
    ],
)
def test_client_config_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClientConfig(**{"url": "http://h:1", **kwargs})  # type: ignore[arg-type]


async def test_fast_client_refuses_https() -> None:
    with pytest.raises(ValueError, match="plain http"):
        await open_client("fast", ClientConfig("https://h:1"))
