"""The load generator against local servers: rates, coordinated omission, errors, bounds, stopping."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest

from fleetserve.bench.loadgen import LoadConfig, run_load
from tests.support.target import TargetServer, refused_url


def open_loop(url: str, **kwargs: Any) -> LoadConfig:
    base: dict[str, Any] = {"rate": 200.0, "concurrency": None, "duration_s": 1.0, "arrivals": "constant"}
    return LoadConfig(url=url, **{**base, **kwargs})


def closed_loop(url: str, **kwargs: Any) -> LoadConfig:
    return LoadConfig(url=url, **{"rate": None, "concurrency": 4, "duration_s": 1.0, **kwargs})


def consistent(report: Any) -> None:
    assert report.ok + report.errors == report.requests
    assert sum(row.ok for row in report.timeseries) == report.ok
    assert sum(row.errors for row in report.timeseries) == report.errors
    assert sum(row.sent for row in report.timeseries) == report.sent


async def test_open_loop_achieves_the_target_rate(server: TargetServer) -> None:
    report = await run_load(open_loop(server.url, rate=400.0, duration_s=1.5, warmup_s=0.2))
    consistent(report)
    # Constant arrivals: exactly rate * duration requests are scheduled in the measured window.
    assert report.requests == pytest.approx(600, abs=1)
    assert report.errors == 0
    assert report.achieved_rps == pytest.approx(400, rel=0.05)
    assert report.duration_s == 1.5
    # Service latency (from the actual send) never exceeds latency from the schedule.
    assert report.service_latency_s["max"] <= report.latency_s["max"]
    # Warmup requests reached the server but are not in the report.
    assert server.seen.requests == pytest.approx(680, abs=2)
    assert [row.sent for row in report.timeseries[:1]] == [400]


async def test_poisson_arrivals_average_the_target_rate(server: TargetServer) -> None:
    report = await run_load(open_loop(server.url, rate=500.0, duration_s=1.5, arrivals="poisson", seed=3))
    assert report.requests == pytest.approx(750, rel=0.12)
    assert report.errors == 0


async def test_a_stall_shows_in_open_loop_p99_but_hides_in_closed_loop(server: TargetServer) -> None:
    async def stall_after(delay: float) -> None:
        await asyncio.sleep(delay)
        server.stall(0.2)

    stall = asyncio.create_task(stall_after(0.8))
    opened = await run_load(open_loop(server.url, rate=300.0, duration_s=1.6, warmup_s=0.1))
    await stall
    stall = asyncio.create_task(stall_after(0.8))
    closed = await run_load(closed_loop(server.url, concurrency=2, duration_s=1.6, warmup_s=0.1))
    await stall
    # ~60 requests were scheduled during the 200 ms stall; each waited up to 200 ms: the tail shows it.
    assert opened.percentile(99) >= 0.12
    assert opened.latency_s["max"] >= 0.18
    # The generator kept its schedule: the stall is the server's, seen from the actual sends too.
    assert opened.service_latency_s["p99"] >= 0.12
    # Two closed-loop clients simply stopped sending: 2 slow samples among thousands.
    assert closed.latency_s["max"] >= 0.18
    assert closed.percentile(99) < 0.05
    assert closed.ok > 10 * 2 / 0.2


async def test_errors_are_counted_by_http_status(server: TargetServer) -> None:
    server.behaviour.status = 500
    report = await run_load(open_loop(server.url, rate=100.0, duration_s=0.5))
    consistent(report)
    assert report.errors_by_type == {"http_500": 50}
    assert report.ok == 0 and report.samples_kept == 0


async def test_connection_refused_is_counted() -> None:
    report = await run_load(open_loop(refused_url(), rate=100.0, duration_s=0.5))
    consistent(report)
    assert report.errors_by_type == {"connect": 50}


async def test_timeouts_are_counted(server: TargetServer) -> None:
    server.behaviour.delay_s = 1.0
    begin = time.monotonic()
    report = await run_load(open_loop(server.url, rate=40.0, duration_s=0.5, timeout_s=0.2))
    consistent(report)
    assert report.errors_by_type == {"timeout": 20}
    # The generator waits for outstanding requests only as long as their timeout.
    assert time.monotonic() - begin < 1.5


async def test_requests_over_max_inflight_are_dropped_not_skipped(server: TargetServer) -> None:
    server.behaviour.delay_s = 0.5
    report = await run_load(open_loop(server.url, rate=100.0, duration_s=0.5, max_inflight=10))
    consistent(report)
    assert report.requests == 50
    assert report.errors_by_type == {"dropped": 40}
    assert report.sent == report.ok == 10
    assert server.seen.peak_inflight == 10


async def test_open_loop_latency_includes_the_wait_for_a_connection(server: TargetServer) -> None:
    server.behaviour.delay_s = 0.05
    # One connection serves 20 req/s; 40 req/s queue in the client, and that queueing is latency.
    report = await run_load(open_loop(server.url, rate=40.0, duration_s=0.5, connections=1))
    assert report.ok == 20
    assert report.latency_s["max"] >= 0.4
    assert server.seen.peak_inflight == 1


async def test_closed_loop_keeps_concurrency_requests_in_flight(server: TargetServer) -> None:
    server.behaviour.delay_s = 0.01
    report = await run_load(closed_loop(server.url, concurrency=3, duration_s=0.6))
    consistent(report)
    assert server.seen.peak_inflight == 3
    assert report.errors == 0
    # 3 clients, at least 10 ms per request: never more than 3 * 60 (and far more than 3).
    assert 30 < report.ok <= 180
    assert report.target_rps is None and report.mode == "closed"


async def test_stop_ends_the_run_early(server: TargetServer) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.3, stop.set)
    begin = time.monotonic()
    report = await run_load(open_loop(server.url, duration_s=30.0), stop=stop)
    assert time.monotonic() - begin < 2.0
    # The stop lands 0.3 s after the call; the run's own clock starts after its set-up, and a busy box makes
    # both late, so the bounds are loose: what matters is that it ended far short of 30 s, at the asked rate.
    assert 0.1 <= report.duration_s <= 1.0
    assert report.requests == pytest.approx(200 * report.duration_s, abs=20)
    assert report.achieved_rps == pytest.approx(200, rel=0.3)


@pytest.mark.parametrize("workload", ["texts", "rank", "v2-json", "v2-binary"])
async def test_workloads_reach_the_server(server: TargetServer, workload: str) -> None:
    report = await run_load(open_loop(server.url, rate=50.0, duration_s=0.2, workload=workload, model="m"))
    assert report.ok == 10
    expected = "/v2/models/m/infer" if workload.startswith("v2") else "/inference"
    assert set(server.seen.paths) == {expected}


async def test_report_records_the_config_without_secrets(server: TargetServer) -> None:
    config = open_loop(server.url, rate=50.0, duration_s=0.2, headers={"Authorization": "Bearer s3cret"})
    report = await run_load(config)
    assert server.seen.headers[0]["Authorization"] == "Bearer s3cret"
    assert server.seen.headers[0]["X-Fleetserve-Timeout-Ms"] == "10000"  # the client's deadline travels with it
    assert report.config["headers"] == {"Authorization": "<redacted>"}
    assert "s3cret" not in str(report.to_json())
    assert report.config["client"] == "fast" and report.config["connections"] == 512


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": 10.0, "concurrency": 2}, "exactly one"),
        ({"rate": None, "concurrency": None}, "exactly one"),
        ({"rate": -1.0}, "rate"),
        ({"rate": None, "concurrency": 0}, "concurrency"),
        ({"duration_s": 0.0}, "duration"),
        ({"warmup_s": -1.0}, "warmup"),
        ({"arrivals": "bursty"}, "arrivals"),
        ({"workload": "images"}, "workload"),
        ({"max_inflight": 0}, "max_inflight"),
        ({"client": "curl"}, "client"),
        ({"processes": 0}, "processes"),
        ({"rate": None, "concurrency": 1, "processes": 2}, "concurrency"),
        ({"timeout_s": 0.0}, "timeout"),
        ({"url": "localhost:8000"}, "url"),
        ({"long_fraction": 2.0}, "long_fraction"),
    ],
)
def test_config_validation(kwargs: dict[str, Any], message: str) -> None:
    url = kwargs.pop("url", "http://127.0.0.1:1")
    with pytest.raises(ValueError, match=message):
        open_loop(url, **kwargs)


def test_split_shares_the_load_over_processes() -> None:
    config = open_loop("http://h:1", rate=1000.0, max_inflight=101, connections=10, processes=3, max_samples=1000)
    parts = config.split()
    assert [p.processes for p in parts] == [1, 1, 1]
    assert sum(p.rate or 0 for p in parts) == pytest.approx(1000.0)
    assert sum(p.max_inflight for p in parts) == 101
    assert sum(p.connections or 0 for p in parts) == 10
    assert sum(p.max_samples for p in parts) == 1000
    assert len({p.seed for p in parts}) == 3
    closed = replace(config, rate=None, concurrency=7).split()
    assert sorted(p.concurrency or 0 for p in closed) == [2, 2, 3]
