"""Load shedding over HTTP: 503 + Retry-After beyond the in-flight cap."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.typedefs import Handler

from fleetserve.gateway.edge.config import ShedConfig
from fleetserve.gateway.edge.shed import LoadShedMiddleware
from tests.support.jwt_keys import ServeFn


async def test_requests_beyond_the_cap_are_refused_at_once(serve: ServeFn) -> None:
    release = asyncio.Event()
    entered = asyncio.Semaphore(0)

    @web.middleware
    async def hold(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/slow":
            entered.release()
            await release.wait()
        return await handler(request)

    shed = LoadShedMiddleware(ShedConfig(max_inflight=3, retry_after_s=2.5), exempt_paths=("/healthz",))
    client = await serve([shed, hold])
    slow = [asyncio.create_task(client.get("/slow")) for _ in range(3)]
    for _ in range(3):
        await asyncio.wait_for(entered.acquire(), timeout=5)
    assert shed.inflight == 3

    refused = await client.get("/fast")
    assert refused.status == 503
    assert refused.headers["Retry-After"] == "3"
    assert "3 requests in flight" in (await refused.json())["error"]
    assert (await client.get("/healthz")).status == 200  # probes pass under overload

    release.set()
    assert [r.status for r in await asyncio.gather(*slow)] == [200, 200, 200]
    assert shed.inflight == 0
    assert (await client.get("/fast")).status == 200


async def test_inflight_is_released_when_the_handler_fails(serve: ServeFn) -> None:
    @web.middleware
    async def boom(request: web.Request, handler: Handler) -> web.StreamResponse:
        raise web.HTTPBadRequest(text="no")

    shed = LoadShedMiddleware(ShedConfig(max_inflight=1))
    client = await serve([shed, boom])
    assert [(await client.get("/")).status for _ in range(3)] == [400, 400, 400]
    assert shed.inflight == 0
