"""The replica's application and what ``start_replica`` wires into it (engine, batcher, served model, text
route, metrics), run in this process on 127.0.0.1 with the ``tiny`` model: readiness across warm-up and
drain, the load headers on every response, trace context, request metrics, the text route."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from fleetserve.batching.observer import NullObserver
from fleetserve.engine.config import EngineConfig
from fleetserve.models.tiny import HIDDEN
from fleetserve.replica.app import build_app
from fleetserve.replica.codec import CodecLimits
from fleetserve.replica.config import ReplicaConfig
from fleetserve.replica.load import LoadMeter, LoadReporter
from fleetserve.replica.server import Replica, start_replica
from fleetserve.wire import GPU_UTILIZATION, LOAD_REPORT_HEADER, parse_load_report
from tests.support.procs import accepts, http_up_at_grpc_start
from tests.support.waiting import until

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def _config(**overrides: object) -> ReplicaConfig:
    settings: dict[str, object] = {
        "engine": EngineConfig(model="tiny", max_batch=4), "host": "127.0.0.1", "port": 0, "grpc_port": 0,
        "drain_grace_s": 0.0, "drain_timeout_s": 10.0,
    }
    settings.update(overrides)
    return ReplicaConfig(**settings)  # type: ignore[arg-type]


@pytest.fixture
async def replica() -> AsyncIterator[Replica]:
    started = await start_replica(_config())
    try:
        yield started
    finally:
        if started.runner.sites:
            await started.drain()


async def test_the_grpc_listener_starts_before_http_so_readiness_means_both(
    unused_tcp_port_factory: Callable[[], int], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A readiness probe that answers (the gateway's health checks, `fleetserve up`) must find gRPC taking calls."""
    from fleetserve.replica import server

    http_port, grpc_port = unused_tcp_port_factory(), unused_tcp_port_factory()
    http_up_first = http_up_at_grpc_start(server, http_port, monkeypatch)
    started = await start_replica(_config(port=http_port, grpc_port=grpc_port))
    try:
        assert accepts(http_port) and accepts(grpc_port)
    finally:
        await started.drain()
    assert http_up_first == [False]


async def warm(replica: Replica) -> None:
    await replica.batcher.warmup()
    replica.model.warm = True


@pytest.fixture
async def http(replica: Replica) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(f"http://127.0.0.1:{replica.http_port}") as session:
        yield session


async def _metric(http: aiohttp.ClientSession, name: str, **labels: str) -> float:
    async with http.get("/metrics") as res:
        text = await res.text()
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series.startswith(name + "{") and ",".join(sorted(series[len(name) + 1:-1].split(","))) == wanted:
            return float(value)
    raise AssertionError(f"no {name}{{{wanted}}} in /metrics")


async def test_live_at_once_ready_only_after_warm_up(replica: Replica, http: aiohttp.ClientSession) -> None:
    async with http.get("/v2/health/live") as res:
        assert res.status == 200
    async with http.get("/v2/health/ready") as res:
        assert res.status == 503
    async with http.get("/health") as res:
        assert (res.status, await res.json(), res.headers["Retry-After"]) == (503, {"status": "warming up"}, "1")
    await warm(replica)
    async with http.get("/v2/health/ready") as res:
        assert res.status == 200
    async with http.get("/health") as res:
        assert (res.status, await res.json()) == (200, {"status": "ok"})


async def test_every_response_reports_the_replicas_load(http: aiohttp.ClientSession) -> None:
    for path in ("/v2/health/live", "/v2/models/nope", "/no/such/route"):
        async with http.get(path) as res:
            report = parse_load_report(res.headers[LOAD_REPORT_HEADER])
            assert report is not None and (report.queue_depth, report.inflight) == (0, 0), path


async def test_trace_context_is_continued_or_started(http: aiohttp.ClientSession) -> None:
    parent = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
    async with http.get("/v2/health/live", headers={"traceparent": parent}) as res:
        match = TRACEPARENT.fullmatch(res.headers["traceparent"])
    assert match is not None and match.group(1) == TRACE_ID and match.group(3) == "01"
    assert match.group(2) != "00f067aa0ba902b7"  # a span of its own
    async with http.get("/v2/health/live", headers={"traceparent": "garbage"}) as res:
        fresh = TRACEPARENT.fullmatch(res.headers["traceparent"])
    assert fresh is not None and fresh.group(1) != TRACE_ID and fresh.group(3) == "00"


