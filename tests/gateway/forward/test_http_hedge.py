"""Hedged requests end to end: a real gateway in front of fake replicas, one of them stalling."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import aiohttp

from fleetserve.gateway.balance import BalancerConfig
from fleetserve.gateway.forward.hedge import HedgeConfig
from tests.support.fake_replica import FakeReplica
from tests.support.gateways import StartGateway
from tests.support.rawserver import Handler, RawServer, read_request, response
from tests.support.waiting import until

StartReplicas = Callable[[int], Awaitable[list[FakeReplica]]]
StartRaw = Callable[[Handler], Awaitable[RawServer]]
INFER = "/v2/models/m/infer"
ROUND_ROBIN = BalancerConfig(policy="round-robin")
# A hedge waits at least 300 ms, far above a warm-up request's latency even on a loaded 2-core box, so only
# the stalls the tests make are hedged (at 20 ms, warm-up requests were, shifting round-robin and counters).
EAGER = HedgeConfig(percentile=99, min_samples=10, window=16, max_extra_percent=100, burst=5, min_delay_ms=300)


async def infer(client: aiohttp.ClientSession, url: str, path: str = INFER) -> tuple[int, dict[str, object], float]:
    started = time.perf_counter()
    async with client.post(url + path, data=b'{"inputs": []}') as res:
        body = await res.read()
        return res.status, json.loads(body), time.perf_counter() - started


async def warm_up(client: aiohttp.ClientSession, url: str, next_to: FakeReplica, n: int = 20) -> None:
    """``n`` or more quick requests, ending so that round-robin sends the next one to ``next_to``."""
    last = ""
    for i in range(n + 1):
        status, body, _ = await infer(client, url)
        assert status == 200
        last = str(body["replica"])
        if i + 1 >= n and last != next_to.name:
            return


def counter(gw: object, name: str, label: str) -> float:
    return getattr(gw.metrics, name).labels(label)._value.get()  # type: ignore[attr-defined]


async def test_a_stalled_replica_is_hedged_and_the_fast_copy_answers(replicas: StartReplicas,
                                                                     gateway: StartGateway,
                                                                     client: aiohttp.ClientSession) -> None:
    slow, fast = await replicas(2)
    gw = await gateway([slow.url, fast.url], balancer=ROUND_ROBIN, hedge=EAGER)
    await warm_up(client, gw.url, slow)
    slow.delay_s = 5.0
    answers = [await infer(client, gw.url) for _ in range(4)]  # round-robin sends two to the stalled one
    assert [status for status, _, _ in answers] == [200] * 4
    assert all(body["replica"] == fast.name for _, body, _ in answers)
    slowest = max(elapsed for _, _, elapsed in answers)
    assert slowest < 1.0
    assert counter(gw, "hedges", "won") == 2
    def pending() -> list[object]:
        return [row["pending"] for row in gw.balancer.snapshot()]

    await until(lambda: pending() == [0, 0], what="the cancelled attempts finished their bookkeeping")
    rows = {row["url"]: row for row in gw.balancer.snapshot()}
    # Outpaced twice: its estimate is penalised well beyond the cancelled attempts' lower bounds.
    assert float(rows[slow.url]["ewma_ms"]) >= 2 * slowest * 1000  # type: ignore[arg-type]
    assert gw.balancer.retry_budget.active_retries == 0


async def test_no_hedge_without_budget(replicas: StartReplicas, gateway: StartGateway,
                                       client: aiohttp.ClientSession) -> None:
    slow, fast = await replicas(2)
    stingy = HedgeConfig(percentile=99, min_samples=10, window=16, max_extra_percent=1, burst=1, min_delay_ms=300)
    gw = await gateway([slow.url, fast.url], balancer=ROUND_ROBIN, hedge=stingy)
    await warm_up(client, gw.url, slow)  # ~20 requests earn ~0.2 of a hedge
    slow.delay_s = 1.0  # well past the warm-up's slowest latency, also on a loaded machine: a hedge is due
    fast_hits = fast.hits
    # A warm-up request slowed by a loaded machine may already have been due a hedge: count from here.
    skipped = counter(gw, "hedges_skipped", "budget")
    status, body, elapsed = await infer(client, gw.url)
    assert (status, body["replica"]) == (200, slow.name)
    assert elapsed >= 1.0
    assert counter(gw, "hedges_skipped", "budget") == skipped + 1
    assert fast.hits == fast_hits  # no copy was sent


async def test_no_hedge_to_a_replica_with_work_outstanding(replicas: StartReplicas, gateway: StartGateway,
                                                           client: aiohttp.ClientSession) -> None:
    """A copy queued behind other work rarely wins and adds to the load: hedges go to idle replicas only."""
    slow, busy = await replicas(2)
    gw = await gateway([slow.url, busy.url], balancer=ROUND_ROBIN, hedge=EAGER)
    busy.queue_depth = 3  # its next answer reports rows queued
    await warm_up(client, gw.url, slow)
    slow.delay_s = 1.0
    busy_hits = busy.hits
    status, body, elapsed = await infer(client, gw.url)
    assert (status, body["replica"]) == (200, slow.name)
    assert elapsed >= 1.0
    assert counter(gw, "hedges_skipped", "busy") == 1
    assert busy.hits == busy_hits


async def test_hedges_leave_the_retry_budget_to_retries(replicas: StartReplicas, gateway: StartGateway,
                                                         client: aiohttp.ClientSession) -> None:
    slow, fast = await replicas(2)
    no_retries = BalancerConfig(policy="round-robin", retry_budget_percent=0.0, retry_min_concurrency=0)
    gw = await gateway([slow.url, fast.url], balancer=no_retries, hedge=EAGER)
    await warm_up(client, gw.url, slow)
    slow.delay_s = 5.0
    status, body, _ = await infer(client, gw.url)
    assert (status, body["replica"]) == (200, fast.name)
    assert counter(gw, "hedges", "won") == 1
    assert gw.balancer.retry_budget.active_retries == 0


async def test_a_failed_hedge_leaves_the_first_attempt_to_answer(replicas: StartReplicas, gateway: StartGateway,
                                                                 client: aiohttp.ClientSession) -> None:
    slow, busy = await replicas(2)
    gw = await gateway([slow.url, busy.url], balancer=ROUND_ROBIN, hedge=EAGER)
    await warm_up(client, gw.url, slow)
    slow.delay_s = 1.0  # well past the warm-up's slowest latency, also on a loaded machine: a hedge is due
    busy.mode = "overloaded"  # the hedge gets a 503: not an answer, keep waiting for the original
    status, body, elapsed = await infer(client, gw.url)
    assert (status, body["replica"]) == (200, slow.name)
    assert elapsed >= 1.0
    assert counter(gw, "hedges", "lost") == 1


async def test_hedging_off_and_non_inference_routes_wait_for_the_one_replica(
        replicas: StartReplicas, gateway: StartGateway, client: aiohttp.ClientSession) -> None:
    slow, fast = await replicas(2)
    gw = await gateway([slow.url, fast.url], balancer=ROUND_ROBIN, hedge=HedgeConfig(percentile=0))
    await warm_up(client, gw.url, slow)
    slow.delay_s = 0.2
    status, body, elapsed = await infer(client, gw.url)
    assert (status, body["replica"], elapsed >= 0.2) == (200, slow.name, True)

    gw2 = await gateway([slow.url, fast.url], balancer=ROUND_ROBIN, hedge=EAGER)
    slow.delay_s = 0.0
    await warm_up(client, gw2.url, slow)
    slow.delay_s = 0.2
    async with client.get(gw2.url + "/v2/models/m") as res:  # metadata: never sent twice
        assert res.status == 200
        assert (await res.json())["replica"] == slow.name
    assert counter(gw2, "hedges", "won") == 0


async def test_a_lost_attempt_closes_its_upstream_connection(raw_server: StartRaw, replicas: StartReplicas,
                                                             gateway: StartGateway,
                                                             client: aiohttp.ClientSession) -> None:
    stalling, stalled, closed = False, asyncio.Event(), asyncio.Event()

    async def replica(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            if stalling:
                stalled.set()
                if await reader.read(1) == b"":
                    closed.set()
                return
            writer.write(response(b'{"replica": "raw"}'))
            await writer.drain()

    slow = await raw_server(replica)
    (fast,) = await replicas(1)
    gw = await gateway([slow.url, fast.url], balancer=ROUND_ROBIN, hedge=EAGER)
    answered = [str((await infer(client, gw.url))[1]["replica"]) for _ in range(20)]
    if answered[-1] != fast.name:  # round-robin: make the next request go to the raw replica
        await infer(client, gw.url)
    stalling = True
    status, body, _ = await infer(client, gw.url)
    assert (status, body["replica"]) == (200, fast.name)
    await asyncio.wait_for(stalled.wait(), 5.0)
    await asyncio.wait_for(closed.wait(), 5.0)  # the stalled replica sees the lost attempt go away
