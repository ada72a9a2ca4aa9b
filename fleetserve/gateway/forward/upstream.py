"""Bounded keep-alive HTTP/1.1 connection pools, one per upstream, that the gateway proxies through.

Why not aiohttp's client: measured per proxied request, aiohttp server + aiohttp client costs about
149 µs of CPU, aiohttp server + this pool (on ``http1.Http1Connection``, the httptools parser) about
50 µs. The pool does only what a reverse proxy needs, bounded everywhere:

- per upstream at most ``max_total`` connections (idle + busy + connecting), at most ``max_idle``
  kept idle, reused most-recent-first (the ones most likely still open), idle ones older than
  ``idle_timeout_s`` dropped, and at most ``max_waiters`` requests queued for a connection;
- a reused keep-alive connection that the peer closed before any byte of the response arrived is
  retried once on a fresh connection (RFC 9112 §9.3.1): servers close idle connections at will;
- request bodies go out as the caller's bytes, heads as :mod:`.request_head` encodes them.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from fleetserve.gateway.forward.http1 import (
    ConnectError,
    ConnectTimeout,
    Http1Connection,
    PoolExhausted,
    ProtocolError,
    ResetBeforeResponse,
    ResponseIncomplete,
    ResponseTooLarge,
    UpstreamError,
    UpstreamResponse,
    UpstreamTimeout,
)
from fleetserve.gateway.forward.request_head import RequestHead, parse_upstream_url

__all__ = [
    "ConnectError",
    "ConnectTimeout",
    "PoolConfig",
    "PoolExhausted",
    "ProtocolError",
    "ResetBeforeResponse",
    "ResponseIncomplete",
    "ResponseTooLarge",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamPools",
    "UpstreamResponse",
    "UpstreamTimeout",
    "parse_upstream_url",
]


@dataclass(frozen=True)
class PoolConfig:
    """Limits of one upstream's pool; the timeouts are the most any one request may wait."""

    max_total: int = 256
    max_idle: int = 64
    max_waiters: int = 1024
    connect_timeout_s: float = 1.0
    read_timeout_s: float = 60.0
    idle_timeout_s: float = 30.0
    max_response_bytes: int = 64 * 1024 * 1024
    max_header_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        for name in ("max_total", "max_waiters", "max_response_bytes", "max_header_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"PoolConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.max_idle <= self.max_total:
            raise ValueError(f"PoolConfig.max_idle must be in [0, max_total={self.max_total}], "
                             f"got {self.max_idle}")
        for name in ("connect_timeout_s", "read_timeout_s", "idle_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"PoolConfig.{name} must be > 0, got {getattr(self, name)}")


class UpstreamPool:
    """Bounded keep-alive connections to one upstream ``http://host:port``."""

    def __init__(self, url: str, config: PoolConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.host, self.port, base_path = parse_upstream_url(url)
        self._head = RequestHead(self.host, self.port, base_path)
        self.config = config
        self.loop = asyncio.get_running_loop()
        self._clock = clock
        self._idle: list[Http1Connection] = []
        self._waiters: deque[asyncio.Future[Http1Connection | None]] = deque()
        self._total = 0
        self._closed = False

    @property
    def total(self) -> int:
        """Connections open, idle or busy, plus those being opened."""
        return self._total

    @property
    def idle(self) -> int:
        return len(self._idle)

    @property
    def waiting(self) -> int:
        """Requests queued for a connection (the pool is at ``max_total``)."""
        return len(self._waiters)

    async def request(self, method: str, target: str, headers: Sequence[tuple[str, str]] = (),
                      body: bytes = b"", *, timeout_s: float | None = None) -> UpstreamResponse:
        """Send one request and return the whole response; ``timeout_s`` bounds everything, retries too."""
        head = self._head.encode(method, target, headers, len(body))
        deadline = self.loop.time() + (timeout_s if timeout_s is not None else self.config.read_timeout_s)
        conn, reused = await self._acquire(deadline, fresh=False)
        try:
            return await self._exchange(conn, head, body, deadline)
        except ResetBeforeResponse:
            if not reused:
                raise
        conn, _ = await self._acquire(deadline, fresh=True)
        return await self._exchange(conn, head, body, deadline)

    async def close(self) -> None:
        """Close idle connections now, busy ones as they finish; fail requests waiting for one."""
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectError(f"the pool for {self.url} is closed"))
        while self._idle:
            self._discard(self._idle.pop())

    async def _exchange(self, conn: Http1Connection, head: bytes, body: bytes,
                        deadline: float) -> UpstreamResponse:
        try:
            timeout = min(self.config.read_timeout_s, deadline - self.loop.time())
            return await conn.exchange(head, body, timeout)
        finally:
            self._release(conn)

    async def _acquire(self, deadline: float, *, fresh: bool) -> tuple[Http1Connection, bool]:
        if self._closed:
            raise ConnectError(f"the pool for {self.url} is closed")
        if not fresh:
            conn = self._pop_idle()
            if conn is not None:
                return conn, True
        if self._total < self.config.max_total:
            self._total += 1
        else:
            handed = await self._wait(deadline)
            if handed is not None:
                if not fresh:
                    return handed, True
                handed.holds_slot = False  # keep its slot for the fresh connection below
                handed.abort()
        return await self._connect(deadline), False

    def _pop_idle(self) -> Http1Connection | None:
        now = self._clock()
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable and now - conn.idle_since < self.config.idle_timeout_s:
                return conn
            self._discard(conn)
        return None

    async def _wait(self, deadline: float) -> Http1Connection | None:
        """Wait for a busy connection to be handed over (or None: a freed slot to connect in)."""
        if len(self._waiters) >= self.config.max_waiters:
            raise PoolExhausted(f"{self.config.max_total} connections to {self.url} busy and "
                                f"{self.config.max_waiters} requests already waiting")
        waiter: asyncio.Future[Http1Connection | None] = self.loop.create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout_at(deadline):
                return await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                # Handed a connection or a slot just as we gave up: pass it on, don't leak it.
                handed = waiter.result()
                if handed is None:
                    self._free_slot()
                else:
                    self._release(handed)
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            waiter.cancel()
            if isinstance(exc, TimeoutError):
                raise UpstreamTimeout(f"no free connection to {self.url} in time") from None
            raise

    async def _connect(self, deadline: float) -> Http1Connection:
        """Open a connection in a slot the caller already holds."""
        conn = Http1Connection(self.url, max_header_bytes=self.config.max_header_bytes,
                               max_response_bytes=self.config.max_response_bytes,
                               on_closed=self._connection_closed)
        timeout = min(self.config.connect_timeout_s, deadline - self.loop.time())
        try:
            async with asyncio.timeout(timeout):
                await self.loop.create_connection(lambda: conn, self.host, self.port)
        except BaseException as exc:
            self._free_slot()
            if isinstance(exc, TimeoutError):
                raise ConnectTimeout(f"connecting to {self.url} timed out after {timeout:.3f} s") from None
            if isinstance(exc, OSError):
                raise ConnectError(f"cannot connect to {self.url}: {exc.strerror or exc}") from exc
            raise
        conn.holds_slot = True
        if self._closed:
            self._discard(conn)
            raise ConnectError(f"the pool for {self.url} is closed")
        return conn

    def _release(self, conn: Http1Connection) -> None:
        if not conn.reusable or self._closed:
            self._discard(conn)
            return
        conn.idle_since = self._clock()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if len(self._idle) < self.config.max_idle:
            self._idle.append(conn)
        else:
            self._discard(conn)

    def _discard(self, conn: Http1Connection) -> None:
        if conn.holds_slot:
            conn.holds_slot = False
            self._free_slot()
        conn.abort()

    def _connection_closed(self, conn: Http1Connection) -> None:
        """The connection's transport is gone (peer close, error, or ours)."""
        if conn in self._idle:
            self._idle.remove(conn)
        if conn.holds_slot:
            conn.holds_slot = False
            self._free_slot()

    def _free_slot(self) -> None:
        self._total -= 1
        if self._closed:
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._total += 1  # the slot passes straight to the waiter, which connects in it
                waiter.set_result(None)
                return


class UpstreamPools:
    """One ``UpstreamPool`` per upstream URL, created on first use; all share one ``PoolConfig``."""

    def __init__(self, config: PoolConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._pools: dict[str, UpstreamPool] = {}

    def get(self, url: str) -> UpstreamPool:
        """The pool for ``url``; a URL the pool cannot speak to (https, say) is a ``ConnectError``."""
        pool = self._pools.get(url)
        if pool is None:
            try:
                pool = UpstreamPool(url, self.config, clock=self._clock)
            except ValueError as exc:
                raise ConnectError(str(exc)) from None
            self._pools[url] = pool
        return pool

    def urls(self) -> list[str]:
        return list(self._pools)

    async def retain(self, urls: Iterable[str]) -> None:
        """Close the pools of upstreams no longer in ``urls`` (they left discovery)."""
        keep = set(urls)
        for url in [u for u in self._pools if u not in keep]:
            await self._pools.pop(url).close()

    async def close(self) -> None:
        await self.retain(())
