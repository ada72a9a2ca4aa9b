"""Runs one load over several worker processes and merges their raw results.

One Python process tops out at one core; ``processes = N`` gives each of N spawned workers a share
of the load (``LoadConfig.split``). The workers wait on a barrier, then all start half a second
later by the shared monotonic clock (CLOCK_MONOTONIC is system-wide on Linux), so their
per-second buckets line up. A stop request is passed on through a multiprocessing event.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.synchronize
import time
from concurrent.futures import ProcessPoolExecutor

from fleetserve.bench.loadgen import LoadConfig, collect
from fleetserve.bench.recorder import RawResult, merge
from fleetserve.eventloop import loop_factory

# Time for every worker to build its payloads and client after the barrier.
START_DELAY_S = 0.5
STOP_POLL_S = 0.05
BARRIER_TIMEOUT_S = 60.0

_barrier: multiprocessing.synchronize.Barrier | None = None
_stop: multiprocessing.synchronize.Event | None = None


def _init_worker(barrier: multiprocessing.synchronize.Barrier, stop: multiprocessing.synchronize.Event) -> None:
    global _barrier, _stop
    _barrier, _stop = barrier, stop


async def _collect_with_stop(config: LoadConfig, start_at: float) -> RawResult:
    assert _stop is not None
    shared_stop = _stop
    stop = asyncio.Event()

    async def poll() -> None:
        while not shared_stop.is_set():
            await asyncio.sleep(STOP_POLL_S)
        stop.set()

    poller = asyncio.create_task(poll())
    try:
        return await collect(config, stop=stop, start_at=start_at)
    finally:
        poller.cancel()


def _worker(config: LoadConfig) -> RawResult:
    assert _barrier is not None
    _barrier.wait(BARRIER_TIMEOUT_S)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(_collect_with_stop(config, time.monotonic() + START_DELAY_S))


async def collect_in_processes(config: LoadConfig, *, stop: asyncio.Event | None = None) -> RawResult:
    parts = config.split()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(parts))
    shared_stop = ctx.Event()
    loop = asyncio.get_running_loop()
    relay: asyncio.Task[None] | None = None
    if stop is not None:
        local_stop = stop

        async def relay_stop() -> None:
            await local_stop.wait()
            shared_stop.set()

        relay = asyncio.create_task(relay_stop())
    try:
        with ProcessPoolExecutor(
            len(parts), mp_context=ctx, initializer=_init_worker, initargs=(barrier, shared_stop)
        ) as pool:
            futures = [loop.run_in_executor(pool, _worker, part) for part in parts]
            try:
                results = await asyncio.gather(*futures)
            finally:
                # Cancellation or an error must not leave workers sending (the pool waits for them).
                shared_stop.set()
    finally:
        if relay is not None:
            relay.cancel()
    return merge(list(results))
