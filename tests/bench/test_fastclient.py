"""Connection-pool behaviour of the fast client beyond the shared client contract."""

from __future__ import annotations

import asyncio

import pytest

from fleetserve.bench.client import ClientConfig, RequestError
from fleetserve.bench.fastclient import FastClient
from fleetserve.bench.workloads import Payload
from tests.support.rawserver import read_request, serving
from tests.support.target import TargetServer
from tests.support.waiting import until

PAYLOAD = Payload("/inference", b"{}")


async def fast(url: str, **kwargs: object) -> FastClient:
    client = FastClient(ClientConfig(url, **kwargs))  # type: ignore[arg-type]
    await client.start()
    return client


def test_prepared_request_bytes() -> None:
    client = FastClient(ClientConfig("http://127.0.0.1:9/base", headers={"X-Key": "k"}))
    payload = Payload("/v2/models/m/infer", b"\x00\x01", "application/octet-stream", (("H-Len", "2"),))
    head, _, body = client.prepare(payload).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /base/v2/models/m/infer HTTP/1.1"
    assert {"Host: 127.0.0.1:9", "Content-Length: 2", "Content-Type: application/octet-stream"} <= set(lines)
    assert {"H-Len: 2", "X-Key: k"} <= set(lines)
    assert body == b"\x00\x01"


async def test_waiting_for_a_connection_times_out_and_the_pool_recovers(server: TargetServer) -> None:
    server.behaviour.delay_s = 0.5
    client = await fast(server.url, connections=1, timeout_s=0.2)
    try:
        prepared = client.prepare(PAYLOAD)
        results = await asyncio.gather(*(client.send(prepared) for _ in range(3)), return_exceptions=True)
        assert [r.kind for r in results if isinstance(r, RequestError)] == ["timeout"] * 3
        server.behaviour.delay_s = 0.0
        assert await client.send(prepared) == 200
    finally:
        await client.close()


async def test_cancelled_requests_free_their_connection(server: TargetServer) -> None:
    server.behaviour.delay_s = 0.3
    client = await fast(server.url, connections=1)
    try:
        prepared = client.prepare(PAYLOAD)
        holders = [asyncio.create_task(client.send(prepared)) for _ in range(2)]
        await until(lambda: server.seen.inflight == 1, what="one request holds the one connection")
        for task in holders:
            task.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
        server.behaviour.delay_s = 0.0
        assert await asyncio.wait_for(client.send(prepared), 2) == 200
    finally:
        await client.close()


async def test_idle_connections_closed_by_the_server_are_replaced() -> None:
    connections = 0

    async def one_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    async with serving(one_then_close) as server:
        client = await fast(server.url, connections=2)
        try:
            for _ in range(3):
                assert await client.send(client.prepare(PAYLOAD)) == 200
                # As between real requests, the server's FIN arrives before the next one goes out.
                await until(lambda: client.open_idle == 0, what="the client saw the server close")
        finally:
            await client.close()
    assert connections == 3


async def test_garbage_response_is_a_protocol_error() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()

    async with serving(garbage) as server:
        client = await fast(server.url)
        try:
            with pytest.raises(RequestError) as info:
                await client.send(client.prepare(PAYLOAD))
        finally:
            await client.close()
    assert info.value.kind == "protocol"
