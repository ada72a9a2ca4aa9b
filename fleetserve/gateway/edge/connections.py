"""Connection-level guards: a cap on open connections and a deadline on reading each request head.

Both act below HTTP, where no middleware can: a slowloris client that trickles header bytes never
produces a request, so only the connection can be timed. aiohttp's own keep-alive timer closes a
connection whose *next* head is incomplete when the idle timeout ends, but it is not reset by
arriving bytes and the idle timeout is long (it must outlast client pools); it is no header timeout.

:class:`ConnectionGuard` wraps aiohttp's protocol factory (the ``web.Server`` of a runner) and gives
each connection a thin :class:`GuardedConnection` that forwards every transport callback to
aiohttp's unmodified ``RequestHandler``. A head deadline (``header_read_timeout_s``) starts when the
connection opens and whenever bytes arrive while aiohttp is waiting for a head, and stops once
aiohttp has a complete head; at the deadline a still-incomplete head gets 408 and the connection is
closed (HAProxy's ``timeout http-request``, NGINX's ``client_header_timeout``). Connections beyond
``max_connections`` get 503 and are closed at once (NGINX ``limit_conn``, summed over all clients).
:class:`GuardedTCPSite` is a ``web.BaseSite`` (aiohttp's extension point for listeners) that serves
a runner through the guard.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from ssl import SSLContext
from typing import cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from fleetserve.gateway.edge.config import InputLimits
from fleetserve.gateway.edge.metrics import NullObserver, RejectionObserver

# A rejected connection may still be sending its request; reading and discarding it for a moment
# before closing lets the client read the 503 instead of a TCP reset.
_REJECT_LINGER_S = 1.0


def _raw_response(status: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Retry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def awaiting_head(handler: RequestHandler) -> bool:
    """Whether aiohttp's request loop is parked waiting for a complete request head.

    ``RequestHandler`` parks its loop on the private ``_waiter`` future exactly while no parsed
    request is queued; aiohttp's keep-alive timer (``_process_keepalive``) makes the same test.
    """
    waiter = handler._waiter
    return waiter is not None and not waiter.done()


def head_complete(handler: RequestHandler) -> bool:
    """Whether aiohttp holds a complete request head: parsed and queued (``_messages``) or being handled."""
    return bool(handler._messages) or handler._request_in_progress


class ConnectionGuard:
    """Protocol factory for ``loop.create_server``: guards every connection of one listener."""

    def __init__(
        self,
        make_handler: Callable[[], RequestHandler],
        limits: InputLimits,
        observer: RejectionObserver | None = None,
    ) -> None:
        self.make_handler = make_handler
        self.head_timeout_s = limits.header_read_timeout_s
        self.max_connections = limits.max_connections
        self.observer = observer or NullObserver()
        self.active = 0
        self.rejected: set[asyncio.BaseTransport] = set()
        self.timeout_response = _raw_response("408 Request Timeout", "request head not received in time")
        self.reject_response = _raw_response("503 Service Unavailable", "too many open connections")

    def __call__(self) -> GuardedConnection:
        return GuardedConnection(self)

    def close_rejected(self) -> None:
        for transport in list(self.rejected):
            transport.close()


class GuardedConnection(asyncio.Protocol):
    """One client connection: forwards to aiohttp's handler and times its request heads."""

    __slots__ = ("_first_head", "_guard", "_handler", "_partial", "_timer", "_transport")

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard
        self._handler: RequestHandler | None = None
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._partial = False
        # Until the first head is complete every byte belongs to it, even before aiohttp's request loop
        # first parks: uvloop delivers the first bytes in the same loop iteration as connection_made.
        self._first_head = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports implement the protocol without subclassing
        # asyncio.Transport, and the gateway runs on uvloop when it is installed.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        guard = self._guard
        if guard.active >= guard.max_connections:
            self._reject(transport)
            return
        guard.active += 1
        self._handler = guard.make_handler()
        self._handler.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        handler = self._handler
        if handler is None:
            return  # a rejected connection: discard what it sends
        handler.data_received(data)
        if head_complete(handler):
            self._first_head = False
            self._partial = False
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        elif self._first_head or awaiting_head(handler):
            self._partial = True
            if self._timer is None:
                self._arm()

    def eof_received(self) -> None:
        # Returning None lets the transport close, as aiohttp's own handler does on a half-close.
        if self._handler is not None:
            self._handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._handler is None:
            if self._transport is not None:
                self._guard.rejected.discard(self._transport)
            return
        self._guard.active -= 1
        handler, self._handler = self._handler, None
        handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._handler is not None:
            self._handler.pause_writing()

    def resume_writing(self) -> None:
        if self._handler is not None:
            self._handler.resume_writing()

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._guard.head_timeout_s, self._head_deadline)

    def _head_deadline(self) -> None:
        self._timer = None
        handler, transport = self._handler, self._transport
        if handler is None or transport is None or not awaiting_head(handler):
            return
        self._guard.observer.rejected("header_timeout")
        if self._partial:
            transport.write(self._guard.timeout_response)
        handler.force_close()

    def _reject(self, transport: asyncio.Transport) -> None:
        guard = self._guard
        guard.observer.rejected("max_connections")
        guard.rejected.add(transport)
        transport.write(guard.reject_response)
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(_REJECT_LINGER_S, transport.close)


class GuardedTCPSite(web.BaseSite):
    """A TCP listener for a runner whose connections pass through a :class:`ConnectionGuard`.

    Use in place of ``web.TCPSite``: ``site = GuardedTCPSite(runner, host, port, limits, observer)``.
    ``reuse_port`` binds with ``SO_REUSEPORT``, so worker processes can share one port (the kernel spreads
    new connections across them).
    """

    __slots__ = (
        "_bound_port", "_guard", "_host", "_limits", "_observer", "_port", "_reuse_address", "_reuse_port",
    )

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        limits: InputLimits,
        observer: RejectionObserver | None = None,
        *,
        ssl_context: SSLContext | None = None,
        backlog: int = 1024,
        reuse_address: bool | None = None,
        reuse_port: bool | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._reuse_port = reuse_port
        self._host = host
        self._port = port
        self._bound_port: int | None = None
        self._limits = limits
        self._observer = observer
        self._reuse_address = reuse_address
        self._guard: ConnectionGuard | None = None

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return self._bound_port if self._bound_port is not None else self._port

    @property
    def guard(self) -> ConnectionGuard:
        if self._guard is None:
            raise RuntimeError("the site is not started")
        return self._guard

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        if server is None:
            raise RuntimeError("call runner.setup() before starting a site")
        self._guard = ConnectionGuard(server, self._limits, self._observer)
        listener = await asyncio.get_running_loop().create_server(
            self._guard,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        self._server = listener
        if listener.sockets:
            self._bound_port = listener.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        await super().stop()
        if self._guard is not None:
            self._guard.close_rejected()
