"""The public application: which routes exist, JSON errors, body limits, and middleware order."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CollectorRegistry

from tests.support.fake_replica import FakeReplica
from tests.support.gateways import StartGateway

StartReplicas = Callable[[int], Awaitable[list[FakeReplica]]]


async def test_unknown_routes_are_json_404(replicas: StartReplicas, gateway: StartGateway,
                                           client: aiohttp.ClientSession) -> None:
    (replica,) = await replicas(1)
    gw = await gateway([replica.url])
    for path in ("/", "/v3/models", "/inference/extra", "/gateway"):
        async with client.get(gw.url + path, headers={"X-Request-ID": "r1"}) as res:
            assert res.status == 404
            assert res.headers["X-Request-ID"] == "r1"
            assert await res.json() == {"error": f"Not Found: GET {path}"}
    assert replica.hits == 0
    text = (await (await client.get(gw.url + "/metrics")).read()).decode()
    assert 'fleetserve_gateway_requests_total{backend="none",code="404"} 4.0' in text


async def test_other_methods_are_json_405(replicas: StartReplicas, gateway: StartGateway,
                                          client: aiohttp.ClientSession) -> None:
    (replica,) = await replicas(1)
    gw = await gateway([replica.url])
    async with client.put(gw.url + "/v2/models/m/infer", data=b"{}") as res:
        assert res.status == 405
        assert "POST" in res.headers["Allow"]
        assert (await res.json())["error"].startswith("Method Not Allowed")
    async with client.post(gw.url + "/metrics") as res:
        assert res.status == 405
    assert replica.hits == 0


async def test_oversized_bodies_are_413(replicas: StartReplicas, gateway: StartGateway,
                                        client: aiohttp.ClientSession) -> None:
    (replica,) = await replicas(1)
    gw = await gateway([replica.url], max_body_bytes=1000)
    async with client.post(gw.url + "/v2/models/m/infer", data=b"x" * 1001) as res:
        assert res.status == 413
        assert await res.json() == {"error": "request body is 1001 bytes; the limit is 1000"}

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(5):
            yield b"y" * 300

    async with client.post(gw.url + "/inference", data=chunks()) as res:  # no Content-Length
        assert res.status == 413
        assert (await res.json())["error"] == "request body exceeds 1000 bytes"
    async with client.post(gw.url + "/v2/models/m/infer", data=b"x" * 1000) as res:
        assert res.status == 200
    assert replica.hits == 1


def _tagging(tag: str) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.headers.get("X-Deny") == tag:
            return web.json_response({"error": f"denied by {tag}"}, status=401)
        response = await handler(request)
        response.headers["X-Order"] = f"{tag},{response.headers.get('X-Order', '')}".rstrip(",")
        return response

    return middleware


def _guards(registry: CollectorRegistry) -> Sequence[Middleware]:
    return [_tagging("outer"), _tagging("inner")]


async def test_edge_middlewares_wrap_every_route_outermost_first(replicas: StartReplicas, gateway: StartGateway,
                                                                  client: aiohttp.ClientSession) -> None:
    (replica,) = await replicas(1)
    gw = await gateway([replica.url], middlewares=_guards, server="aiohttp")  # aiohttp middlewares
    async with client.post(gw.url + "/v2/models/m/infer", data=b"{}") as res:
        assert res.status == 200
        assert res.headers["X-Order"] == "outer,inner"
    async with client.get(gw.url + "/nope") as res:
        assert res.status == 404
        assert res.headers["X-Order"] == "outer,inner"  # the JSON 404 is made inside the guards
    async with client.post(gw.url + "/v2/models/m/infer", data=b"{}", headers={"X-Deny": "inner"}) as res:
        assert res.status == 401
        assert res.headers["X-Order"] == "outer"
    assert replica.hits == 1
