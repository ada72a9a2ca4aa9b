"""The gateway's autoscaler: the snapshot it builds each tick, what it exports, and when it ticks."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from fleetserve.autoscale.config import AutoscaleConfig
from fleetserve.autoscale.controller import Autoscaler
from fleetserve.autoscale.rules import Recommendation, ScaleBounds
from fleetserve.autoscale.signals import FleetSignals
from fleetserve.gateway.autoscale.members import parse_members
from fleetserve.gateway.autoscale.scaler import GatewayAutoscaler
from fleetserve.gateway.balance import Balancer, BalancerConfig, Endpoint, Insert
from fleetserve.wire import LoadReport
from tests.support.clock import FakeClock
from tests.support.waiting import until

A, B, C, D = (f"http://127.0.0.1:{port}" for port in (8100, 8102, 8104, 8106))


class Scripted:
    """A rule that wants ``replicas`` and remembers what it saw."""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.seen: list[FleetSignals] = []

    def recommend(self, signals: FleetSignals) -> Recommendation:
        self.seen.append(signals)
        return Recommendation(self.replicas, "scripted", f"wants {self.replicas}")


def _scaler(rule: Scripted, *, actuator: bool = True, min_replicas: int = 1, clock: FakeClock | None = None,
            balancer: Balancer | None = None, interval_s: float = 1.0) -> tuple[GatewayAutoscaler, CollectorRegistry]:
    config = AutoscaleConfig(rule="hpa", min_replicas=min_replicas, max_replicas=5, interval_s=interval_s)
    registry = CollectorRegistry()
    autoscaler = Autoscaler(rule, ScaleBounds(min_replicas, 5), name="hpa")
    scaler = GatewayAutoscaler(config, balancer or Balancer(BalancerConfig()), registry, actuator=actuator,
                               hold_max=4, hold_timeout_s=10.0, clock=clock or FakeClock(100.0),
                               autoscaler=autoscaler)
    return scaler, registry


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_a_tick_sees_the_actuators_members_and_startup_time_and_exports_the_decision() -> None:
    clock = FakeClock(100.0)
    rule = Scripted(3)
    scaler, registry = _scaler(rule, clock=clock)
    scaler.put_members(parse_members({"ready": [A, B], "starting": [C], "draining": [D], "startup_s": 1.5}))
    scaler.window.arrival()
    scaler.window.observe(A, 0.02, True, LoadReport(queue_depth=3.0, inflight=1.0))
    clock.advance(0.5)
    decision = scaler.tick()
    (seen,) = rule.seen
    assert (seen.ready, seen.starting, seen.draining, seen.startup_s, seen.held) == (2, 1, 1, 1.5, 0)
    assert seen.queue_depth == 3.0 and seen.request_rate > 0
    assert (decision.previous, decision.desired, decision.reason) == (3, 3, "scripted")
    assert _value(registry, "fleetserve_autoscale_desired_replicas", rule="hpa") == 3
    assert _value(registry, "fleetserve_autoscale_replicas", state="ready") == 2
    assert _value(registry, "fleetserve_autoscale_replicas", state="starting") == 1
    assert _value(registry, "fleetserve_autoscale_replicas", state="draining") == 1
    assert _value(registry, "fleetserve_autoscale_decisions_total", direction="hold", reason="scripted") == 1
    rule.replicas = 5
    scaler.tick()
    assert _value(registry, "fleetserve_autoscale_decisions_total", direction="up", reason="scripted") == 1
    assert _value(registry, "fleetserve_autoscale_desired_replicas", rule="hpa") == 5
    state = scaler.state()
    assert state["desired"] == 5 and state["discovery"] == "actuator"
    assert state["members"] == {"ready": [A, B], "starting": [C], "draining": [D], "startup_s": 1.5}
    assert [(d["from"], d["to"]) for d in state["decisions"]] == [(3, 5)]
    assert state["hold"] is None  # min_replicas 1: nothing is held


def test_without_an_actuator_the_balancers_health_view_is_the_membership() -> None:
    balancer = Balancer(BalancerConfig())
    balancer.enable_active_health()
    for url in (A, B):
        balancer.apply(Insert(Endpoint.from_url(url)))
    balancer.set_probe_result(Endpoint.from_url(A), True)  # B waits for its first probe: starting
    rule = Scripted(1)
    scaler, _ = _scaler(rule, actuator=False, balancer=balancer)
    assert scaler.membership is None
    scaler.tick()
    assert (rule.seen[-1].ready, rule.seen[-1].starting) == (1, 1)
    assert scaler.state()["members"]["ready"] == [A]


async def test_a_held_request_wakes_the_tick_task_and_scales_from_zero() -> None:
    rule = Scripted(0)
    scaler, registry = _scaler(rule, min_replicas=0, interval_s=3600.0)  # only a wake-up can tick again
    assert scaler.holds is not None
    runner = asyncio.create_task(scaler.run())
    try:
        await until(lambda: scaler.desired == 0, what="first tick: an idle fleet at zero")
        held = asyncio.create_task(scaler.holds.hold(1e9))
        await until(lambda: scaler.desired == 1, timeout_s=5.0, what="the hold woke a tick")
        assert rule.seen[-1].held == 1
        assert _value(registry, "fleetserve_autoscale_held_requests") == 1
        assert scaler.holds.release() == 1
        await held
        assert _value(registry, "fleetserve_autoscale_holds_total", outcome="released") == 1
    finally:
        runner.cancel()


async def test_a_long_poll_returns_when_the_desired_count_moves() -> None:
    rule = Scripted(2)
    scaler, _ = _scaler(rule)
    scaler.tick()
    await asyncio.wait_for(scaler.wait_change(None, 30.0), 1.0)  # differs already: at once
    waiting = asyncio.create_task(scaler.wait_change(2, 30.0))
    await asyncio.sleep(0)
    scaler.tick()  # still 2: keeps waiting
    await asyncio.sleep(0)
    assert not waiting.done()
    rule.replicas = 4
    scaler.tick()
    await asyncio.wait_for(waiting, 1.0)
    await asyncio.wait_for(scaler.wait_change(4, 0.01), 1.0)  # no change: the timeout ends it
