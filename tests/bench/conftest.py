"""Fixtures for the load generator tests: a ``TargetServer`` (``tests/support/target.py``) on the test's loop
or on its own loop in a thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.support.target import TargetServer


@pytest.fixture
async def server() -> AsyncIterator[TargetServer]:
    srv = await TargetServer().start()
    try:
        yield srv
    finally:
        await srv.stop()


@pytest.fixture
def threaded_server() -> Iterator[TargetServer]:
    """A TargetServer on its own loop in a thread, for code that runs ``asyncio.run`` itself."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    srv = TargetServer()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(srv.start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(srv.stop())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10), "test server did not start"
    try:
        yield srv
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
