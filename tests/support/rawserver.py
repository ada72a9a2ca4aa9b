"""Scripted raw TCP servers on 127.0.0.1 for HTTP edge cases no real server produces on demand.

A test writes the bytes a peer sends (or withholds) in a ``Handler``; ``read_request`` and ``response`` cover
the plain HTTP/1.1 parts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


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


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[RawServer]:
    """A :class:`RawServer` for the duration of the ``async with`` block."""
    server = await RawServer(handler).start()
    try:
        yield server
    finally:
        await server.close()
