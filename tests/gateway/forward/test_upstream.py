"""The keep-alive pool against real local servers, well-behaved (aiohttp) and misbehaving (raw asyncio)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from fleetserve.gateway.forward.upstream import (
    ConnectError,
    ConnectTimeout,
    PoolConfig,
    PoolExhausted,
    ProtocolError,
    ResetBeforeResponse,
    ResponseIncomplete,
    ResponseTooLarge,
    UpstreamPool,
    UpstreamPools,
    UpstreamTimeout,
    parse_upstream_url,
)
from tests.support.clock import FakeClock
from tests.support.rawserver import Handler, RawServer, read_request, response
from tests.support.waiting import until

StartRaw = Callable[[Handler], Awaitable[RawServer]]


def keep_alive_server(body: bytes = b"hello", extra: str = "") -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(response(body, extra=extra))
            await writer.drain()

    return handler


async def test_keep_alive_connection_is_reused(raw_server: StartRaw) -> None:
    server = await raw_server(keep_alive_server(b"hello"))
    pool = UpstreamPool(server.url, PoolConfig())
    for _ in range(5):
        res = await pool.request("GET", "/v2/health/ready")
        assert (res.status, res.body) == (200, b"hello")
    assert server.connections == 1
    assert (pool.total, pool.idle) == (1, 1)
    await pool.close()


async def test_aiohttp_server_gets_exact_body_bytes_and_headers() -> None:
    seen: dict[str, object] = {}

    async def echo(request: web.Request) -> web.Response:
        seen["body"] = await request.read()
        seen["x"] = request.headers.get("X-Thing")
        seen["host"] = request.headers.get("Host")
        return web.Response(body=b"\x00\xff" * 1000, headers={"X-Reply": "yes"})

    app = web.Application()
    app.router.add_post("/v2/models/m/infer", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    pool = UpstreamPool(f"http://127.0.0.1:{port}", PoolConfig())
    payload = bytes(range(256)) * 400  # not UTF-8, > 64 KiB: sent as two writes
    res = await pool.request("POST", "/v2/models/m/infer", [("X-Thing", "a b")], payload)
    assert res.status == 200
    assert res.body == b"\x00\xff" * 1000
    assert res.header("x-reply") == "yes"
    assert seen == {"body": payload, "x": "a b", "host": f"127.0.0.1:{port}"}
    await pool.close()
    await runner.cleanup()


async def test_chunked_response(raw_server: StartRaw) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for part in (b"abc", b"defgh", b""):
                writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                await writer.drain()
                await asyncio.sleep(0)  # one chunk per loop turn: the client reads them apart

    server = await raw_server(handler)
    pool = UpstreamPool(server.url, PoolConfig())
    assert (await pool.request("GET", "/")).body == b"abcdefgh"
    assert (await pool.request("GET", "/")).body == b"abcdefgh"
    assert server.connections == 1
    await pool.close()


async def test_unframed_response_is_read_until_close(raw_server: StartRaw) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nX-A: 1\r\n\r\nuntil ")
        await writer.drain()
        writer.write(b"the end")

    server = await raw_server(handler)
    pool = UpstreamPool(server.url, PoolConfig())
    res = await pool.request("GET", "/")
    assert (res.status, res.body, res.headers) == (200, b"until the end", [("X-A", "1")])
    await until(lambda: pool.total == 0, what="the read-until-close connection is gone")
    await pool.close()


async def test_connection_close_is_honoured(raw_server: StartRaw) -> None:
    server = await raw_server(keep_alive_server(b"x", extra="Connection: close\r\n"))
    pool = UpstreamPool(server.url, PoolConfig())
    for _ in range(3):
        assert (await pool.request("GET", "/")).body == b"x"
    assert server.connections == 3
    assert pool.idle == 0
    await pool.close()


async def test_idle_connection_closed_by_peer_is_not_reused(raw_server: StartRaw) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response(b"once"))
        await writer.drain()  # then close while the client holds the connection idle

    server = await raw_server(handler)
    pool = UpstreamPool(server.url, PoolConfig())
    assert (await pool.request("GET", "/")).body == b"once"
    await until(lambda: pool.idle == 0, what="the pool saw the peer close its idle connection")
    assert (await pool.request("GET", "/")).body == b"once"
    assert server.connections == 2
    await pool.close()


async def test_stale_reused_connection_is_retried_once_on_a_fresh_one(raw_server: StartRaw) -> None:
    # Each connection answers one request, then closes when the next one arrives: the race where
    # the peer's idle close crosses our request on the wire.
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response(b"fresh", extra="Keep-Alive: timeout=5\r\n"))
        await writer.drain()
        await read_request(reader)

    server = await raw_server(handler)
    pool = UpstreamPool(server.url, PoolConfig())
    assert (await pool.request("POST", "/", body=b"1")).body == b"fresh"
    assert (await pool.request("POST", "/", body=b"2")).body == b"fresh"
    assert server.connections == 2
    await pool.close()


async def test_reset_on_a_fresh_connection_is_not_retried(raw_server: StartRaw) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    server = await raw_server(handler)
    pool = UpstreamPool(server.url, PoolConfig())
    with pytest.raises(ResetBeforeResponse):
        await pool.request("GET", "/")
    assert server.connections == 1
    assert pool.total == 0
    await pool.close()


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Len",
    ],
    ids=["content-length", "chunked", "head"],
)
async def test_truncated_response_is_incomplete_and_not_retried(raw_server: StartRaw, reply: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply)
        await writer.drain()

    server = await raw_server(handler)
    pool = UpstreamPool(server.url, PoolConfig())
    with pytest.raises(ResponseIncomplete):
        await pool.request("GET", "/")
    assert server.connections == 1
    await pool.close()


@pytest.mark.parametrize(
    "reply",
    [b"SPDY/9 OK\r\n\r\n", b"HTTP/1.1 2OO OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"],
)
async def test_garbage_response_is_a_protocol_error(raw_server: StartRaw, reply: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply)
        await writer.drain()
        await reader.read()

    server = await raw_server(handler)
    pool = UpstreamPool(server.url, PoolConfig())
    with pytest.raises(ProtocolError):
        await pool.request("GET", "/")
    await until(lambda: pool.total == 0, what="the connection that spoke garbage is gone")
    await pool.close()


async def test_bytes_after_a_complete_response_drop_the_connection(raw_server: StartRaw) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(response(b"ok") + b"junk")
            await writer.drain()

    server = await raw_server(handler)
    pool = UpstreamPool(server.url, PoolConfig())
    assert (await pool.request("GET", "/")).body == b"ok"
    assert (await pool.request("GET", "/")).body == b"ok"
    assert server.connections == 2
    await pool.close()


async def test_answer_before_the_body_was_sent_drops_the_connection(raw_server: StartRaw) -> None:
    async def early(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(response(b"", status="413 Payload Too Large"))
        await writer.drain()
        await asyncio.sleep(3600)  # never reads the body

    server = await raw_server(early)
    pool = UpstreamPool(server.url, PoolConfig())
    res = await pool.request("POST", "/", body=b"z" * (16 * 1024 * 1024))
    assert res.status == 413
    assert (pool.idle, pool.total) == (0, 0)  # unsent body bytes would poison the next request
    await pool.close()


async def test_interim_100_continue_is_skipped(raw_server: StartRaw) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + response(b"final", status="201 Created"))
        await writer.drain()
        await reader.read()

    server = await raw_server(handler)
    pool = UpstreamPool(server.url, PoolConfig())
    res = await pool.request("POST", "/", body=b"x")
    assert (res.status, res.body) == (201, b"final")
    await pool.close()


async def test_slow_response_times_out_and_the_connection_is_dropped(raw_server: StartRaw) -> None:
    delays = [0.3, 0.0]
    late_answer_written = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        delay = delays.pop(0)
        while True:
            await read_request(reader)
            await asyncio.sleep(delay)  # the slow replica
            try:
                writer.write(response(f"after {delay}".encode()))
                await writer.drain()
            finally:
                if delay:
                    late_answer_written.set()

    server = await raw_server(handler)
    pool = UpstreamPool(server.url, PoolConfig(read_timeout_s=0.05))
    with pytest.raises(UpstreamTimeout):
        await pool.request("GET", "/")
    await asyncio.wait_for(late_answer_written.wait(), 10)  # a reused connection would now read it
    res = await pool.request("GET", "/")
    assert res.body == b"after 0.0"
    assert server.connections == 2  # the timed-out connection's late answer was never read
    await pool.close()


async def test_request_timeout_overrides_a_longer_read_timeout(raw_server: StartRaw) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(10)

    server = await raw_server(handler)
    pool = UpstreamPool(server.url, PoolConfig(read_timeout_s=30))
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(UpstreamTimeout):
        await pool.request("GET", "/", timeout_s=0.05)
    assert loop.time() - started < 1.0
    await pool.close()


async def test_connection_refused_is_a_connect_error(unused_tcp_port: int) -> None:
    pool = UpstreamPool(f"http://127.0.0.1:{unused_tcp_port}", PoolConfig())
    with pytest.raises(ConnectError) as info:
        await pool.request("GET", "/")
    assert not isinstance(info.value, UpstreamTimeout)
    assert pool.total == 0
    await pool.close()


async def test_connect_timeout(blackhole_url: str) -> None:
    pool = UpstreamPool(blackhole_url, PoolConfig(connect_timeout_s=0.05))
    with pytest.raises(ConnectTimeout):
        await pool.request("GET", "/")
    assert pool.total == 0
    await pool.close()


async def test_response_larger_than_the_bound_is_refused(raw_server: StartRaw) -> None:
    server = await raw_server(keep_alive_server(b"x" * 5000))
    pool = UpstreamPool(server.url, PoolConfig(max_response_bytes=4096))
    with pytest.raises(ResponseTooLarge):
        await pool.request("GET", "/")
    await pool.close()


async def test_endless_response_head_is_refused(raw_server: StartRaw) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nX-Big: ")
        for _ in range(100):
            writer.write(b"a" * 1024)
            await writer.drain()

    server = await raw_server(handler)
    pool = UpstreamPool(server.url, PoolConfig(max_header_bytes=8192))
    with pytest.raises(ProtocolError, match="exceeds 8192"):
        await pool.request("GET", "/")
    await pool.close()


async def test_unsolicited_bytes_on_an_idle_connection_drop_it(raw_server: StartRaw) -> None:
    back_in_the_pool = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response(b"a"))
        await writer.drain()
        await back_in_the_pool.wait()
        writer.write(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
        await writer.drain()
        await reader.read()

    server = await raw_server(handler)
    pool = UpstreamPool(server.url, PoolConfig())
    assert (await pool.request("GET", "/")).body == b"a"
    assert pool.idle == 1
    back_in_the_pool.set()
    await until(lambda: (pool.idle, pool.total) == (0, 0), what="the idle connection that spoke unasked is gone")
    assert (await pool.request("GET", "/")).body == b"a"
    assert server.connections == 2
    await pool.close()


async def test_idle_timeout_uses_the_injected_clock(raw_server: StartRaw) -> None:
    clock = FakeClock(100.0)
    server = await raw_server(keep_alive_server())
    pool = UpstreamPool(server.url, PoolConfig(idle_timeout_s=10), clock=clock)
    await pool.request("GET", "/")
    clock.advance(9.0)
    await pool.request("GET", "/")
    assert server.connections == 1
    clock.advance(10.0)
    await pool.request("GET", "/")
    assert server.connections == 2
    await pool.close()


def gated_server(gate: asyncio.Event, arrived: list[bytes] | None = None) -> Handler:
    """Answers each request once ``gate`` is set; appends each request's head to ``arrived`` as it comes in."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head, _ = await read_request(reader)
            if arrived is not None:
                arrived.append(head)
            await gate.wait()
            writer.write(response(b"done"))
            await writer.drain()

    return handler


