"""Input limits: bounded request heads and bodies, and the aiohttp server settings that go with them.

Two middlewares, because the checks belong at opposite ends of the stack:

- :class:`HeadLimits` (outermost) rejects on the request head alone: a head larger than
  ``max_header_bytes`` (431) or a declared ``Content-Length`` over ``max_body_bytes`` (413), before
  any other guard spends work on the request.
- :class:`BodyLimits` (innermost, after auth and rate limits, as NGINX and Envoy read bodies only
  after their access checks) reads the whole body within ``body_read_timeout_s`` (408), bounded by
  ``max_body_bytes`` also when it is chunked (413), and bounds a JSON body's depth and value count
  (:mod:`.jsonscan`). The body is then cached on the request, so the proxy's ``await
  request.read()`` returns it without touching the socket again.

The per-line head limits, the keep-alive timeout and the client body cap are aiohttp settings:
:func:`server_kwargs` and :func:`app_kwargs` derive them. The header-read (slowloris) timeout and
the connection cap act below HTTP, in :mod:`.connections`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sized
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from fleetserve.gateway.edge.config import InputLimits
from fleetserve.gateway.edge.jsonscan import JsonLimitExceeded, check_json_bounds
from fleetserve.gateway.edge.metrics import NullObserver, RejectionObserver
from fleetserve.wire import error_response

__all__ = ["BodyLimits", "HeadLimits", "InputLimits", "app_kwargs", "head_size", "is_json", "server_kwargs"]

# Lingering close drains an unread body after an early error answer so the client reads the answer
# instead of a TCP reset; a short cap keeps a slow sender from holding the connection for long.
_MAX_LINGER_S = 2.0


def server_kwargs(limits: InputLimits) -> dict[str, Any]:
    """Keyword arguments for ``web.AppRunner(app, **server_kwargs(limits))`` (the request handler)."""
    return {
        "keepalive_timeout": limits.keepalive_timeout_s,
        "max_line_size": limits.max_header_bytes,
        "max_field_size": limits.max_header_bytes,
        "max_headers": limits.max_headers,
        "lingering_time": min(_MAX_LINGER_S, limits.body_read_timeout_s),
    }


def app_kwargs(limits: InputLimits) -> dict[str, Any]:
    """Keyword arguments for ``web.Application(**app_kwargs(limits), middlewares=...)``."""
    return {"client_max_size": limits.max_body_bytes}


def head_size(method: str, target: str, headers: Iterable[tuple[Sized, Sized]]) -> int:
    """Size of a request head as sent: request line plus ``name: value\\r\\n`` per header."""
    size = len(method) + len(target) + 14  # spaces, "HTTP/1.1", CRLFs, final CRLF
    for name, value in headers:
        size += len(name) + len(value) + 4
    return size


def head_bytes(request: web.BaseRequest) -> int:
    """Size of an aiohttp request's head as sent."""
    return head_size(request.method, request.raw_path, request.raw_headers)


def _closing(response: web.Response) -> web.Response:
    # The body was not (completely) read, so the connection cannot carry another request reliably.
    response.force_close()
    return response


class HeadLimits:
    """Rejects oversized heads (431) and oversized declared bodies (413) before anything else runs."""

    __middleware_version__ = 1

    def __init__(self, limits: InputLimits, observer: RejectionObserver | None = None) -> None:
        self._max_head = limits.max_header_bytes
        self._max_body = limits.max_body_bytes
        self._observer = observer or NullObserver()

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        size = head_bytes(request)
        if size > self._max_head:
            self._observer.rejected("headers_too_large")
            return _closing(error_response(431, f"request head is {size} bytes; the limit is {self._max_head}"))
        declared = request.content_length
        if declared is not None and declared > self._max_body:
            self._observer.rejected("body_too_large")
            return _closing(error_response(413, f"request body is {declared} bytes; the limit is {self._max_body}"))
        return await handler(request)


class BodyLimits:
    """Reads the body within a deadline and a size cap, and bounds JSON nesting and value count."""

    __middleware_version__ = 1

    def __init__(self, limits: InputLimits, observer: RejectionObserver | None = None) -> None:
        self._limits = limits
        self._observer = observer or NullObserver()

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.body_exists:
            return await handler(request)
        limits = self._limits
        if request.content.is_eof():
            # The whole body arrived with the head (the common case for small bodies): no timer needed.
            body = await self._read(request)
        else:
            try:
                async with asyncio.timeout(limits.body_read_timeout_s):
                    body = await self._read(request)
            except TimeoutError:
                self._observer.rejected("body_timeout")
                return _closing(
                    error_response(408, f"request body not received within {limits.body_read_timeout_s:g} s")
                )
        if body is None or len(body) > limits.max_body_bytes:
            return self._too_large()
        if is_json(request.headers.get("Content-Type")):
            try:
                check_json_bounds(body, limits.json_max_depth, limits.json_max_elements)
            except JsonLimitExceeded as exc:
                self._observer.rejected(exc.reason)
                status = 413 if exc.reason == "json_too_many_elements" else 400
                return error_response(status, str(exc))
        return await handler(request)

    @staticmethod
    async def _read(request: web.Request) -> bytes | None:
        """The body (cached on the request for the proxy), or None beyond the app's client_max_size."""
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            return None

    def _too_large(self) -> web.Response:
        self._observer.rejected("body_too_large")
        return _closing(error_response(413, f"request body exceeds {self._limits.max_body_bytes} bytes"))


def is_json(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` value names JSON; parsed by hand (aiohttp's property parses every parameter)."""
    mime = (content_type or "").partition(";")[0].strip().lower()
    return mime == "application/json" or mime.endswith("+json")
