import asyncio
import random

import pytest

from fleetserve.gateway.balance import Balancer, BalancerConfig
from fleetserve.gateway.balance.discovery import Insert
from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.health import (
    EndpointHealth,
    HealthChecker,
    HealthConfig,
    HealthState,
    run_health_checks,
)
from fleetserve.gateway.balance.policies import RequestContext
from tests.support.clock import FakeClock

CFG = HealthConfig(unhealthy_threshold=3, healthy_threshold=2)


def feed(health: EndpointHealth, results: str) -> list[HealthState | None]:
    return [health.record(ch == "+", CFG) for ch in results]


def test_unknown_is_admitted_on_the_first_success() -> None:
    health = EndpointHealth(HealthState.UNKNOWN)
    assert feed(health, "+") == [HealthState.HEALTHY]


def test_unknown_becomes_unhealthy_after_the_failure_threshold() -> None:
    health = EndpointHealth(HealthState.UNKNOWN)
    assert feed(health, "---") == [None, None, HealthState.UNHEALTHY]


def test_healthy_needs_consecutive_failures() -> None:
    health = EndpointHealth(HealthState.HEALTHY)
    assert feed(health, "--+--") == [None] * 5
    assert health.state is HealthState.HEALTHY
    assert feed(health, "-") == [HealthState.UNHEALTHY]


def test_unhealthy_needs_consecutive_successes() -> None:
    health = EndpointHealth(HealthState.UNHEALTHY)
    assert feed(health, "+-+") == [None, None, None]
    assert feed(health, "+") == [HealthState.HEALTHY]
    assert feed(health, "--") == [None, None]  # counters restart after a flip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"interval_s": 0.0}, "health_interval_s"),
        ({"timeout_s": -1.0}, "health_timeout_s"),
        ({"unhealthy_threshold": 0}, "unhealthy_threshold"),
        ({"healthy_threshold": 0}, "healthy_threshold"),
    ],
)
def test_config_validation(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HealthConfig(**kwargs)  # type: ignore[arg-type]


class FakeTime(FakeClock):
    """Clock plus sleep: sleeping advances the clock; after ``rounds`` sleeps it stops the loop."""

    def __init__(self, rounds: int) -> None:
        super().__init__()
        self.sleeps: list[float] = []
        self._rounds = rounds

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if len(self.sleeps) >= self._rounds:
            raise asyncio.CancelledError
        self.now += seconds


def fleet(clock: FakeTime, n: int = 3) -> tuple[Balancer, list[Endpoint]]:
    balancer = Balancer(BalancerConfig(policy="round-robin"), clock=clock, rng=random.Random(1))
    eps = [Endpoint.from_url(f"http://r{i}:8000") for i in range(n)]
    for ep in eps:
        balancer.apply(Insert(ep))
    return balancer, eps


async def test_checker_flips_states_on_thresholds() -> None:
    clock = FakeTime(rounds=100)
    balancer, eps = fleet(clock)
    alive = {ep.url: True for ep in eps}
    calls: list[str] = []

    async def probe(ep: Endpoint) -> bool:
        calls.append(ep.url)
        return alive[ep.url]

    checker = HealthChecker(balancer, probe, CFG, clock=clock, sleep=clock.sleep)
    balancer.enable_active_health()
    assert {r["state"] for r in balancer.snapshot()} == {"unknown"}
    await checker.check_once()
    assert sorted(calls) == sorted(ep.url for ep in eps)
    assert {r["state"] for r in balancer.snapshot()} == {"healthy"}

    alive[eps[0].url] = False
    for expected in ("healthy", "healthy", "unhealthy"):
        await checker.check_once()
        assert balancer.snapshot()[0]["state"] == expected
    assert eps[0] not in {balancer.pick(RequestContext()) for _ in range(10)}

    alive[eps[0].url] = True
    for expected in ("unhealthy", "healthy"):
        await checker.check_once()
        assert balancer.snapshot()[0]["state"] == expected


async def test_probe_errors_and_timeouts_count_as_failures() -> None:
    clock = FakeTime(rounds=100)
    balancer, eps = fleet(clock, 2)
    never = asyncio.Event()

    async def probe(ep: Endpoint) -> bool:
        if ep is eps[0]:
            raise ConnectionRefusedError("refused")
        await never.wait()
        return True

    checker = HealthChecker(balancer, probe, HealthConfig(timeout_s=0.01), clock=clock)
    for _ in range(3):
        await checker.check_once()
    assert [r["state"] for r in balancer.snapshot()] == ["unhealthy", "unhealthy"]


async def test_run_probes_every_interval_and_enables_active_health() -> None:
    clock = FakeTime(rounds=3)
    balancer, _ = fleet(clock, 2)
    probed_at: list[float] = []

    async def probe(ep: Endpoint) -> bool:
        probed_at.append(clock.now)
        clock.now += 0.5  # a slow probe shortens the wait, keeping the rounds on the interval
        return True

    with pytest.raises(asyncio.CancelledError):
        await run_health_checks(balancer, probe, BalancerConfig(health_interval_s=2.0), clock=clock, sleep=clock.sleep)
    assert clock.sleeps == [1.0, 1.0, 1.0]
    assert sorted(set(probed_at)) == [0.0, 0.5, 2.0, 2.5, 4.0, 4.5]
    assert {r["state"] for r in balancer.snapshot()} == {"healthy"}
