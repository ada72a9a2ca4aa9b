"""Admin endpoints: liveness, the backends snapshot, and the Prometheus text."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp

from tests.support.fake_replica import FakeReplica
from tests.support.gateways import StartGateway

StartReplicas = Callable[[int], Awaitable[list[FakeReplica]]]

METRIC_NAMES = (
    "fleetserve_gateway_requests_total",
    "fleetserve_gateway_upstream_duration_seconds",
    "fleetserve_gateway_retries_total",
    "fleetserve_gateway_ejections_total",
    "fleetserve_gateway_retry_budget_exhausted_total",
    "fleetserve_gateway_inflight_requests",
    "fleetserve_gateway_backends",
    "fleetserve_gateway_request_duration_seconds",
    "process_cpu_seconds_total",
)


async def test_healthz_is_live_even_without_healthy_backends(replicas: StartReplicas, gateway: StartGateway,
                                                             client: aiohttp.ClientSession) -> None:
    (replica,) = await replicas(1)
    gw = await gateway([replica.url])
    await replica.stop()
    async with client.get(gw.url + "/healthz") as res:
        assert res.status == 200
        assert await res.json() == {"status": "ok"}


async def test_backends_snapshot(replicas: StartReplicas, gateway: StartGateway,
                                 client: aiohttp.ClientSession) -> None:
    fleet = await replicas(2)
    fleet[0].queue_depth = 3
    gw = await gateway([fleet[0].url, fleet[1].url + "=3"])
    async with client.post(gw.url + "/v2/models/m/infer", data=b"{}") as res:
        assert res.status == 200
    async with client.get(gw.url + "/gateway/backends") as res:
        assert res.status == 200
        snapshot = await res.json()
    assert snapshot["policy"] == "p2c-peak-ewma"
    assert snapshot["panic"] is False
    rows = {row["url"]: row for row in snapshot["backends"]}
    assert set(rows) == {fleet[0].url, fleet[1].url}
    assert rows[fleet[1].url]["weight"] == 3
    assert {row["state"] for row in rows.values()} == {"healthy"}
    assert sum(row["reported_queue_depth"] is not None for row in rows.values()) == 1


async def test_metrics_text_has_every_gateway_metric(replicas: StartReplicas, gateway: StartGateway,
                                                     client: aiohttp.ClientSession) -> None:
    fleet = await replicas(2)
    gw = await gateway([r.url for r in fleet])
    for _ in range(4):
        async with client.post(gw.url + "/v2/models/m/infer", data=b"{}") as res:
            assert res.status == 200
    async with client.get(gw.url + "/metrics") as res:
        assert res.status == 200
        assert res.headers["Content-Type"].startswith("text/plain")
        text = await res.text()
    for name in METRIC_NAMES:
        assert f"# TYPE {name.removesuffix('_total')}" in text, name
    served = [line for line in text.splitlines() if line.startswith("fleetserve_gateway_requests_total{")]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in served) == 4
    assert all('code="200"' in line for line in served)
    assert 'fleetserve_gateway_backends{state="healthy"} 2.0' in text
    assert "fleetserve_gateway_inflight_requests 0.0" in text


async def test_readyz_waits_for_a_healthy_backend_then_stays_ready(replicas: StartReplicas, gateway: StartGateway,
                                                                   client: aiohttp.ClientSession) -> None:
    (replica,) = await replicas(1)
    replica.mode = "unready"
    gw = await gateway([replica.url], health_checks=True)  # backends start unknown until probed
    async with client.get(gw.url + "/readyz") as res:
        assert res.status == 503 and res.headers["Retry-After"] == "1"
        assert "health checks" in (await res.json())["status"]
    replica.mode = "ok"
    for ep in gw.balancer.endpoints():
        for _ in range(gw.config.balancer.healthy_threshold):
            gw.balancer.set_probe_result(ep, True)
    async with client.get(gw.url + "/readyz") as res:
        assert res.status == 200
    for ep in gw.balancer.endpoints():
        for _ in range(gw.config.balancer.unhealthy_threshold):
            gw.balancer.set_probe_result(ep, False)
    async with client.get(gw.url + "/readyz") as res:  # an outage later keeps the gateway in its Service
        assert res.status == 200


async def test_end_to_end_latency_counts_proxied_requests_only(replicas: StartReplicas, gateway: StartGateway,
                                                               client: aiohttp.ClientSession) -> None:
    (replica,) = await replicas(1)
    replica.delay_s = 0.02
    gw = await gateway([replica.url])
    for path in ("/v2/models/m/infer", "/inference", "/v2/models/m/infer"):
        async with client.post(gw.url + path, data=b"{}") as res:
            assert res.status == 200
    for path in ("/metrics", "/healthz", "/gateway/backends", "/no/such/route"):
        async with client.get(gw.url + path) as res:
            await res.read()
    registry = gw.metrics.registry
    name = "fleetserve_gateway_request_duration_seconds"
    assert registry.get_sample_value(f"{name}_count") == 3
    assert registry.get_sample_value(f"{name}_bucket", {"le": "0.02"}) == 0  # each took the replica's 20 ms
    assert registry.get_sample_value(f"{name}_sum") >= 0.06
