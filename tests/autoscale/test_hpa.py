"""The hpa rule reproduces the Kubernetes HPA documentation's worked examples
(https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/) with synthetic snapshots."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleetserve.autoscale.config import HpaConfig, ScalingPolicy
from fleetserve.autoscale.rules import RULES
from fleetserve.autoscale.rules.hpa import HpaRule
from fleetserve.autoscale.signals import FleetSignals, ReplicaSignals
from tests.autoscale.support import signals

QUEUE_ONLY = HpaConfig(target_queue_depth=100.0, target_gpu_utilization=0.0)  # "100m" as 100 rows per replica
# The documentation's algorithm examples, before the scale-down stabilisation window smooths them.
UNSTABILISED = replace(QUEUE_ONLY, scale_down_stabilization_s=0.0)
UNLIMITED = (ScalingPolicy("percent", 1000, 15),)


def queue(at_s: float, ready: int, per_replica: float, **fields: object) -> FleetSignals:
    return signals(at_s, ready, queue_depth=per_replica * ready, **fields)


def gpu_replicas(*utilizations: float | None) -> tuple[ReplicaSignals, ...]:
    return tuple(ReplicaSignals(url=f"http://r{i}", ready=True, request_rate=1.0, queue_depth=0.0, inflight=0.0,
                                p50_s=None, p99_s=None, gpu_utilization=u) for i, u in enumerate(utilizations))


def test_the_registry_names_it() -> None:
    assert RULES.load("hpa") is HpaRule


def test_metric_twice_the_target_doubles_and_half_the_target_halves() -> None:
    # "if the current metric value is 200m, and the desired value is 100m, the number of replicas will be doubled"
    assert HpaRule(QUEUE_ONLY).recommend(queue(0.0, 4, 200.0)).replicas == 8
    # "If the current value is instead 50m, you'll halve the number of replicas"
    rec = HpaRule(UNSTABILISED).recommend(queue(0.0, 4, 50.0))
    assert (rec.replicas, rec.reason) == (2, "queue_depth")


@pytest.mark.parametrize(("per_replica", "expected", "reason"),
                         [(109.0, 10, "tolerance"), (91.0, 10, "tolerance"), (111.0, 12, "queue_depth"),
                          (89.0, 9, "queue_depth")])
def test_a_ratio_within_the_10_percent_tolerance_changes_nothing(per_replica: float, expected: int,
                                                                 reason: str) -> None:
    rec = HpaRule(UNSTABILISED).recommend(queue(0.0, 10, per_replica))
    assert (rec.replicas, rec.reason) == (expected, reason)


def test_a_fresh_rule_keeps_the_fleet_it_found_for_the_scale_down_window() -> None:
    rule = HpaRule(QUEUE_ONLY)
    assert rule.recommend(queue(0.0, 10, 10.0)).replicas == 10
    assert rule.recommend(queue(299.0, 10, 10.0)).replicas == 10
    assert rule.recommend(queue(300.0, 10, 10.0)).replicas == 1


def test_fifty_replicas_at_90_percent_against_a_75_percent_target_become_sixty() -> None:
    # The Kubernetes v1.33 configurable-tolerance post's example: 50 x (90 / 75) = 60.
    rule = HpaRule(HpaConfig(target_queue_depth=0.0, target_gpu_utilization=75.0))
    rec = rule.recommend(signals(0.0, 50, gpu_utilization=0.90))
    assert (rec.replicas, rec.reason) == (60, "gpu_utilization")


def test_several_metrics_take_the_largest_count() -> None:
    rule = HpaRule(HpaConfig(target_queue_depth=4.0, target_inflight=8.0, target_gpu_utilization=50.0))
    rec = rule.recommend(signals(0.0, 4, queue_depth=16.0, inflight=64.0, gpu_utilization=0.75))
    assert (rec.replicas, rec.reason) == (8, "inflight")  # queue: 4, in-flight: 8, GPU: 6
    assert "queue_depth 4/replica vs 4 -> 4" in rec.detail


def test_missing_metrics_count_as_zero_when_scaling_up_and_as_the_target_when_scaling_down() -> None:
    config = HpaConfig(target_queue_depth=0.0, target_gpu_utilization=50.0, scale_down_stabilization_s=0.0)
    up = HpaRule(config).recommend(signals(0.0, 4, replicas=gpu_replicas(0.9, 0.9, 0.9, None)))
    assert up.replicas == 6  # ready-only ratio 1.8; with the missing one at 0%: 2.7 / 2.0 = 1.35 -> ceil(5.4)
    down = HpaRule(config).recommend(signals(0.0, 4, replicas=gpu_replicas(0.1, 0.1, 0.1, None)))
    assert down.replicas == 2  # ready-only 0.2 -> 1; with the missing one at 100%: 0.8 / 2.0 = 0.4 -> ceil(1.6)


def test_a_missing_metric_that_reverses_the_direction_changes_nothing() -> None:
    config = HpaConfig(target_queue_depth=0.0, target_gpu_utilization=50.0)
    rec = HpaRule(config).recommend(signals(0.0, 4, replicas=gpu_replicas(0.56, None, None, None)))
    assert rec.replicas == 4  # 1.12 alone would scale up; with three at 0% it would scale down: no action


def test_not_yet_ready_replicas_count_as_zero_when_scaling_up() -> None:
    rule = HpaRule(QUEUE_ONLY)
    held = rule.recommend(queue(0.0, 2, 200.0, starting=2))  # 400 rows over 4 replicas: ratio 1.0 -> no change
    assert (held.replicas, held.reason) == (4, "tolerance")
    grown = HpaRule(QUEUE_ONLY).recommend(queue(0.0, 2, 400.0, starting=2))  # 800 / (4 x 100) = 2.0 -> 8
    assert grown.replicas == 8
    # Scaling down, starting replicas are ignored: the ready ones alone decide.
    assert HpaRule(replace(QUEUE_ONLY, scale_down_stabilization_s=0.0)).recommend(
        queue(0.0, 4, 25.0, starting=2)).replicas == 1


def drive(rule: HpaRule, ready: int, total_queue: float, seconds: int, step_s: float = 1.0) -> list[int]:
    """Tick every ``step_s`` with the actuator applying each recommendation at once; the distinct counts."""
    seen = [ready]
    t = 0.0
    while t < seconds:
        ready = rule.recommend(signals(t, ready, queue_depth=total_queue)).replicas
        if ready != seen[-1]:
            seen.append(ready)
        t += step_s
    return seen


def test_scale_down_policies_pods_4_or_10_percent_per_minute_from_80_to_10() -> None:
    # The documentation's example: 80 -> 72 (8 = 10%), then 10% of 72 = 7.2 rounded up to 8, ... and 4 at a
    # time once below 40.
    config = replace(QUEUE_ONLY, scale_down_stabilization_s=0.0,
                     scale_down_policies=(ScalingPolicy("pods", 4, 60), ScalingPolicy("percent", 10, 60)))
    steps = drive(HpaRule(config), 80, total_queue=10 * 100.0, seconds=20 * 60)
    assert steps == [80, 72, 64, 57, 51, 45, 40, 36, 32, 28, 24, 20, 16, 12, 10]


def test_each_policy_period_allows_one_step() -> None:
    config = replace(QUEUE_ONLY, scale_down_stabilization_s=0.0,
                     scale_down_policies=(ScalingPolicy("pods", 4, 60), ScalingPolicy("percent", 10, 60)))
    assert drive(HpaRule(config), 80, total_queue=1000.0, seconds=60) == [80, 72]
    assert drive(HpaRule(config), 80, total_queue=1000.0, seconds=62) == [80, 72, 64]


def test_select_min_removes_at_most_five_per_minute() -> None:
    # "no more than 5 Pods are removed per minute": Percent 10 and Pods 5, selectPolicy Min.
    config = replace(QUEUE_ONLY, scale_down_stabilization_s=0.0, scale_down_select="min",
                     scale_down_policies=(ScalingPolicy("percent", 10, 60), ScalingPolicy("pods", 5, 60)))
    assert drive(HpaRule(config), 100, total_queue=1000.0, seconds=130)[:4] == [100, 95, 90, 85]
    assert drive(HpaRule(config), 30, total_queue=100.0, seconds=130)[:3] == [30, 27, 24]


def test_disabled_scale_down_never_removes() -> None:
    config = replace(QUEUE_ONLY, scale_down_stabilization_s=0.0, scale_down_select="disabled")
    assert drive(HpaRule(config), 10, total_queue=0.0, seconds=600) == [10]


def test_default_scale_up_adds_the_larger_of_four_replicas_and_100_percent_per_15_s() -> None:
    steps = drive(HpaRule(QUEUE_ONLY), 1, total_queue=1e6, seconds=70)
    assert steps == [1, 5, 10, 20, 40, 80]


def test_scale_down_waits_for_the_highest_recommendation_of_the_300_s_window() -> None:
    rule = HpaRule(QUEUE_ONLY)
    assert rule.recommend(queue(0.0, 4, 200.0)).replicas == 8
    ready = 8
    for t in range(1, 300):
        rec = rule.recommend(signals(float(t), ready, queue_depth=100.0))  # load now wants 1 replica
        assert (rec.replicas, rec.reason) == (8, "stabilized"), t
    rec = rule.recommend(signals(300.5, ready, queue_depth=100.0))
    assert rec.replicas == 1


def test_noisy_load_around_the_target_does_not_flap_down() -> None:
    rule = HpaRule(QUEUE_ONLY)
    ready, changes = 10, 0
    for t in range(600):
        total = 1000.0 * (1.25 if t % 7 == 0 else 0.7)  # brief peaks between lulls
        rec = rule.recommend(signals(float(t), ready, queue_depth=total))
        changes += rec.replicas != ready
        ready = rec.replicas
    assert changes == 1 and ready == 13  # up once to the peaks' 13, never back down while they recur


def test_up_stabilization_takes_the_lowest_recommendation_of_its_window() -> None:
    rule = HpaRule(replace(QUEUE_ONLY, scale_up_stabilization_s=30.0, scale_up_policies=UNLIMITED))
    assert rule.recommend(queue(0.0, 4, 100.0)).replicas == 4
    assert rule.recommend(queue(10.0, 4, 300.0)).replicas == 4  # the 4 of t=0 is still in the window
    assert rule.recommend(queue(31.0, 4, 300.0)).replicas == 12


def test_without_ready_replicas_there_is_nothing_to_scale_on() -> None:
    rec = HpaRule(QUEUE_ONLY).recommend(signals(0.0, 0, starting=2))
    assert (rec.replicas, rec.reason) == (2, "no_metrics")
