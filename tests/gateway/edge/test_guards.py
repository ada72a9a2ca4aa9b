"""The edge guards wired into an in-process gateway: the per-replica in-flight cap (the balancer's, set from
the shedding section), identity headers, the rate-limit table gauge, and the guarded SO_REUSEPORT listener."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp
from prometheus_client import CollectorRegistry

from fleetserve.gateway.balance import BalancerConfig
from fleetserve.gateway.edge import EdgeConfig, InputLimits, RateLimitRule, ShedConfig
from fleetserve.gateway.edge.guards import RATELIMIT_ENTRIES, EdgeGuards
from fleetserve.gateway.edge.ratelimit import RateLimitMiddleware
from fleetserve.gateway.server import serve_gateway
from tests.support.fake_replica import FakeReplica
from tests.support.gateways import StartGateway, gateway_config
from tests.support.waiting import until

StartReplicas = Callable[[int], Awaitable[list[FakeReplica]]]
INFER = "/v2/models/m/infer"


def test_defaults_are_the_input_limits_and_the_adaptive_limit() -> None:
    registry = CollectorRegistry()
    guards = EdgeGuards.create(EdgeConfig(), registry)
    assert [type(m).__name__ for m in guards.middlewares] == ["HeadLimits", "AdaptiveConcurrencyMiddleware",
                                                              "BodyLimits"]
    assert registry.get_sample_value("fleetserve_gateway_rejected_total", {"reason": "overloaded"}) == 0.0
    assert registry.get_sample_value(RATELIMIT_ENTRIES, {"prefix": "/", "key": "ip"}) is None


def test_rate_limit_table_size_is_a_gauge() -> None:
    registry = CollectorRegistry()
    edge = EdgeConfig(rate_limits=(RateLimitRule(rate=1, burst=1, max_entries=3),
                                   RateLimitRule(rate=1, burst=1, prefix="/v2", max_entries=50)))
    guards = EdgeGuards.create(edge, registry, clock=lambda: 0.0)
    (limiter,) = [m.limiter for m in guards.middlewares if isinstance(m, RateLimitMiddleware)]
    for n in range(10):
        limiter.admit([0, 1], [f"ip:10.0.0.{n}", f"ip:10.0.0.{n}"])
    assert registry.get_sample_value(RATELIMIT_ENTRIES, {"prefix": "/", "key": "ip"}) == 3
    assert registry.get_sample_value(RATELIMIT_ENTRIES, {"prefix": "/v2", "key": "ip"}) == 10


async def test_a_replica_at_its_cap_is_passed_over_and_all_at_cap_is_503_at_once(
        replicas: StartReplicas, gateway: StartGateway, client: aiohttp.ClientSession) -> None:
    fleet = await replicas(2)
    for replica in fleet:
        replica.delay_s = 0.5
    edge = EdgeConfig(shedding=ShedConfig(max_inflight=100, retry_after_s=2.0, replica_max_inflight=1))
    # Round-robin alone would send the 1st and 3rd request to the same replica; the cap must not.
    gw = await gateway([r.url for r in fleet], edge=edge, balancer=BalancerConfig(policy="round-robin"))

    async def infer() -> tuple[int, str, float]:
        began = time.monotonic()
        async with client.post(gw.url + INFER, data=b"{}") as res:
            return res.status, res.headers.get("Retry-After", ""), time.monotonic() - began

    first = asyncio.gather(infer(), infer())
    await until(lambda: [r.hits for r in fleet] == [1, 1], what="both replicas hold one request each")
    status, retry_after, elapsed = await infer()
    assert (status, retry_after) == (503, "2") and elapsed < 0.3
    assert [status for status, _, _ in await first] == [200, 200]
    assert [r.hits for r in fleet] == [1, 1]
    assert gw.metrics.registry.get_sample_value("fleetserve_gateway_rejected_total", {"reason": "overloaded"}) == 1
    assert (await infer())[0] == 200  # slots are released after each request


async def test_identity_headers_come_only_from_the_gateway(replicas: StartReplicas, gateway: StartGateway,
                                                           client: aiohttp.ClientSession) -> None:
    (replica,) = await replicas(1)
    gw = await gateway([replica.url])
    forged = {"X-Fleetserve-Subject": "root", "x-fleetserve-tenant": "evil"}
    async with client.post(gw.url + INFER, data=b"{}", headers=forged) as res:
        assert res.status == 200
    assert not {k.lower() for k in replica.last_headers} & {"x-fleetserve-subject", "x-fleetserve-tenant"}


async def test_workers_listen_through_the_guard_on_a_shared_port(replicas: StartReplicas) -> None:
    (replica,) = await replicas(1)
    config = gateway_config([replica.url], edge=EdgeConfig(limits=InputLimits(header_read_timeout_s=0.3)))
    async with serve_gateway(config, reuse_port=True) as first:
        shared = gateway_config([replica.url], port=first.port, edge=config.edge)
        async with serve_gateway(shared, reuse_port=True) as second, aiohttp.ClientSession() as session:
            assert second.port == first.port
            async with session.post(first.url + INFER, data=b"{}") as res:
                assert res.status == 200
            reader, writer = await asyncio.open_connection("127.0.0.1", first.port)
            writer.write(b"POST /inference HTTP/1.1\r\nHost: gw\r\nX-Slow")
            answer = await asyncio.wait_for(reader.read(), timeout=5)
            # Granian (hyper) closes a connection whose head is late without answering it.
            assert answer.startswith(b"HTTP/1.1 408") or (config.server == "granian" and answer == b""), answer
            writer.close()
