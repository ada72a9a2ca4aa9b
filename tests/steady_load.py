"""A steady open-loop load for integration tests: small ``/inference`` requests at a fixed rate, each send's
wall-clock time recorded so a test can count what it sent in any interval (bounded: the block ends it)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp

PAYLOAD = {"texts": ["a query", "a longer candidate text"]}


@dataclass
class SteadyLoad:
    rate: float
    sent_at: list[float] = field(default_factory=list)  # wall-clock seconds
    answers: dict[int, int] = field(default_factory=dict)  # status -> count; 0: no answer

    def sent_between(self, start: float, end: float) -> int:
        return sum(1 for t in self.sent_at if start < t <= end)


@contextlib.asynccontextmanager
async def steady_load(url: str, rate: float) -> AsyncIterator[SteadyLoad]:
    """``rate`` requests a second to ``url``/inference on a fixed schedule until the block ends."""
    load = SteadyLoad(rate)

    async def send(session: aiohttp.ClientSession) -> None:
        status = 0
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            async with session.post(url + "/inference", json=PAYLOAD) as res:
                await res.read()
                status = res.status
        load.answers[status] = load.answers.get(status, 0) + 1

    async def run(session: aiohttp.ClientSession) -> None:
        loop = asyncio.get_running_loop()
        pending: set[asyncio.Task[None]] = set()
        due = loop.time()
        while True:
            load.sent_at.append(time.time())
            task = asyncio.create_task(send(session))
            pending.add(task)
            task.add_done_callback(pending.discard)
            due += 1.0 / rate
            await asyncio.sleep(max(0.0, due - loop.time()))

    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        runner = asyncio.create_task(run(session))
        try:
            yield load
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
