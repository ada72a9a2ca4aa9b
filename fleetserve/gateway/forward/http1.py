"""One client-side HTTP/1.1 connection on the httptools (llhttp) parser, and its typed failures.

``upstream.UpstreamPool`` owns these connections; a connection carries one request at a time and
collects the whole response as bytes. Response framing follows RFC 9112 §6.3: Content-Length,
chunked, or (neither) read until the peer closes; interim 1xx responses are skipped (RFC 9110 §15.2);
``Connection: close`` and HTTP/1.0 responses make the connection not reusable.

The failures are typed by how far the exchange got, because that decides what the proxy may retry
on another replica: ``ConnectError`` (nothing sent), ``ResetBeforeResponse`` (sent, nothing came
back), ``UpstreamTimeout``, or a failure after the response started (``ResponseIncomplete``,
``ProtocolError``, ``ResponseTooLarge``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools


class UpstreamError(Exception):
    """Base of every failure talking to an upstream."""


class ConnectError(UpstreamError):
    """No connection could be opened; the request was not sent."""


class UpstreamTimeout(UpstreamError):
    """No connection, or no complete response, within the time allowed."""


class ConnectTimeout(ConnectError, UpstreamTimeout):
    """Opening the connection timed out; the request was not sent."""


class ResetBeforeResponse(UpstreamError):
    """The upstream closed the connection after the request was sent, before any response byte."""


class ResponseIncomplete(UpstreamError):
    """The connection closed after the response started, before it was complete."""


class ProtocolError(UpstreamError):
    """The upstream sent something that is not a valid HTTP/1.1 response."""


class ResponseTooLarge(UpstreamError):
    """The response body exceeds the configured bound."""


class PoolExhausted(UpstreamError):
    """Every connection is busy and the queue of waiting requests is full."""


@dataclass(frozen=True, slots=True)
class UpstreamResponse:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or None."""
        wanted = name.lower()
        return next((v for k, v in self.headers if k.lower() == wanted), None)


class Http1Connection(asyncio.Protocol):
    """A TCP connection to one upstream; ``exchange`` sends a request and awaits the full response."""

    def __init__(self, url: str, *, max_header_bytes: int, max_response_bytes: int,
                 on_closed: Callable[[Http1Connection], None]) -> None:
        self._url = url
        self._max_header_bytes = max_header_bytes
        self._max_response_bytes = max_response_bytes
        self._on_closed = on_closed
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[UpstreamResponse] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.holds_slot = False  # counted in its pool's total; the pool clears it exactly once
        self.idle_since = 0.0
        self._start_response()

    def _start_response(self) -> None:
        self._received = 0
        self._headers: list[tuple[str, str]] = []
        self._chunks: list[bytes] = []
        self._body_size = 0
        self._headers_done = False
        self._framed = False  # Content-Length or chunked: EOF before the end is a truncation
        self._complete = False
        self._keep_alive = False

    @property
    def reusable(self) -> bool:
        transport = self._transport
        if not (self._complete and self._keep_alive) or transport is None or transport.is_closing():
            return False
        # An early answer (say, a 413 before the whole body was read) leaves request bytes unsent;
        # the server would read them as the next request.
        return transport.get_write_buffer_size() == 0

    async def exchange(self, head: bytes, body: bytes, timeout_s: float) -> UpstreamResponse:
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ResetBeforeResponse(f"the connection to {self._url} closed before the request was sent")
        self._start_response()
        waiter = self._waiter = self._loop.create_future()
        self._timer = self._loop.call_later(max(timeout_s, 0.0), self._on_timeout, timeout_s)
        if len(body) <= 65536:
            transport.write(head + body)
        else:
            transport.write(head)
            transport.write(body)
        try:
            return await waiter
        finally:
            self._waiter = None
            self._cancel_timer()
            if not self._complete:  # a late response must never be read as the next request's
                self.abort()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _on_timeout(self, timeout_s: float) -> None:
        self._timer = None
        self._fail(UpstreamTimeout(f"no complete response from {self._url} within {timeout_s:.3f} s"))

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fail(self, exc: UpstreamError) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        self.abort()

    def _finish(self) -> None:
        self._complete = True
        self._cancel_timer()
        chunks = self._chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(UpstreamResponse(self._parser.get_status_code(), self._headers, body))

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP transport (uvloop's does not subclass asyncio.Transport, so no isinstance check).
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            # Bytes nobody asked for (say, a 408 sent before an idle close) leave the framing unknowable.
            self._complete = False
            self.abort()
            return
        self._received += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            self._fail(cause if isinstance(cause, UpstreamError) else ProtocolError(str(exc)))
            return
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._keep_alive = False  # bytes after a complete response: deliver it, drop the connection
            self._fail(ProtocolError(f"malformed response from {self._url}: {exc}"))
            return
        # The parser buffers a head until it ends; checked after each read, that buffer stays bounded.
        if not self._headers_done and self._received > self._max_header_bytes:
            limit = self._max_header_bytes
            self._fail(ProtocolError(f"response head from {self._url} exceeds {limit} bytes"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self._waiter is not None and not self._waiter.done():
            if self._received == 0:
                self._waiter.set_exception(
                    ResetBeforeResponse(f"{self._url} closed the connection before responding"))
            elif self._headers_done and not self._framed:
                self._finish()  # the body of an unframed response ends where the connection does
            else:
                self._waiter.set_exception(
                    ResponseIncomplete(f"{self._url} closed the connection mid-response"))
        self._on_closed(self)

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self._max_response_bytes:
            raise ResponseTooLarge(f"response from {self._url} exceeds {self._max_response_bytes} bytes")
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        if 100 <= self._parser.get_status_code() < 200:
            # An interim response; the final one follows on the same connection.
            received = self._received
            self._start_response()
            self._received = received
            return
        self._keep_alive = self._parser.should_keep_alive()
        self._finish()
