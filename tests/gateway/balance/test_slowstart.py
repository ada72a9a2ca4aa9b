import random
from collections import Counter

import pytest

from fleetserve.gateway.balance import Balancer, BalancerConfig
from fleetserve.gateway.balance.discovery import Insert
from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.policies import RequestContext
from fleetserve.gateway.balance.slowstart import SlowStartConfig, SlowStartRamp
from tests.support.clock import FakeClock

CTX = RequestContext()


def ramp(window: float, **kwargs: float) -> SlowStartRamp:
    r = SlowStartRamp(SlowStartConfig(window_s=window, **kwargs))
    r.restart(0.0)
    return r


def test_linear_ramp_follows_envoys_formula() -> None:
    r = ramp(10.0)
    # time_factor = max(t, 1) / window; min_weight_percent 10 is the floor.
    assert r.factor(0.0) == pytest.approx(0.1)
    assert r.factor(0.5) == pytest.approx(0.1)
    assert r.factor(2.5) == pytest.approx(0.25)
    assert r.factor(5.0) == pytest.approx(0.5)
    assert r.factor(10.0) == 1.0
    assert not r.active(10.0)


def test_aggression_and_min_weight() -> None:
    assert ramp(10.0, aggression=2.0).factor(2.5) == pytest.approx(0.5)
    assert ramp(10.0, aggression=0.5).factor(5.0) == pytest.approx(0.25)
    assert ramp(10.0, min_weight_percent=30.0).factor(1.0) == pytest.approx(0.3)


def test_disabled_ramp_is_always_full_weight() -> None:
    r = ramp(0.0)
    assert r.factor(0.0) == 1.0
    assert not r.active(0.0)


def test_restart_begins_a_new_ramp() -> None:
    r = ramp(10.0)
    assert r.factor(20.0) == 1.0
    r.restart(30.0)
    assert r.factor(35.0) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"window_s": -1.0}, "slow_start_s"), ({"aggression": 0.0}, "aggression"), ({"min_weight_percent": 0.0}, "min")],
)
def test_config_validation(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SlowStartConfig(**kwargs)


def shares(balancer: Balancer, n: int) -> Counter[str]:
    picked: Counter[str] = Counter()
    for _ in range(n):
        ep = balancer.pick(CTX)
        assert ep is not None
        picked[ep.host] += 1
    return picked


def test_new_endpoint_share_ramps_up_under_weighted_round_robin() -> None:
    clock = FakeClock()
    balancer = Balancer(BalancerConfig(policy="weighted-round-robin", slow_start_s=10.0), clock=clock)
    balancer.apply(Insert(Endpoint.from_url("http://old:1")))
    clock.now = 100.0
    balancer.apply(Insert(Endpoint.from_url("http://new:1")))
    early = shares(balancer, 1100)
    assert early["new"] == pytest.approx(100, abs=2)  # weight 0.1 against 1.0
    clock.now = 105.0
    middle = shares(balancer, 1500)
    assert middle["new"] == pytest.approx(500, abs=2)  # 0.5 against 1.0
    clock.now = 111.0
    late = shares(balancer, 1000)
    assert late["new"] == pytest.approx(500, abs=2)


def same_latency(balancer: Balancer, *endpoints: Endpoint) -> None:
    for ep in endpoints:
        balancer.start(ep).finish(status=200, latency_s=0.02)


def test_ramping_endpoint_looks_busier_to_p2c_policies() -> None:
    for policy in ("least-pending", "p2c-peak-ewma"):
        clock = FakeClock()
        balancer = Balancer(BalancerConfig(policy=policy, slow_start_s=10.0), clock=clock, rng=random.Random(5))
        old = Endpoint.from_url("http://old:1")
        balancer.apply(Insert(old))
        clock.now = 100.0
        for _ in range(3):
            balancer.start(old)
        new = Endpoint.from_url("http://new:1")
        balancer.apply(Insert(new))
        same_latency(balancer, old, new)
        # old: 4 units of cost at weight 1; new: 1 unit at weight 0.1 -> 10.
        assert balancer.pick(CTX) == old, policy
        clock.now = 110.0
        same_latency(balancer, old, new)
        assert balancer.pick(CTX) == new, policy


def test_readmitted_endpoint_ramps_again() -> None:
    clock = FakeClock()
    balancer = Balancer(BalancerConfig(policy="weighted-round-robin", slow_start_s=10.0), clock=clock)
    eps = [Endpoint.from_url(f"http://r{i}:1") for i in range(3)]
    for ep in eps:
        balancer.apply(Insert(ep))
    clock.now = 50.0
    for _ in range(5):
        balancer.start(eps[0]).finish(status=502)
    clock.now = 55.0
    balancer.pick(CTX)
    row = balancer.snapshot()[0]
    assert row["state"] == "healthy"
    assert row["slow_start"] is True
    assert row["effective_weight"] == pytest.approx(0.1)
