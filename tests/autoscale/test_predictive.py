"""The predictive rule: catches a ramp before hpa does, learns capacity, ignores Poisson noise, never scales down
faster than hpa, scales on rising latency."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from fleetserve.autoscale.config import AutoscaleConfig, HpaConfig
from fleetserve.autoscale.controller import Autoscaler
from fleetserve.autoscale.rules import RULES
from fleetserve.autoscale.rules.hpa import HpaRule
from fleetserve.autoscale.rules.predictive import PredictiveRule, theil_sen
from tests.autoscale.support import ToyFleet, signals

# HPA on rows in flight per replica (the toy's busy share) at 80%, like a CPU-utilisation HPA.
CONFIG = AutoscaleConfig(rule="predictive", min_replicas=1, max_replicas=100, slo_p99_ms=250.0,
                         hpa=HpaConfig(target_queue_depth=4.0, target_inflight=0.8, target_gpu_utilization=0.0))


def ramp(t: float) -> float:
    """100 requests/s for a minute, then up 10x over the next minute, then flat."""
    return 100.0 if t < 60 else min(1000.0, 100.0 + 900.0 * (t - 60) / 60)


def run(rule_name: str, rate: Callable[[float], float], seconds: int, ready: int = 3, noise: int | None = None,
        config: AutoscaleConfig = CONFIG) -> tuple[ToyFleet, list[int], list[float], Autoscaler]:
    """Drive the toy fleet for ``seconds`` under the named rule; the desired counts and p99s per second."""
    scaler = Autoscaler.from_config(replace(config, rule=rule_name))
    fleet = ToyFleet(ready)
    rng = np.random.default_rng(noise) if noise is not None else None
    desired, p99s = [], []
    for t in range(seconds):
        r = rate(float(t))
        observed = float(rng.poisson(r)) if rng is not None else r
        snap = fleet.step(float(t), observed)
        d = scaler.tick(snap).desired
        fleet.apply(float(t), d)
        desired.append(d)
        p99s.append(snap.p99_s or 0.0)
    return fleet, desired, p99s, scaler


def test_the_registry_names_it() -> None:
    assert RULES.load("predictive") is PredictiveRule


def test_theil_sen_ignores_outliers_that_least_squares_follows() -> None:
    x = np.arange(30, dtype=float)
    y = 2.0 * x + 5.0
    y[[3, 17, 25]] += 400.0  # three bursts
    slope, intercept = theil_sen(x, y)
    assert slope == pytest.approx(2.0) and intercept == pytest.approx(5.0)
    assert np.polyfit(x, y, 1)[1] > 20.0  # least squares' intercept is dragged up by the bursts


def test_a_ramp_is_caught_earlier_and_with_fewer_slo_violations_than_hpa() -> None:
    _, hpa_desired, hpa_p99, _ = run("hpa", ramp, 180)
    _, pred_desired, pred_p99, scaler = run("predictive", ramp, 180)
    first = {name: next(t for t, d in enumerate(ds) if d >= 8) for name, ds in
             (("hpa", hpa_desired), ("predictive", pred_desired))}
    assert first["predictive"] < first["hpa"]
    hpa_violations = sum(p > 0.25 for p in hpa_p99)
    pred_violations = sum(p > 0.25 for p in pred_p99)
    assert hpa_violations > 0 and pred_violations <= hpa_violations / 2
    assert {reason for (direction, reason) in scaler.counts() if direction == "up"} & {"forecast", "step"}


def test_capacity_is_the_highest_rate_per_replica_that_held_the_slo_for_the_confirmation_time() -> None:
    rule = PredictiveRule(CONFIG)
    assert rule.capacity is None
    for t in range(10):
        rule.recommend(signals(float(t), 4, request_rate=120.0, p99_s=0.05))
    assert rule.capacity == pytest.approx(30.0)  # 120/s over 4 replicas, held for 5 s and more
    for t in range(10, 13):  # more load, and the SLO breaks 2 s later: latency lagged, it was not capacity
        rule.recommend(signals(float(t), 4, request_rate=200.0, p99_s=0.05 if t < 12 else 0.4))
    for t in range(13, 30):
        rule.recommend(signals(float(t), 4, request_rate=100.0, p99_s=0.05))
    assert rule.capacity == pytest.approx(30.0)


def test_lead_is_the_measured_startup_plus_one_tick() -> None:
    rule = PredictiveRule(CONFIG)
    assert rule.lead_s(signals(0.0, 1)) == pytest.approx(CONFIG.predictive.startup_s + 1.0)
    assert rule.lead_s(signals(0.0, 1, startup_s=1.5)) == pytest.approx(2.5)


def test_a_longer_startup_makes_it_scale_earlier() -> None:
    def first_up(startup_s: float) -> int:
        rule = PredictiveRule(CONFIG)
        for t in range(30):  # 40/s per replica holds the SLO: that is the capacity
            rule.recommend(signals(float(t), 4, request_rate=160.0, inflight=3.2, p99_s=0.05, startup_s=startup_s))
        for t in range(30, 60):  # a lull
            rule.recommend(signals(float(t), 4, request_rate=100.0, inflight=3.2, p99_s=0.05, startup_s=startup_s))
        for t in range(60, 150):
            rate = 100.0 + 2.0 * (t - 60)
            rec = rule.recommend(signals(float(t), 4, request_rate=rate, inflight=3.2, startup_s=startup_s))
            if rec.replicas > 4:
                return t
        raise AssertionError("never scaled up")

    assert first_up(20.0) < first_up(1.0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_poisson_noise_does_not_make_it_flap(seed: int) -> None:
    _, desired, _, _ = run("predictive", lambda t: 200.0, 600, ready=6, noise=seed)
    changes = [(t, a, b) for t, (a, b) in enumerate(itertools.pairwise(desired)) if a != b]
    reversals = sum(1 for x, y in itertools.pairwise(changes) if (x[2] > x[1]) != (y[2] > y[1]))
    assert len(changes) <= 2 and reversals == 0, changes
    assert 5 <= desired[-1] <= 7  # 200/s at 40/s planned per replica: 5; a noisy peak may hold one more


def test_scale_down_is_never_faster_than_hpa() -> None:
    def fall(t: float) -> float:
        return 800.0 if t < 120 else 100.0

    _, hpa_desired, _, _ = run("hpa", fall, 700, ready=20)
    _, pred_desired, _, _ = run("predictive", fall, 700, ready=20)
    assert all(p >= h for p, h in zip(pred_desired, hpa_desired, strict=True))
    assert pred_desired[200] == pred_desired[119]  # held through the 300 s scale-down window
    assert pred_desired[-1] < pred_desired[119]  # and down afterwards


def test_latency_trending_through_the_slo_within_the_lead_adds_replicas() -> None:
    rule = PredictiveRule(CONFIG)  # trigger at 80% of 250 ms; lead 5 s + 1 tick
    recs = [rule.recommend(signals(float(t), 10, inflight=8.0, p99_s=0.105 + 0.02 * t)) for t in range(8)]
    assert [r.replicas for r in recs[:5]] == [10] * 5  # 185 ms at t=4: below the trigger
    assert (recs[5].replicas, recs[5].reason) == (11, "latency_trend")  # 205 ms, reaching 325 ms within the lead


def test_rising_latency_adds_nothing_while_replicas_are_starting() -> None:
    rule = PredictiveRule(CONFIG)
    recs = [rule.recommend(signals(float(t), 10, starting=2, inflight=8.0, p99_s=0.105 + 0.02 * t))
            for t in range(8)]
    assert {r.reason for r in recs} <= {"tolerance", "inflight"}


def test_flat_high_latency_is_not_a_trend() -> None:
    rule = PredictiveRule(CONFIG)
    recs = [rule.recommend(signals(float(t), 10, inflight=8.0, p99_s=0.22)) for t in range(20)]
    assert {r.replicas for r in recs} == {10}


def test_a_step_is_sized_at_once_from_the_learned_capacity() -> None:
    rule = PredictiveRule(CONFIG)
    rng = random.Random(5)
    for t in range(30):
        rule.recommend(signals(float(t), 5, request_rate=rng.gauss(100.0, 10.0), utilization=0.4, p99_s=0.05))
    recs = [rule.recommend(signals(30.0 + t, 5, request_rate=500.0, utilization=1.0, p99_s=0.3)) for t in range(3)]
    assert recs[1].reason == "step"
    assert recs[1].replicas == pytest.approx(25, abs=2)  # 500/s at the ~20/s per replica that held the SLO


def test_without_capacity_it_is_hpa() -> None:
    rule, hpa = PredictiveRule(CONFIG), HpaRule(CONFIG.hpa)
    for t in range(5):
        s = signals(float(t), 2, queue_depth=40.0)
        assert rule.recommend(s).replicas == hpa.recommend(s).replicas


def test_ticks_sparser_than_the_trend_window_needs_still_forecast() -> None:
    config = replace(CONFIG, interval_s=15.0)  # the simulator's default interval: one point per short span
    rule = PredictiveRule(config)
    for t in range(0, 300, 15):
        rec = rule.recommend(signals(float(t), 4, request_rate=100.0 + t, inflight=3.2, p99_s=0.05))
    assert rec.replicas >= 4 and rule.capacity is not None
