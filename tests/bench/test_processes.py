"""Splitting one load over worker processes (spawned for real) and merging their results."""

from __future__ import annotations

import asyncio

import pytest

from fleetserve.bench.loadgen import LoadConfig, run_load
from tests.support.target import TargetServer
from tests.support.waiting import until


async def test_two_processes_share_the_rate_and_merge(server: TargetServer) -> None:
    config = LoadConfig(url=server.url, rate=300.0, concurrency=None, duration_s=1.0, arrivals="constant", processes=2)
    report = await run_load(config)
    assert report.processes == 2
    assert report.requests == pytest.approx(300, abs=2)
    assert report.errors == 0
    assert report.samples_kept == report.ok
    assert sum(row.ok for row in report.timeseries) == report.ok
    # Both workers really sent: the server saw connections from two client processes' ports.
    assert len(server.seen.peers) >= 2


async def test_stop_reaches_the_workers(server: TargetServer) -> None:
    stop = asyncio.Event()
    config = LoadConfig(url=server.url, rate=None, concurrency=2, duration_s=60.0, processes=2)
    task = asyncio.create_task(run_load(config, stop=stop))
    await until(lambda: server.seen.requests > 0, 30, what="the workers started sending")
    stop.set()
    report = await asyncio.wait_for(task, 10)
    assert report.duration_s < 5
    assert report.ok > 0