async def test_text_route_embeds_and_is_counted(replica: Replica, http: aiohttp.ClientSession) -> None:
    await warm(replica)
    async with http.post("/inference", json={"texts": ["red running shoes", "a blue kettle"]}) as res:
        assert res.status == 200
        body = await res.json()
    embeddings = np.asarray(body["embeddings"])
    assert embeddings.shape == (2, HIDDEN) and body["truncated"] == []
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, rtol=1e-5)
    async with http.post("/inference", json={"texts": "not a list"}) as res:
        assert res.status == 400 and "must be a list of strings" in (await res.json())["error"]
    assert await _metric(http, "fleetserve_requests_total", model="tiny", code="200") == 1
    assert await _metric(http, "fleetserve_requests_total", model="tiny", code="400") == 1
    assert await _metric(http, "fleetserve_inflight_requests", model="tiny") == 0
    assert await _metric(http, "fleetserve_request_duration_seconds_count", model="tiny", stage="total") >= 1


async def test_health_and_metrics_routes_are_not_counted_as_requests(http: aiohttp.ClientSession) -> None:
    for _ in range(3):
        async with http.get("/v2/health/ready"):
            pass
    with pytest.raises(AssertionError, match="no fleetserve_requests_total"):
        await _metric(http, "fleetserve_requests_total", model="tiny", code="503")
    assert await _metric(http, "fleetserve_queue_depth", model="tiny") == 0
    assert await _metric(http, "fleetserve_engine_instances", model="tiny") == 1


async def test_drain_turns_unready_finishes_what_it_accepted_and_stops_listening() -> None:
    replica = await start_replica(_config(drain_grace_s=1.0, extra_latency_ms=300))
    await warm(replica)
    registry = replica.metrics.registry
    async with aiohttp.ClientSession(f"http://127.0.0.1:{replica.http_port}") as http:

        async def infer() -> int:
            async with http.post("/inference", json={"texts": ["still answered"]}) as res:
                return res.status

        accepted = asyncio.create_task(infer())
        await until(lambda: registry.get_sample_value("fleetserve_inflight_requests", {"model": "tiny"}) == 1,
                    what="the request is in flight")
        draining = asyncio.create_task(replica.drain())
        await until(lambda: replica.repo.draining, what="drain began")
        async with http.get("/v2/health/ready") as res:
            assert res.status == 503
        assert await accepted == 200
        await draining
        with pytest.raises(aiohttp.ClientConnectionError):
            await http.get("/v2/health/live")
    assert not replica.batcher.accepting


async def test_a_model_name_override_serves_under_that_name() -> None:
    replica = await start_replica(_config(model_name="ranker"))
    try:
        await warm(replica)
        async with aiohttp.ClientSession(f"http://127.0.0.1:{replica.http_port}") as http, \
                http.get("/v2/models/ranker/ready") as res:
            assert res.status == 200
    finally:
        await replica.drain()


async def test_gpu_load_is_reported_when_a_monitor_runs(replica: Replica) -> None:
    load = LoadReporter(replica.batcher, LoadMeter(NullObserver(), instances=1), lambda: {GPU_UTILIZATION: 0.75})
    app = build_app(replica.repo, replica.batcher, replica.metrics, text=None, limits=CodecLimits(),
                    max_body_bytes=1 << 20, load=load)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        async with aiohttp.ClientSession() as http, \
                http.get(f"http://127.0.0.1:{runner.addresses[0][1]}/v2/health/live") as res:
            report = parse_load_report(res.headers[LOAD_REPORT_HEADER])
            assert report is not None and report.gpu_utilization == 0.75
        async with aiohttp.ClientSession() as http, \
                http.post(f"http://127.0.0.1:{runner.addresses[0][1]}/inference", json={"texts": ["x"]}) as res:
            assert res.status == 404  # no text service wired: no text route
    finally:
        await runner.cleanup()
