"""Waiting on a real condition with a deadline, instead of sleeping for a guessed time.

A test that sleeps "long enough" for something to happen fails on a loaded machine, and passes slowly on an
idle one; these return as soon as the condition holds and fail, naming it, only when the deadline passes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

POLL_S = 0.002


async def until(condition: Callable[[], bool], timeout_s: float = 10.0, what: str = "") -> None:
    """Return once ``condition()`` is true; fail after ``timeout_s`` (checked between loop turns)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() >= deadline:
            raise AssertionError(f"not true within {timeout_s} s: {what or condition}")
        await asyncio.sleep(POLL_S)


def until_sync(condition: Callable[[], bool], timeout_s: float = 10.0, what: str = "", poll_s: float = 0.01) -> None:
    """:func:`until` for a thread without an event loop (conditions read from other processes, say)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not true within {timeout_s} s: {what or condition}")
        time.sleep(poll_s)
