"""Connection guards on real sockets: slowloris heads are cut off, idle keep-alive is not, and the
connection cap answers 503."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from fleetserve.gateway.edge.config import InputLimits
from fleetserve.gateway.edge.connections import GuardedTCPSite
from fleetserve.gateway.edge.limits import server_kwargs
from tests.support.jwt_keys import echo
from tests.support.waiting import until

HEAD_TIMEOUT = 0.5
REQUEST = b"GET /v2/models HTTP/1.1\r\nHost: t\r\n\r\n"


class Recorder:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def rejected(self, reason: str) -> None:
        self.reasons.append(reason)


Start = Callable[..., Awaitable[tuple[GuardedTCPSite, Recorder]]]


@pytest.fixture
async def guarded() -> AsyncIterator[Start]:
    runners: list[web.AppRunner] = []

    async def start(**overrides: float) -> tuple[GuardedTCPSite, Recorder]:
        settings = {"header_read_timeout_s": HEAD_TIMEOUT, "keepalive_timeout_s": 5.0, **overrides}
        limits = InputLimits(**settings)  # type: ignore[arg-type]
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", echo)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1, **server_kwargs(limits))
        await runner.setup()
        runners.append(runner)
        recorder = Recorder()
        site = GuardedTCPSite(runner, "127.0.0.1", 0, limits, recorder)
        await site.start()
        return site, recorder

    yield start
    for runner in runners:
        await runner.cleanup()


async def _read_response(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=3)
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head + await asyncio.wait_for(reader.readexactly(length), timeout=3)


async def _trickle(writer: asyncio.StreamWriter, interval: float = 0.1) -> None:
    with contextlib.suppress(ConnectionError):
        for i in range(100):
            writer.write(f"X-Slow-{i}: y\r\n".encode())
            await writer.drain()
            await asyncio.sleep(interval)


async def test_trickled_head_is_cut_off_with_408(guarded: Start) -> None:
    site, recorder = await guarded()
    reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
    started = time.monotonic()
    writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n")
    trickler = asyncio.create_task(_trickle(writer))
    try:
        answer = await asyncio.wait_for(reader.read(), timeout=5)  # read() returns at EOF
        elapsed = time.monotonic() - started
    finally:
        trickler.cancel()
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408")
    assert HEAD_TIMEOUT * 0.8 <= elapsed < HEAD_TIMEOUT + 1.0
    assert recorder.reasons == ["header_timeout"]


async def test_silent_connection_is_closed_without_an_answer(guarded: Start) -> None:
    site, recorder = await guarded()
    reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
    started = time.monotonic()
    try:
        answer = await asyncio.wait_for(reader.read(), timeout=5)
    finally:
        writer.close()
    assert answer == b""
    assert time.monotonic() - started < HEAD_TIMEOUT + 1.0
    assert recorder.reasons == ["header_timeout"]


async def test_idle_keepalive_outlives_the_head_timeout_and_a_trickled_second_head_does_not(
    guarded: Start,
) -> None:
    site, recorder = await guarded()
    reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
    try:
        writer.write(REQUEST)
        assert (await _read_response(reader)).startswith(b"HTTP/1.1 200")
        await asyncio.sleep(HEAD_TIMEOUT * 2)  # idle, not sending a head: keep-alive governs
        writer.write(REQUEST)
        assert (await _read_response(reader)).startswith(b"HTTP/1.1 200")
        assert recorder.reasons == []
        started = time.monotonic()
        writer.write(b"GET /again HTTP/1.1\r\n")
        trickler = asyncio.create_task(_trickle(writer))
        answer = await asyncio.wait_for(reader.read(), timeout=5)
        elapsed = time.monotonic() - started
        trickler.cancel()
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408")
    assert elapsed < HEAD_TIMEOUT + 1.0
    assert recorder.reasons == ["header_timeout"]


async def test_head_split_across_packets_within_the_deadline_is_served(guarded: Start) -> None:
    site, recorder = await guarded()
    reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
    try:
        for part in (REQUEST[:10], REQUEST[10:20], REQUEST[20:]):
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(HEAD_TIMEOUT / 5)
        assert (await _read_response(reader)).startswith(b"HTTP/1.1 200")
    finally:
        writer.close()
    assert recorder.reasons == []


async def test_connections_beyond_the_cap_get_503(guarded: Start) -> None:
    site, recorder = await guarded(max_connections=2, header_read_timeout_s=5.0)
    first = await asyncio.open_connection("127.0.0.1", site.port)
    second = await asyncio.open_connection("127.0.0.1", site.port)
    reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
    try:
        writer.write(REQUEST)
        answer = await asyncio.wait_for(reader.read(), timeout=3)
        assert answer.startswith(b"HTTP/1.1 503")
        assert b"too many open connections" in answer
        assert recorder.reasons == ["max_connections"]
        assert site.guard.active == 2
        first[1].close()
        await until(lambda: site.guard.active < 2, what="the closed connection left the count")
        r3, w3 = await asyncio.open_connection("127.0.0.1", site.port)
        w3.write(REQUEST)
        assert (await _read_response(r3)).startswith(b"HTTP/1.1 200")
        w3.close()
    finally:
        writer.close()
        second[1].close()


async def test_oversized_header_line_is_a_client_error(guarded: Start) -> None:
    site, _ = await guarded(max_header_bytes=1024)
    reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: t\r\nX-Huge: " + b"h" * 2000 + b"\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), timeout=3)
    finally:
        writer.close()
    status_line = answer.split(b"\r\n", 1)[0]
    assert status_line.endswith(b" 400 Bad Request")
    assert b"Got more than 1024 bytes" in answer