async def test_max_total_bounds_connections_and_waiters_get_the_released_one(raw_server: StartRaw) -> None:
    gate, arrived = asyncio.Event(), list[bytes]()
    server = await raw_server(gated_server(gate, arrived))
    pool = UpstreamPool(server.url, PoolConfig(max_total=2, max_idle=2))
    tasks = [asyncio.create_task(pool.request("GET", "/")) for _ in range(6)]
    await until(lambda: len(arrived) == 2 and pool.waiting == 4, what="two requests sent, four waiting")
    assert pool.total == 2
    gate.set()
    results = await asyncio.gather(*tasks)
    assert [r.body for r in results] == [b"done"] * 6
    assert server.connections == 2
    await pool.close()


async def test_waiter_queue_is_bounded(raw_server: StartRaw) -> None:
    gate = asyncio.Event()
    server = await raw_server(gated_server(gate))
    pool = UpstreamPool(server.url, PoolConfig(max_total=1, max_idle=1, max_waiters=1))
    first = asyncio.create_task(pool.request("GET", "/"))
    second = asyncio.create_task(pool.request("GET", "/"))
    await until(lambda: pool.waiting == 1, what="the second request waits for the one connection")
    with pytest.raises(PoolExhausted):
        await pool.request("GET", "/")
    gate.set()
    assert [r.status for r in await asyncio.gather(first, second)] == [200, 200]
    await pool.close()


