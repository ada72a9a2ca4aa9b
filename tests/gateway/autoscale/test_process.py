"""A real gateway process with autoscaling on, in front of real ``tiny`` replica processes that an actuator
(this test) puts in and takes out: requests held at zero replicas (HTTP and gRPC) reach the first replica
put ready, and a replica moved to draining takes no new request but answers the one it holds."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import grpc
import grpc.aio

from tests.steady_load import PAYLOAD
from tests.support.procs import Proc, gateway, replica, wait_http

SERVER_LIVE = "/inference.GRPCInferenceService/ServerLive"
LIVE = b"\x08\x01"  # ServerLiveResponse{live: true}


def member(proc: Proc) -> dict[str, Any]:
    return {"url": proc.url, "labels": {"grpc_port": str(proc.grpc_port)}}


async def state(client: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with client.get(url + "/gateway/autoscale") as res:
        assert res.status == 200
        body: dict[str, Any] = await res.json()
        return body


async def test_a_real_fleet_follows_the_actuators_membership(unused_tcp_port: int) -> None:
    grpc_port = unused_tcp_port
    with replica("tiny", "--batch-latency-ms", "400", ready=False) as slow, replica("tiny", ready=False) as fast, \
            gateway([], "--discovery", "actuator", "--autoscale", "hpa", "--min-replicas", "0", "--max-replicas",
                    "2", "--grpc-port", str(grpc_port)) as front:
        for proc in (slow, fast):  # started side by side
            wait_http(proc.url + "/v2/health/ready", proc=proc)
        async with aiohttp.ClientSession() as client, \
                grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            # At zero replicas: one HTTP request and one gRPC call wait for the first replica.
            held_http = asyncio.create_task(client.post(front.url + "/inference", json=PAYLOAD))
            held_grpc = asyncio.ensure_future(channel.unary_unary(SERVER_LIVE)(b"", timeout=30))
            await eventually(lambda: held(client, front.url, 2), "two requests held")
            view = await state(client, front.url)
            assert view["desired"] >= 1 and view["decisions"][-1]["reason"] == "scale_from_zero", view
            async with client.put(front.url + "/gateway/autoscale/members",
                                  json={"ready": [member(slow)], "starting": [member(fast)]}) as res:
                assert res.status == 200
            async with await held_http as res:
                assert res.status == 200 and len((await res.json())["embeddings"]) == 2
            assert await held_grpc == LIVE

            # Draining: a request in flight on the slow replica finishes there; new ones go to the fast one.
            in_flight = asyncio.create_task(client.post(front.url + "/inference", json=PAYLOAD))
            await eventually(lambda: pending_on(client, front.url, slow.url), "a request in flight on the slow one")
            async with client.put(front.url + "/gateway/autoscale/members",
                                  json={"ready": [member(fast)], "draining": [member(slow)]}) as res:
                assert (res.status, (await res.json())["removed"]) == (200, 1)
            for _ in range(5):
                async with client.post(front.url + "/inference", json=PAYLOAD) as res:
                    assert res.status == 200
            async with await in_flight as res:
                assert res.status == 200  # not failed by the drain
            served = {proc.url: await inferences(client, proc.url) for proc in (slow, fast)}
            async with client.get(front.url + "/gateway/backends") as res:
                routed = [row["url"] for row in (await res.json())["backends"]]
    assert routed == [fast.url]
    assert served == {slow.url: 2, fast.url: 5}, served  # slow: the held request and the one in flight


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 20.0) -> None:
    """Poll an async condition (another process's state) until it holds; fail naming it after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"not true within {timeout_s} s: {what}"
        await asyncio.sleep(0.02)


async def held(client: aiohttp.ClientSession, url: str, count: int) -> bool:
    return bool((await state(client, url))["held_now"] == count)


async def pending_on(client: aiohttp.ClientSession, url: str, backend: str) -> bool:
    async with client.get(url + "/gateway/backends") as res:
        rows = (await res.json())["backends"]
    return any(row["url"] == backend and row["pending"] == 1 for row in rows)


async def inferences(client: aiohttp.ClientSession, replica_url: str) -> float:
    """Requests a replica answered, by its own ``fleetserve_requests_total``."""
    async with client.get(replica_url + "/metrics") as res:
        text = await res.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("fleetserve_requests_total{"))
