"""Metrics across workers: a scrape of any worker reports the whole gateway (merged expositions), in process
and with a real ``fleetserve gateway --workers 2``."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetserve.gateway.metrics import GatewayMetrics
from fleetserve.gateway.server import serve_gateway
from fleetserve.telemetry.scrape import WorkerSet, merge
from tests.gateway.test_server import spawn, wait_exit, wait_listening  # noqa: F401  (spawn is a fixture)
from tests.support.fake_replica import FakeReplica
from tests.support.gateways import gateway_config
from tests.support.procs import free_port

StartReplicas = Callable[[int], Awaitable[list[FakeReplica]]]


def values(text: str | bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body = text.decode() if isinstance(text, bytes) else text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def worker_registry(requests: int, healthy: int, latency_s: float) -> str:
    registry = CollectorRegistry()
    Counter("fleetserve_gateway_requests", "r", ["code"], registry=registry).labels("200").inc(requests)
    Gauge("fleetserve_gateway_backends", "b", ["state"], registry=registry).labels("healthy").set(healthy)
    Gauge("fleetserve_gateway_inflight_requests", "i", registry=registry).set(requests % 3)
    Histogram("fleetserve_gateway_upstream_duration_seconds", "d", registry=registry,
              buckets=(0.01, 0.1)).observe(latency_s)
    return generate_latest(registry).decode()


def test_merge_sums_amounts_and_takes_the_largest_view_of_the_fleet() -> None:
    merged = values(merge([worker_registry(12, 3, 0.005), worker_registry(8, 2, 0.05)]))
    assert merged[("fleetserve_gateway_requests_total", (("code", "200"),))] == 20
    assert merged[("fleetserve_gateway_backends", (("state", "healthy"),))] == 3  # not 5: one fleet, two views
    assert merged[("fleetserve_gateway_inflight_requests", ())] == 0 + 2
    bucket = "fleetserve_gateway_upstream_duration_seconds_bucket"
    assert (merged[(bucket, (("le", "0.01"),))], merged[(bucket, (("le", "0.1"),))]) == (1, 2)
    assert merged[("fleetserve_gateway_upstream_duration_seconds_sum", ())] == 0.055
    assert merged[("fleetserve_gateway_workers", ())] == 2


def test_merge_keeps_the_earliest_created_time() -> None:
    def exposition(created: float) -> str:
        return ("# HELP fleetserve_gateway_retries_total r\n# TYPE fleetserve_gateway_retries_total counter\n"
                "fleetserve_gateway_retries_total 1.0\n"
                "# HELP fleetserve_gateway_retries_created r\n# TYPE fleetserve_gateway_retries_created gauge\n"
                f"fleetserve_gateway_retries_created {created}\n")

    merged = values(merge([exposition(1700000050.0), exposition(1700000010.0)]))
    assert merged[("fleetserve_gateway_retries_created", ())] == 1700000010.0
    processes = values(merge([generate_latest(GatewayMetrics().registry).decode() for _ in range(2)]))
    single = values(generate_latest(GatewayMetrics().registry))
    assert processes[("process_start_time_seconds", ())] == single[("process_start_time_seconds", ())]
    assert processes[("process_max_fds", ())] == single[("process_max_fds", ())]
    assert merged[("fleetserve_gateway_retries_total", ())] == 2


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with session.get(url + "/metrics") as res:
        assert res.status == 200
        return values(await res.text())


def requests_total(scraped: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
    return sum(v for (name, _), v in scraped.items() if name == "fleetserve_gateway_requests_total")


async def test_each_worker_answers_for_all(tmp_path: Path, replicas: StartReplicas,
                                          client: aiohttp.ClientSession) -> None:
    (replica,) = await replicas(1)
    async with contextlib.AsyncExitStack() as stack:
        gateways = [await stack.enter_async_context(serve_gateway(
            gateway_config([replica.url]), workers=WorkerSet(str(tmp_path), i, 2), rng=random.Random(i)))
            for i in range(2)]
        for n, gw in enumerate(gateways):
            for _ in range(3 + 4 * n):
                async with client.post(gw.url + "/v2/models/m/infer", data=b"{}") as res:
                    assert res.status == 200
        for gw in gateways:
            scraped = await scrape(client, gw.url)
            assert requests_total(scraped) == 10
            assert scraped[("fleetserve_gateway_workers", ())] == 2
            assert scraped[("fleetserve_gateway_backends", (("state", "healthy"),))] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # each worker removed its socket


async def test_a_two_worker_gateway_process_reports_every_request_in_every_scrape(
        replicas: StartReplicas, spawn: Callable[..., subprocess.Popen[str]]) -> None:  # noqa: F811
    (replica,) = await replicas(1)
    port = free_port()
    proc = spawn("--backend", replica.url, "--host", "127.0.0.1", "--port", str(port), "--workers", "2")
    await wait_listening(port, proc)
    url = f"http://127.0.0.1:{port}"

    async def fresh(action: Callable[[aiohttp.ClientSession], Awaitable[object]]) -> object:
        # A new connection each time: the kernel spreads connections, not requests, across workers.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            return await action(session)

    async def both_workers_up() -> None:
        while (await fresh(lambda s: scrape(s, url))).get(("fleetserve_gateway_workers", ())) != 2:  # type: ignore[union-attr]
            await asyncio.sleep(0.05)

    await asyncio.wait_for(both_workers_up(), 20.0)

    async def infer(session: aiohttp.ClientSession) -> int:
        async with session.post(url + "/v2/models/m/infer", data=b"{}") as res:
            return res.status

    assert [await fresh(infer) for _ in range(20)] == [200] * 20
    totals = [requests_total(await fresh(lambda s: scrape(s, url))) for _ in range(8)]  # type: ignore[arg-type]
    assert totals == [20.0] * 8
    proc.send_signal(signal.SIGTERM)
    assert await wait_exit(proc) == 0


def test_merge_takes_one_reading_of_the_gpus_and_sums_the_engine_instances() -> None:
    """A replica's front ends each sample the same GPU; the engine process alone reports its instances."""
    def front_end(utilization: float) -> str:
        registry = CollectorRegistry()
        Gauge("fleetserve_gpu_utilization_ratio", "u", ["gpu"], registry=registry).labels("0").set(utilization)
        Gauge("fleetserve_engine_instances", "i", ["model"], registry=registry).labels("m").set(0)
        return generate_latest(registry).decode()

    engine = CollectorRegistry()
    Gauge("fleetserve_engine_instances", "i", ["model"], registry=engine).labels("m").set(2)
    merged = values(merge([front_end(0.8), front_end(0.7), generate_latest(engine).decode()]))
    assert merged[("fleetserve_gpu_utilization_ratio", (("gpu", "0"),))] == 0.8
    assert merged[("fleetserve_engine_instances", (("model", "m"),))] == 2