async def test_waiting_for_a_connection_times_out_without_leaking_slots(raw_server: StartRaw) -> None:
    gate, arrived = asyncio.Event(), list[bytes]()
    server = await raw_server(gated_server(gate, arrived))
    pool = UpstreamPool(server.url, PoolConfig(max_total=1, max_idle=1))
    busy = asyncio.create_task(pool.request("GET", "/"))
    await until(lambda: len(arrived) == 1, what="the first request holds the one connection")
    with pytest.raises(UpstreamTimeout):
        await pool.request("GET", "/", timeout_s=0.05)
    assert pool.waiting == 0
    waiting = asyncio.create_task(pool.request("GET", "/"))
    await until(lambda: pool.waiting == 1, what="a request waits for the connection")
    waiting.cancel()
    gate.set()
    assert (await busy).status == 200
    assert (await pool.request("GET", "/")).status == 200
    assert (pool.total, pool.idle) == (1, 1)
    assert server.connections == 1
    await pool.close()


async def test_cancelled_request_drops_its_connection(raw_server: StartRaw) -> None:
    gate, arrived = asyncio.Event(), list[bytes]()
    server = await raw_server(gated_server(gate, arrived))
    pool = UpstreamPool(server.url, PoolConfig())
    task = asyncio.create_task(pool.request("GET", "/"))
    await until(lambda: len(arrived) == 1, what="the request reached the server")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: pool.total == 0, what="the cancelled request's connection is dropped")
    gate.set()
    assert (await pool.request("GET", "/")).body == b"done"
    assert server.connections == 2
    await pool.close()


