"""The dashboard's HTTP side in a real (in-process) gateway: the page, its assets and the fleet JSON."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from tests.support.fake_replica import FakeReplica
from tests.support.gateways import StartGateway

StartReplicas = Callable[[int], Awaitable[list[FakeReplica]]]


async def _frame_where(client: aiohttp.ClientSession, url: str, condition: Callable[[dict[str, Any]], bool],
                       timeout_s: float = 15.0) -> dict[str, Any]:
    """Poll ``/gateway/fleet`` (a new frame each second) until its payload meets ``condition``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        async with client.get(url + "/gateway/fleet") as res:
            assert res.status == 200
            body: dict[str, Any] = await res.json()
        if condition(body):
            return body
        assert asyncio.get_running_loop().time() < deadline, body
        await asyncio.sleep(0.1)


async def test_page_and_assets_come_from_the_package(replicas: StartReplicas, gateway: StartGateway,
                                                     client: aiohttp.ClientSession) -> None:
    (replica,) = await replicas(1)
    gw = await gateway([replica.url])
    async with client.get(gw.url + "/dashboard") as res:
        assert res.status == 200 and res.content_type == "text/html"
        page = await res.text()
    assert 'src="dashboard/dashboard.js"' in page and 'href="dashboard/dashboard.css"' in page
    assert "http" not in page.replace("http-equiv", "")  # nothing fetched from elsewhere
    for name, content_type in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        async with client.get(f"{gw.url}/dashboard/{name}") as res:
            assert res.status == 200 and res.content_type == content_type
            assert len(await res.read()) > 500
    async with client.get(gw.url + "/dashboard/../metrics") as res:
        assert res.status in (200, 404)  # normalised by the client or refused: never a file outside static/
    async with client.get(gw.url + "/dashboard/secret.py") as res:
        assert res.status == 404


async def test_fleet_json_describes_each_replica(replicas: StartReplicas, gateway: StartGateway,
                                                 client: aiohttp.ClientSession) -> None:
    fleet = await replicas(2)
    gw = await gateway([r.url for r in fleet])
    for _ in range(20):
        async with client.post(gw.url + "/v2/models/m/infer", data=b"{}") as res:
            assert res.status == 200
    body = await _frame_where(client, gw.url, lambda b: sum(r["rps"] > 0 for r in b["frame"]["replicas"]) == 2)
    frame = body["frame"]
    assert {row["url"] for row in frame["replicas"]} == {r.url for r in fleet}
    assert {row["state"] for row in frame["replicas"]} == {"healthy"}
    assert all(row["reported_queue_depth"] == 0 and row["p50_ms"] is not None for row in frame["replicas"])
    assert sum(row["share"] for row in frame["replicas"]) == pytest.approx(1.0, abs=1e-3)
    assert frame["autoscale"]["mode"] == "off" and frame["autoscale"]["actual"] == 2
    assert body["points"] and body["points"][-1]["t"] == frame["t"]
    async with client.get(gw.url + "/gateway/fleet", params={"since": str(frame["t"])}) as res:
        assert (await res.json())["points"] == []
    async with client.get(gw.url + "/gateway/fleet", params={"since": "soon"}) as res:
        assert res.status == 400
        assert "since must be a number" in (await res.json())["error"]
