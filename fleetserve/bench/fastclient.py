"""A lean HTTP/1.1 keep-alive client: asyncio Protocols and httptools' response parser (llhttp).

Load generation needs far less than a general client: the request bytes are prepared once per
pooled payload, a response is reduced to its status code (the body is parsed for framing and
dropped), and connections come from a bounded LIFO pool. That keeps the per-request cost to one
write, one parser feed and one future, so one core can drive a gateway at tens of thousands of
requests per second, where aiohttp's client would saturate first.

Framing comes from ``Content-Length`` or chunked encoding; a response cut off by the connection
closing counts as a ``connection`` error. Plain ``http://`` only: use the aiohttp client for TLS.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import cast
from urllib.parse import urlsplit

import httptools

from fleetserve.bench.client import CONNECT, CONNECTION, PROTOCOL, TIMEOUT, ClientConfig, RequestError
from fleetserve.bench.workloads import Payload

USER_AGENT = "fleetserve-bench"
SWEEP_MAX_S = 0.05


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time (no pipelining)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.keep_alive = True
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[int] | None = None
        self.deadline = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(RequestError(PROTOCOL, str(exc)))
            self.close()

    def on_message_complete(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is None:
            # A response nobody asked for: the stream is out of step, never reuse it.
            self.close()
            return
        self.keep_alive = self._parser.should_keep_alive()
        if not waiter.done():
            waiter.set_result(self._parser.get_status_code())

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(RequestError(CONNECTION, str(exc) if exc else "closed by server before the response"))

    def _fail(self, error: RequestError) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def request(self, raw: bytes) -> asyncio.Future[int]:
        assert self.transport is not None
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        self.transport.write(raw)
        return waiter

    def expire(self, timeout_s: float) -> None:
        self._fail(RequestError(TIMEOUT, f"no response within {timeout_s} s"))
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()


class FastClient:
    """``prepare`` renders the full request bytes; ``send`` writes them on a pooled connection.

    At most ``connections`` connections exist; a request finding none idle waits in FIFO order for
    one (that wait is part of its latency and of its timeout). Timeouts are enforced by one sweeper
    task every ``timeout_s / 10`` (at most 50 ms) rather than a timer per request, which costs
    a tenth of the per-request time at high rates; a timeout therefore fires up to that much late.
    """

    def __init__(self, config: ClientConfig) -> None:
        parts = urlsplit(config.url)
        if parts.scheme != "http":
            raise ValueError(f"the fast client speaks plain http only, got {config.url!r}; use aiohttp")
        self._config = config
        self._host = parts.hostname or ""
        self._port = parts.port or 80
        self._authority = parts.netloc
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()
        # Connections that exist or are being opened, idle ones included (dead idle ones until checked).
        self._total = 0
        # (deadline, future): deadlines grow in arrival order because the timeout is fixed.
        self._waiters: deque[tuple[float, asyncio.Future[_Connection | None]]] = deque()
        self._sweeper: asyncio.Task[None] | None = None
        self._sweep_s = min(SWEEP_MAX_S, config.timeout_s / 10)

    def prepare(self, payload: Payload) -> bytes:
        lines = [
            f"POST {self._config.base_path}{payload.path} HTTP/1.1",
            f"Host: {self._authority}",
            f"User-Agent: {USER_AGENT}",
            f"Content-Type: {payload.content_type}",
            f"Content-Length: {len(payload.body)}",
        ]
        lines += [f"{k}: {v}" for k, v in (*payload.headers, *self._config.headers.items())]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload.body

    @property
    def open_idle(self) -> int:
        """Idle connections that their server has not closed (as far as this client has seen)."""
        return sum(not conn.closed for conn in self._idle)

    async def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep())

    async def send(self, prepared: object) -> int:
        deadline = time.monotonic() + self._config.timeout_s
        conn = self._take_idle() or await self._acquire(deadline)
        conn.deadline = deadline
        self._busy.add(conn)
        try:
            status = await conn.request(cast(bytes, prepared))
        except BaseException:
            conn.close()
            self._release(None)
            raise
        finally:
            self._busy.discard(conn)
        if conn.keep_alive and not conn.closed:
            self._release(conn)
        else:
            conn.close()
            self._release(None)
        return status

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
            self._total -= 1
        return None

    async def _acquire(self, deadline: float) -> _Connection:
        while True:
            conn = self._take_idle()
            if conn is not None:
                return conn
            if self._total < self._config.connections:
                self._total += 1
                try:
                    return await self._connect(deadline)
                except BaseException:
                    self._release(None)
                    raise
            waiter: asyncio.Future[_Connection | None] = asyncio.get_running_loop().create_future()
            self._waiters.append((deadline, waiter))
            try:
                handed = await waiter
            except BaseException:
                # Cancelled just after a connection was handed over: pass it on, do not leak it.
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    self._release(waiter.result())
                raise
            if handed is not None:
                return handed

    async def _connect(self, deadline: float) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(deadline - time.monotonic()):
                _, conn = await loop.create_connection(_Connection, self._host, self._port)
        except TimeoutError:
            raise RequestError(TIMEOUT, f"connect took over {self._config.timeout_s} s") from None
        except OSError as exc:
            raise RequestError(CONNECT, str(exc)) from exc
        return conn

    def _release(self, conn: _Connection | None) -> None:
        """Hand ``conn`` (or, with None, the slot of a closed connection) to the oldest waiter."""
        if conn is None:
            self._total -= 1
        while self._waiters:
            _, waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if conn is not None:
            self._idle.append(conn)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_s)
            now = time.monotonic()
            for conn in [c for c in self._busy if c.deadline <= now]:
                conn.expire(self._config.timeout_s)
            while self._waiters and self._waiters[0][0] <= now:
                _, waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(RequestError(TIMEOUT, "no free connection in time"))

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        for conn in [*self._idle, *self._busy]:
            conn.close()
        self._idle.clear()