async def test_closed_pool_refuses_requests(raw_server: StartRaw) -> None:
    server = await raw_server(keep_alive_server())
    pool = UpstreamPool(server.url, PoolConfig())
    await pool.request("GET", "/")
    await pool.close()
    assert pool.idle == 0
    with pytest.raises(ConnectError, match="closed"):
        await pool.request("GET", "/")


async def test_header_injection_is_refused(raw_server: StartRaw) -> None:
    server = await raw_server(keep_alive_server())
    pool = UpstreamPool(server.url, PoolConfig())
    for headers in ([("X-A", "1\r\nX-Evil: 1")], [("X-A", "1\rX")], [("X-A", "\n")]):
        with pytest.raises(ValueError, match="CR, LF"):
            await pool.request("GET", "/", headers)
    with pytest.raises(ValueError, match="request line"):
        await pool.request("GET", "/a b")
    with pytest.raises(ValueError, match="request line"):
        await pool.request("GE T", "/")
    assert server.connections == 0
    await pool.close()


async def test_base_path_of_the_upstream_url_prefixes_requests(raw_server: StartRaw) -> None:
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await read_request(reader)
        heads.append(head)
        writer.write(response())
        await writer.drain()

    server = await raw_server(handler)
    pool = UpstreamPool(server.url + "/prefix/", PoolConfig())
    await pool.request("GET", "/v2/health/ready?x=1")
    assert heads[0].startswith(b"GET /prefix/v2/health/ready?x=1 HTTP/1.1\r\n")
    await pool.close()


def test_parse_upstream_url() -> None:
    assert parse_upstream_url("http://10.0.0.5:8000") == ("10.0.0.5", 8000, "")
    assert parse_upstream_url("http://example.org/api/") == ("example.org", 80, "/api")
    assert parse_upstream_url("http://[::1]:9000") == ("::1", 9000, "")
    for bad, why in [("https://a:1", "only http"), ("http://a:1?q=1", "query"), ("http://:80", "no host"),
                     ("http://a:99999", "a:99999"), ("ftp://a", "only http")]:
        with pytest.raises(ValueError, match=why):
            parse_upstream_url(bad)


@pytest.mark.parametrize(
    "kwargs, field",
    [({"max_total": 0}, "max_total"), ({"max_idle": 5, "max_total": 4}, "max_idle"),
     ({"connect_timeout_s": 0}, "connect_timeout_s"), ({"max_response_bytes": 0}, "max_response_bytes"),
     ({"max_waiters": 0}, "max_waiters"), ({"idle_timeout_s": -1}, "idle_timeout_s")],
)
def test_pool_config_validation(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        PoolConfig(**kwargs)  # type: ignore[arg-type]


async def test_pools_create_per_url_and_retain_closes_the_rest(raw_server: StartRaw) -> None:
    a = await raw_server(keep_alive_server(b"a"))
    b = await raw_server(keep_alive_server(b"b"))
    pools = UpstreamPools(PoolConfig())
    assert pools.get(a.url) is pools.get(a.url)
    assert (await pools.get(a.url).request("GET", "/")).body == b"a"
    pool_b = pools.get(b.url)
    assert (await pool_b.request("GET", "/")).body == b"b"
    await pools.retain([a.url])
    assert pools.urls() == [a.url]
    with pytest.raises(ConnectError):
        await pool_b.request("GET", "/")
    with pytest.raises(ConnectError, match="only http"):
        pools.get("https://127.0.0.1:1")
    await pools.close()
    assert pools.urls() == []
