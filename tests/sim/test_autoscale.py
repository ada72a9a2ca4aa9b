"""The product's autoscaling rules (fleetserve.autoscale) running in the simulator through ProductRule."""

from __future__ import annotations

import pytest

from fleetserve.autoscale.config import AutoscaleConfig, HpaConfig
from fleetserve.batching.config import BatcherConfig
from fleetserve.sim.arrivals import ArrivalConfig
from fleetserve.sim.config import ReplicaGroup, SimConfig
from fleetserve.sim.gateway import BalancerConfig
from fleetserve.sim.scaling import ProductRule, ScalingConfig
from fleetserve.sim.simulator import Simulation
from tests.sim.support import linear_profile

# 10 ms per request, one at a time: 100 requests/s per replica.
PROFILE = linear_profile(base_s=0.01, cv=0.2)
BATCHER = BatcherConfig(max_batch=1, max_delay_s=0.0)


def run(rule: str, ramp: str, seconds: float, replicas: int = 2) -> tuple[ProductRule, Simulation]:
    config = AutoscaleConfig(rule=rule, min_replicas=1, max_replicas=50, slo_p99_ms=100.0,
                             hpa=HpaConfig(target_queue_depth=2.0, target_gpu_utilization=70.0))
    product = ProductRule.from_config(config, startup_s=2.0, engine_as_gpu=True)
    arrivals = ArrivalConfig.parse(f"ramp:{ramp}", 0.0)
    peak = max(float(p.split("=")[1]) for p in ramp.split(","))
    sim = Simulation(SimConfig(
        groups=(ReplicaGroup(PROFILE, replicas),), arrivals=arrivals, requests=int(peak * seconds), warmup_s=0.0,
        balancer=BalancerConfig(policy="least-pending"), batcher=BATCHER,
        scaling=ScalingConfig(product, interval_s=1.0, cold_start_s=2.0), seed=1))
    sim.run()
    return product, sim


def test_the_real_rules_grow_the_simulated_fleet_with_the_load() -> None:
    for rule in ("hpa", "predictive"):
        product, sim = run(rule, "0=100,10=100,30=600", 30.0)
        assert product.timeline[0][1] == 2
        assert 6 <= len(sim.replicas) <= 16, rule  # 600/s needs 6 at 100% busy, 9 at the 70% target
        assert product.replica_seconds > 0
        assert {direction for direction, _ in product.autoscaler.counts()} >= {"up", "hold"}


def test_the_arrival_rate_and_startup_reach_the_rule() -> None:
    product, _ = run("hpa", "0=150", 5.0)
    state = product.autoscaler.state()
    assert state["signals"]["request_rate"] == pytest.approx(150, rel=0.3)
    assert state["signals"]["startup_s"] == 2.0
    assert state["signals"]["gpu_utilization"] == state["signals"]["utilization"]
