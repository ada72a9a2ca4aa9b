"""The autoscaler in a running gateway (in-process, real sockets): the actuator's membership routes traffic,
draining finishes what it holds, and at zero replicas requests wait for the first one, over HTTP and gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import grpc
import grpc.aio
import pytest

from fleetserve.autoscale.config import AutoscaleConfig
from fleetserve.gateway.edge import EdgeConfig
from fleetserve.gateway.edge.adaptive_guard import AdaptiveConcurrencyMiddleware
from fleetserve.gateway.edge.config import AdaptiveConcurrencyConfig
from fleetserve.gateway.server import GatewayHandle
from tests.support.fake_replica import FakeReplica
from tests.support.gateways import StartGateway
from tests.support.grpc_replica import GRPC_INFER, GrpcReplica
from tests.support.procs import free_port
from tests.support.waiting import until

StartReplicas = Callable[[int], Awaitable[list[FakeReplica]]]
MEMBERS = "/gateway/autoscale/members"
INFER = "/v2/models/m/infer"


async def autoscaled(gateway: StartGateway, min_replicas: int = 0, **overrides: Any) -> GatewayHandle:
    """A gateway whose replicas come from the actuator (none yet), running the hpa rule."""
    autoscale = AutoscaleConfig(rule="hpa", min_replicas=min_replicas, max_replicas=4)
    return await gateway([], discovery="actuator", autoscale=autoscale, **overrides)


async def put(client: aiohttp.ClientSession, gw: GatewayHandle, body: Any) -> tuple[int, Any]:
    async with client.put(gw.url + MEMBERS, json=body) as res:
        return res.status, await res.json()


async def test_members_put_by_the_actuator_take_traffic(replicas: StartReplicas, gateway: StartGateway,
                                                        client: aiohttp.ClientSession) -> None:
    a, b, c = await replicas(3)
    gw = await autoscaled(gateway, min_replicas=1)
    status, body = await put(client, gw, {"ready": [a.url, b.url], "starting": [c.url], "startup_s": 0.8})
    assert (status, body["inserted"], body["removed"]) == (200, 2, 0)
    for _ in range(20):
        async with client.post(gw.url + INFER, data=b"{}") as res:
            assert res.status == 200
    assert a.hits + b.hits == 20 and a.hits > 0 and b.hits > 0 and c.hits == 0
    await until(lambda: gw.autoscaler is not None and gw.autoscaler.last is not None
                and gw.autoscaler.last.signals.ready == 2)
    async with client.get(gw.url + "/gateway/autoscale") as res:
        state = await res.json()
    assert state["rule"] == "hpa" and state["min_replicas"] == 1 and state["max_replicas"] == 4
    assert state["members"] == {"ready": [a.url, b.url], "starting": [c.url], "draining": [], "startup_s": 0.8}
    assert {"desired", "ready", "starting", "draining", "held", "signals", "decisions"} <= state.keys()
    assert state["signals"]["startup_s"] == 0.8
    async with client.get(gw.url + "/gateway/fleet") as res:
        scaling = (await res.json())["frame"]["autoscale"]
    assert scaling["mode"] == "hpa"  # the dashboard shows desired vs actual
    async with client.get(gw.url + "/metrics") as res:
        text = await res.text()
    assert 'fleetserve_autoscale_desired_replicas{rule="hpa"}' in text
    assert 'fleetserve_autoscale_replicas{state="ready"} 2.0' in text


async def test_draining_stops_new_traffic_and_finishes_what_it_holds(
        replicas: StartReplicas, gateway: StartGateway, client: aiohttp.ClientSession) -> None:
    a, b = await replicas(2)
    gw = await autoscaled(gateway, min_replicas=1)
    await put(client, gw, {"ready": [a.url]})
    a.delay_s = 0.5
    slow = asyncio.create_task(client.post(gw.url + INFER, data=b"{}"))
    await until(lambda: a.hits == 1, what="the slow request reached a")
    status, body = await put(client, gw, {"ready": [b.url], "draining": [a.url]})
    assert (status, body["inserted"], body["removed"]) == (200, 1, 1)
    for _ in range(5):
        async with client.post(gw.url + INFER, data=b"{}") as res:
            assert res.status == 200 and (await res.json())["replica"] == b.name
    async with await slow as res:
        assert res.status == 200 and (await res.json())["replica"] == a.name  # in flight: not failed
    assert a.hits == 1


async def test_a_request_at_zero_replicas_waits_for_the_first_one(
        replicas: StartReplicas, gateway: StartGateway, client: aiohttp.ClientSession) -> None:
    (a,) = await replicas(1)
    gw = await autoscaled(gateway)
    assert gw.autoscaler is not None
    async with client.get(gw.url + "/readyz") as res:
        assert res.status == 200  # it can take requests: it holds them
    async with client.get(gw.url + "/gateway/autoscale") as res:
        assert (await res.json())["desired"] == 0
    waiting = [asyncio.create_task(client.post(gw.url + INFER, data=str(i).encode())) for i in range(3)]
    await until(lambda: gw.autoscaler is not None and gw.autoscaler.held == 3, what="three requests held")
    # The actuator's long poll sees the decision the first held request woke.
    async with client.get(gw.url + "/gateway/autoscale?desired=0&wait_s=5") as res:
        state = await res.json()
    assert state["desired"] >= 1 and state["held_now"] == 3
    assert state["decisions"][-1]["reason"] == "scale_from_zero"
    await put(client, gw, {"ready": [a.url], "startup_s": 0.3})
    for task in waiting:
        async with await task as res:
            assert res.status == 200 and (await res.json())["replica"] == a.name
    assert gw.autoscaler.held == 0
    assert gw.metrics.registry.get_sample_value("fleetserve_autoscale_holds_total", {"outcome": "released"}) == 3


LIMITED = EdgeConfig(adaptive=AdaptiveConcurrencyConfig(enabled=True))


def refused(gw: GatewayHandle) -> float | None:
    return gw.metrics.registry.get_sample_value("fleetserve_gateway_rejected_total", {"reason": "concurrency_limited"})


async def test_a_burst_at_zero_replicas_larger_than_the_concurrency_limit_waits_whole(
        replicas: StartReplicas, gateway: StartGateway, client: aiohttp.ClientSession) -> None:
    (a,) = await replicas(1)
    gw = await autoscaled(gateway, edge=LIMITED)
    limiter = next(m for m in gw.guards.middlewares if isinstance(m, AdaptiveConcurrencyMiddleware))
    assert limiter.controller.limit == 32  # its initial limit
    waiting = [asyncio.create_task(client.post(gw.url + INFER, data=str(i).encode())) for i in range(80)]
    await until(lambda: gw.autoscaler is not None and gw.autoscaler.held == 80, what="all 80 requests held")
    await put(client, gw, {"ready": [a.url], "startup_s": 0.3})
    for task in waiting:
        async with await task as res:
            assert res.status == 200
    assert refused(gw) == 0


@pytest.mark.parametrize(("max_replicas", "refuses"), [(4, False), (1, True)])
async def test_the_concurrency_limit_refuses_only_once_the_fleet_cannot_grow(
        replicas: StartReplicas, gateway: StartGateway, client: aiohttp.ClientSession, max_replicas: int,
        refuses: bool) -> None:
    (a,) = await replicas(1)
    a.delay_s = 0.3
    autoscale = AutoscaleConfig(rule="hpa", min_replicas=1, max_replicas=max_replicas)
    gw = await gateway([], discovery="actuator", autoscale=autoscale, edge=LIMITED)
    await put(client, gw, {"ready": [a.url]})
    await until(lambda: gw.autoscaler is not None and gw.autoscaler.last is not None
                and gw.autoscaler.last.signals.ready == 1, what="a tick that saw the replica")
    answers = await asyncio.gather(*(client.post(gw.url + INFER, data=b"{}") for _ in range(80)))
    statuses = [res.status for res in answers]
    for res in answers:
        res.release()
    assert (503 in statuses) is refuses  # beyond the initial 32 in flight, at the fleet's maximum only
    assert (refused(gw) or 0) > 0 if refuses else refused(gw) == 0


async def test_over_the_bound_or_past_the_deadline_a_held_request_gets_503_and_retry_after(
        gateway: StartGateway, client: aiohttp.ClientSession) -> None:
    gw = await autoscaled(gateway, hold_max_requests=1)
    first = asyncio.create_task(client.post(gw.url + INFER, data=b"{}", headers={"X-Fleetserve-Timeout-Ms": "300"}))
    await until(lambda: gw.autoscaler is not None and gw.autoscaler.held == 1)
    async with client.post(gw.url + INFER, data=b"{}") as res:
        assert res.status == 503 and res.headers["Retry-After"] == "1"
        assert "already waiting" in (await res.json())["error"]
    async with await first as res:
        assert res.status == 503 and res.headers["Retry-After"] == "1"
        assert "no replica became ready" in (await res.json())["error"]
    registry = gw.metrics.registry
    assert registry.get_sample_value("fleetserve_autoscale_holds_total", {"outcome": "full"}) == 1
    assert registry.get_sample_value("fleetserve_autoscale_holds_total", {"outcome": "timeout"}) == 1


async def test_a_grpc_call_at_zero_replicas_waits_for_the_first_one(gateway: StartGateway,
                                                                    client: aiohttp.ClientSession) -> None:
    replica = await GrpcReplica("g0").start()
    gw = await autoscaled(gateway, grpc_port=free_port(), backend_grpc_port_offset=0, hold_max_requests=1)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as channel:
            infer = channel.unary_unary(GRPC_INFER)
            call = asyncio.ensure_future(infer(b"x", timeout=10))
            await until(lambda: gw.autoscaler is not None and gw.autoscaler.held == 1)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await infer(b"y", timeout=10)  # the queue is full: refused at once
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "already waiting" in (info.value.details() or "")
            assert ("retry-after", "1") in tuple(info.value.trailing_metadata() or ())
            await put(client, gw, {"ready": [replica.url]})
            assert await call == f"g0|{GRPC_INFER}|x".encode()
    finally:
        await replica.stop()


async def test_the_routes_refuse_what_they_cannot_do(replicas: StartReplicas, gateway: StartGateway,
                                                     client: aiohttp.ClientSession) -> None:
    (a,) = await replicas(1)
    plain = await gateway([a.url])
    async with client.get(plain.url + "/gateway/autoscale") as res:
        assert res.status == 404 and "autoscaling is off" in (await res.json())["error"]
    status, body = await put(client, plain, {"ready": [a.url]})
    assert status == 409 and "autoscaling is off" in body["error"]
    async with client.get(plain.url + "/metrics") as res:
        assert "fleetserve_autoscale_" not in await res.text()

    scaled_by_dns = await gateway([a.url], autoscale=AutoscaleConfig(rule="hpa"))
    status, body = await put(client, scaled_by_dns, {"ready": [a.url]})
    assert status == 409 and "its own discovery" in body["error"]

    gw = await autoscaled(gateway)
    async with client.put(gw.url + MEMBERS, data=b"{not json") as res:
        assert res.status == 400 and "JSON" in (await res.json())["error"]
    status, body = await put(client, gw, {"ready": [a.url], "draining": [a.url]})
    assert status == 400 and "listed twice" in body["error"]
    for query in ("wait_s=x", "wait_s=99", "wait_s=1&desired=two"):
        async with client.get(gw.url + "/gateway/autoscale?" + query) as res:
            assert res.status == 400, query
    async with client.post(gw.url + MEMBERS, json={"ready": []}) as res:
        assert res.status == 405
