"""The adaptive concurrency guard over HTTP: excess refused at once with 503 + Retry-After, slots returned on
every outcome, only successful answers teach the controller, gauges read at scrape time."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry

from fleetserve.gateway.edge.adaptive import GradientController
from fleetserve.gateway.edge.adaptive_guard import AdaptiveConcurrencyGauges, AdaptiveConcurrencyMiddleware
from fleetserve.gateway.edge.config import AdaptiveConcurrencyConfig
from fleetserve.gateway.edge.metrics import PrometheusRejections
from tests.gateway.edge.conftest import ServeFn


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_requests_beyond_the_limit_get_a_fast_503_and_slots_come_back(serve: ServeFn) -> None:
    clock = FakeClock()
    # Envoy's start (forced windows on): the limit sits at its floor of 2 until 3 requests measured minRTT.
    controller = GradientController(AdaptiveConcurrencyConfig(enabled=True, min_concurrency=2, initial_concurrency=2,
                                                              min_rtt_samples=3, min_rtt_interval_s=60.0), clock)
    registry = CollectorRegistry()
    guard = AdaptiveConcurrencyMiddleware(controller, 1.5, ("/healthz",), PrometheusRejections.create(registry))
    registry.register(AdaptiveConcurrencyGauges(controller))
    release = asyncio.Event()
    entered = asyncio.Semaphore(0)

    @web.middleware
    async def replica(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/slow":
            entered.release()
            await release.wait()
            clock.now += 0.040
        if request.path == "/broken":
            return web.Response(status=502)
        if request.path == "/refused":
            return web.Response(status=400)
        return await handler(request)

    client = await serve([guard, replica])
    slow = [asyncio.create_task(client.get("/slow")) for _ in range(2)]
    for _ in range(2):
        await asyncio.wait_for(entered.acquire(), timeout=5)
    assert registry.get_sample_value("fleetserve_gateway_concurrency_inflight") == 2

    refused = await client.get("/fast")
    assert refused.status == 503 and refused.headers["Retry-After"] == "2"
    assert "adaptive concurrency limit" in (await refused.json())["error"]
    assert registry.get_sample_value("fleetserve_gateway_rejected_total", {"reason": "concurrency_limited"}) == 1
    assert (await client.get("/healthz")).status == 200  # probes pass at the limit

    release.set()
    assert [r.status for r in await asyncio.gather(*slow)] == [200, 200]
    assert controller.inflight == 0
    assert (await client.get("/broken")).status == 502  # a failure: slot back, no latency sample
    assert (await client.get("/refused")).status == 400  # refused by an inner guard: no latency sample either
    assert controller.inflight == 0 and controller.measuring_min_rtt
    assert (await client.get("/fast")).status == 200  # the third sample closes the minRTT window
    assert not controller.measuring_min_rtt
    assert registry.get_sample_value("fleetserve_gateway_min_rtt_seconds") == 0.040
    assert registry.get_sample_value("fleetserve_gateway_concurrency_limit") == 2


async def test_a_client_that_goes_away_returns_its_slot(serve: ServeFn) -> None:
    controller = GradientController(AdaptiveConcurrencyConfig(enabled=True, min_concurrency=1))
    guard = AdaptiveConcurrencyMiddleware(controller, 1.0)
    entered = asyncio.Event()

    @web.middleware
    async def hang(request: web.Request, handler: Handler) -> web.StreamResponse:
        entered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    client = await serve([guard, hang])  # the test server cancels a handler whose client left
    request = asyncio.create_task(client.get("/slow"))
    await asyncio.wait_for(entered.wait(), timeout=5)
    assert controller.inflight == 1
    request.cancel()
    deadline = asyncio.get_running_loop().time() + 5
    while controller.inflight:
        assert asyncio.get_running_loop().time() < deadline, "the slot was not returned"
        await asyncio.sleep(0.01)
