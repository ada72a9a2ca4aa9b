"""The planner on synthetic profiles whose capacity we know."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleetserve.batching.config import BatcherConfig
from fleetserve.sim.planner import PlanConfig, Planner, derived_weights, latency_floor, replica_capacity
from tests.sim.support import linear_profile

NO_BATCHING = BatcherConfig(max_batch=1, max_delay_s=0.0)


def test_capacity_counts_full_batches_and_the_event_loop() -> None:
    p = linear_profile(base_s=0.001, per_row_s=0.0001)
    assert replica_capacity(p, BatcherConfig(max_batch=8), 1) == pytest.approx(8 / 0.0018)
    assert replica_capacity(p, BatcherConfig(max_batch=8), 1, rows=4) == pytest.approx(2 / 0.0018)
    busy_loop = linear_profile(base_s=0.001, replica_cpu_s=0.002)
    assert replica_capacity(busy_loop, BatcherConfig(max_batch=8), 1) == pytest.approx(500)
    shared = linear_profile(base_s=0.001, replica_cpu_s=0.002, replica_busy_cpu_s=0.001)  # a busy loop's cost
    assert replica_capacity(shared, BatcherConfig(max_batch=8), 1) == pytest.approx(1000)


def test_the_smallest_fleet_holding_the_slo_is_found() -> None:
    # 1 ms per request, no batching: a replica does 1000/s; 2500/s at p99 <= 10 ms needs at least 3.
    profile = linear_profile(base_s=0.001, cv=0.3, cost_per_hour=2.0)
    config = PlanConfig(qps=2500, slo_p99_s=0.010, policies=("p2c-peak-ewma", "round-robin"), requests=20_000,
                        batcher=NO_BATCHING, gateway_workers=1)
    plan = Planner(config).plan(profile)
    assert plan.best is not None
    n = plan.best.replicas
    assert 3 <= n <= 5
    assert plan.best.result.p("p99") <= 0.010
    assert any(t.replicas == n - 1 and not t.holds for t in plan.trials) or n == 3
    assert {t.policy for t in plan.policies} == {"p2c-peak-ewma", "round-robin"}
    assert plan.cost_per_million(2500) == pytest.approx(n * 2.0 / (2500 * 3600) * 1e6)


def test_no_fleet_within_the_limit_is_reported_as_none() -> None:
    config = PlanConfig(qps=3000, slo_p99_s=0.002, requests=3000, batcher=NO_BATCHING, max_replicas=4,
                        gateway_workers=1, policies=("round-robin",))
    plan = Planner(config).plan(linear_profile(base_s=0.001, cv=0.3))
    assert plan.best is None and [t.replicas for t in plan.trials] == [3, 4] and "4 replicas" in plan.reason
    too_many = Planner(replace(config, qps=5000)).plan(linear_profile(base_s=0.001))
    assert too_many.best is None and too_many.trials == () and "at least 5 replicas" in too_many.reason


def test_weights_follow_capacity() -> None:
    fast, slow = linear_profile(base_s=0.0008, name="fast"), linear_profile(base_s=0.0012, name="slow")
    assert derived_weights([fast, slow], NO_BATCHING) == {"fast": 3, "slow": 2}
    assert derived_weights([fast, fast], NO_BATCHING) == {"fast": 1}


@pytest.mark.parametrize("kw", [dict(qps=0), dict(slo_p99_s=0), dict(policies=()), dict(policies=("fastest",)),
                                dict(rows=64), dict(requests=10)])
def test_bad_plan_settings_are_refused(kw: dict[str, object]) -> None:
    base: dict[str, object] = dict(qps=100, slo_p99_s=0.05)
    base.update(kw)
    with pytest.raises(ValueError):
        PlanConfig(**base)  # type: ignore[arg-type]


def test_an_slo_below_one_requests_own_time_has_no_answer_and_runs_nothing() -> None:
    slow = linear_profile(base_s=0.060, replica_cpu_s=0.001)
    config = PlanConfig(qps=100, slo_p99_s=0.050, requests=2000, batcher=NO_BATCHING, gateway_workers=1)
    plan = Planner(config).plan(slow)
    assert plan.best is None and plan.trials == () and "61.0 ms" in plan.reason
    assert latency_floor(slow) == pytest.approx(0.061)
    spread = linear_profile(base_s=0.010, cv=0.5)
    assert 0.010 * 2 < latency_floor(spread) < 0.010 * 4  # a lognormal's p99 with CV 0.5 is ~2.9x its mean
