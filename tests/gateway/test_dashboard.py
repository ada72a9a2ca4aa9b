"""The dashboard's frames: rates, shares and quantiles from the gateway's own counters, on a fake clock."""

from __future__ import annotations

import math
import random

import pytest

from fleetserve.gateway.balance import Balancer, BalancerConfig
from fleetserve.gateway.balance.discovery import Insert, Remove
from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.dashboard.sampler import FleetSampler, quantile
from fleetserve.gateway.metrics import NO_BACKEND, GatewayMetrics
from tests.support.clock import FakeClock

A = Endpoint.from_url("http://10.0.0.1:8000")
B = Endpoint.from_url("http://10.0.0.2:8000")
INF = math.inf


def test_quantile_interpolates_inside_the_bucket_like_histogram_quantile() -> None:
    bounds = [0.01, 0.02, INF]
    assert quantile(0.5, bounds, [50, 100, 100]) == pytest.approx(0.01)
    assert quantile(0.99, bounds, [50, 100, 100]) == pytest.approx(0.01 + 0.01 * 49 / 50)
    assert quantile(0.25, bounds, [50, 100, 100]) == pytest.approx(0.005)  # the first bucket starts at 0
    assert quantile(0.99, bounds, [0, 10, 20]) == 0.02  # in +Inf: the highest finite bound
    assert quantile(0.5, bounds, [0, 0, 0]) is None


def _fleet(clock: FakeClock) -> tuple[GatewayMetrics, Balancer, FleetSampler]:
    metrics = GatewayMetrics()
    balancer = Balancer(BalancerConfig(), clock=clock, rng=random.Random(1), observer=metrics)
    for ep in (A, B):
        balancer.apply(Insert(ep))
    sampler = FleetSampler(metrics, balancer, "p2c-peak-ewma", window_s=5.0,
                           history_s=10.0, clock=clock, wall=lambda: clock.now + 1.7e9)
    return metrics, balancer, sampler


def _serve(metrics: GatewayMetrics, ep: Endpoint, n: int, latency_s: float, code: int = 200) -> None:
    for _ in range(n):
        metrics.observe_attempt(ep.url, latency_s)
        metrics.observe_request(ep.url, code)
        metrics.request_duration.series().observe(latency_s + 0.0005)


def test_a_frame_has_rates_shares_and_quantiles_over_the_window() -> None:
    clock = FakeClock(1000.0)
    metrics, balancer, sampler = _fleet(clock)
    _serve(metrics, A, 40, 0.004)  # before the window: not counted
    sampler.tick()
    for _ in range(5):
        clock.now += 1.0
        _serve(metrics, A, 30, 0.009)
        _serve(metrics, B, 10, 0.018, code=503)
        metrics.retries.inc(2)
        sampler.tick()
    frame = sampler.payload()["frame"]
    assert isinstance(frame, dict)
    assert frame["window_s"] == 5.0 and frame["policy"] == "p2c-peak-ewma"
    rows = {row["url"]: row for row in frame["replicas"]}
    assert rows[A.url]["rps"] == 30.0 and rows[B.url]["rps"] == 10.0
    assert rows[A.url]["share"] == 0.75 and rows[B.url]["share"] == 0.25
    assert rows[B.url]["error_rps"] == 10.0 and rows[A.url]["error_rps"] == 0.0
    # 0.009 s lies in the (0.008, 0.01] bucket, 0.018 s in (0.015, 0.02]: no trace of the 4 ms before the window.
    assert 8.0 < rows[A.url]["p50_ms"] <= 10.0 and 15.0 < rows[B.url]["p99_ms"] <= 20.0
    assert rows[A.url]["state"] == "healthy" and rows[A.url]["ejections"] == 0.0
    fleet = frame["fleet"]
    assert fleet["rps"] == 40.0 and fleet["error_rps"] == 10.0 and fleet["retries_ps"] == 2.0
    assert 8.0 < fleet["p50_ms"] <= 10.0 and 15.0 < fleet["p99_ms"] <= 20.0
    assert frame["autoscale"] == {"mode": "off", "desired": None, "actual": 2, "healthy": 2}
    balancer.apply(Remove(A))
    assert [row["url"] for row in sampler.tick()["replicas"]] == [B.url]


def test_polls_get_only_newer_points_and_history_is_bounded() -> None:
    clock = FakeClock(1000.0)
    metrics, _, sampler = _fleet(clock)
    for _ in range(15):
        _serve(metrics, A, 3, 0.002)
        sampler.tick()
        clock.now += 1.0
    everything = sampler.payload()["points"]
    assert isinstance(everything, list) and len(everything) == 10  # history_s / interval_s
    newest = everything[-1]
    assert newest["replicas"][A.url] == 3.0 and newest["rps"] == 3.0
    assert sampler.payload(since=everything[-3]["t"])["points"] == everything[-2:]
    assert sampler.payload(since=newest["t"])["points"] == []


def test_a_backend_that_left_and_came_back_never_shows_a_negative_rate() -> None:
    clock = FakeClock(1000.0)
    metrics, balancer, sampler = _fleet(clock)
    _serve(metrics, A, 50, 0.002)
    metrics.observe_request(NO_BACKEND, 503)
    sampler.tick()
    balancer.apply(Remove(A))  # its series are dropped ...
    balancer.apply(Insert(A))  # ... and start again from zero
    clock.now += 5.0
    _serve(metrics, A, 5, 0.002)
    rows = {row["url"]: row for row in sampler.tick()["replicas"]}
    assert rows[A.url]["rps"] == 1.0 and rows[A.url]["p50_ms"] is not None


def test_the_sampler_refuses_inconsistent_windows() -> None:
    with pytest.raises(ValueError, match="window_s"):
        FleetSampler(GatewayMetrics(), Balancer(BalancerConfig()), "x", window_s=0.5,
                     interval_s=1.0)


class Scaling:
    """The autoscaler as the sampler reads it."""

    def __init__(self) -> None:
        self.view: dict[str, object] = {"rule": "hpa", "desired": None, "ready": None, "starting": None,
                                        "draining": None, "held": 0}

    def summary(self) -> dict[str, object]:
        return self.view


def test_frames_and_points_show_desired_vs_actual_replicas_when_autoscaling() -> None:
    clock = FakeClock(1000.0)
    metrics = GatewayMetrics()
    balancer = Balancer(BalancerConfig(), clock=clock, observer=metrics)
    balancer.apply(Insert(A))
    scaling = Scaling()
    sampler = FleetSampler(metrics, balancer, "p2c-peak-ewma", clock=clock, autoscale=scaling)
    assert sampler.tick()["autoscale"] == {"mode": "hpa", "desired": None, "actual": None, "healthy": 1,
                                           "starting": None, "draining": None, "held": 0}
    scaling.view = {"rule": "hpa", "desired": 3, "ready": 1, "starting": 2, "draining": 0, "held": 4}
    clock.now += 1.0
    frame = sampler.tick()
    assert frame["autoscale"] == {"mode": "hpa", "desired": 3, "actual": 1, "healthy": 1, "starting": 2,
                                  "draining": 0, "held": 4}
    points = sampler.payload()["points"]
    assert isinstance(points, list)
    assert [(p["desired"], p["actual"]) for p in points] == [(None, None), (3, 1)]


def test_without_an_autoscaler_the_points_carry_the_replica_count() -> None:
    clock = FakeClock(1000.0)
    _, _, sampler = _fleet(clock)
    sampler.tick()
    points = sampler.payload()["points"]
    assert isinstance(points, list)
    assert (points[-1]["desired"], points[-1]["actual"]) == (None, 2)
