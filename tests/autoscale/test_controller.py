"""Autoscaler: clamps the rule's answer, scales from zero and back to zero, logs and counts its decisions."""

from __future__ import annotations

import json
import logging

import pytest

from fleetserve.autoscale.config import AutoscaleConfig
from fleetserve.autoscale.controller import Autoscaler, build_rule
from fleetserve.autoscale.rules import Recommendation, ScaleBounds
from fleetserve.autoscale.signals import FleetSignals
from tests.autoscale.support import signals


class Scripted:
    """A rule that answers what the test sets."""

    def __init__(self, replicas: int, reason: str = "queue_depth") -> None:
        self.replicas = replicas
        self.reason = reason
        self.seen: list[FleetSignals] = []

    def recommend(self, s: FleetSignals) -> Recommendation:
        self.seen.append(s)
        return Recommendation(self.replicas, self.reason, "scripted")


def test_the_rules_answer_is_clamped_to_the_bounds() -> None:
    rule = Scripted(50)
    scaler = Autoscaler(rule, ScaleBounds(2, 8))
    d = scaler.tick(signals(0.0, 3, request_rate=10.0))
    assert (d.previous, d.desired, d.reason, d.direction) == (3, 8, "max_replicas", "up")
    rule.replicas = 0
    d = scaler.tick(signals(1.0, 8, request_rate=10.0))
    assert (d.previous, d.desired, d.reason, d.direction) == (8, 2, "min_replicas", "down")
    rule.replicas = 5
    d = scaler.tick(signals(2.0, 2, request_rate=10.0))
    assert (d.desired, d.reason, d.detail) == (5, "queue_depth", "scripted")
    assert len(rule.seen) == 3


def test_from_zero_held_requests_or_arrivals_ask_for_one_replica() -> None:
    scaler = Autoscaler(Scripted(0), ScaleBounds(0, 4), idle_to_zero_s=30.0)
    assert scaler.tick(signals(0.0, 0)).desired == 0
    d = scaler.tick(signals(1.0, 0, held=3))
    assert (d.desired, d.reason) == (1, "scale_from_zero")
    scaler2 = Autoscaler(Scripted(0), ScaleBounds(0, 4))
    assert scaler2.tick(signals(0.0, 0, request_rate=0.5)).desired == 1


def test_back_to_zero_only_after_idle_to_zero_s_without_a_request() -> None:
    scaler = Autoscaler(Scripted(0), ScaleBounds(0, 4), idle_to_zero_s=30.0)
    assert scaler.tick(signals(0.0, 1, request_rate=2.0)).desired == 1
    d = scaler.tick(signals(29.0, 1))
    assert (d.desired, d.reason) == (1, "not_idle")
    d = scaler.tick(signals(30.0, 1))
    assert (d.desired, d.reason, d.direction) == (0, "idle", "down")
    assert scaler.tick(signals(31.0, 0, held=1)).desired == 1  # and up again when a request comes


def test_a_fleet_found_running_gets_the_idle_period_before_zero() -> None:
    scaler = Autoscaler(Scripted(0), ScaleBounds(0, 4), idle_to_zero_s=10.0)
    assert scaler.tick(signals(100.0, 2)).desired == 1
    assert scaler.tick(signals(110.0, 1)).desired == 0


def test_with_a_floor_above_zero_idleness_changes_nothing() -> None:
    scaler = Autoscaler(Scripted(0), ScaleBounds(1, 4), idle_to_zero_s=0.0)
    assert scaler.tick(signals(1000.0, 1)).desired == 1


def test_changes_are_logged_kept_and_every_tick_is_counted(caplog: pytest.LogCaptureFixture) -> None:
    rule = Scripted(2)
    scaler = Autoscaler(rule, ScaleBounds(1, 10), history=2, name="hpa")
    caplog.set_level(logging.INFO, logger="fleetserve.autoscale.controller")
    for t, want in enumerate((2, 2, 3, 3, 1, 4)):
        rule.replicas = want
        scaler.tick(signals(float(t), 2, request_rate=5.0, queue_depth=7.0, p99_s=0.123))
    changes = [r.getMessage() for r in caplog.records]
    assert len(changes) == 3
    assert changes[0].startswith("autoscale hpa: 2 -> 3 replicas (queue_depth: scripted); ready 2")
    assert "p99 123 ms" in changes[0]
    assert [(d.previous, d.desired) for d in scaler.decisions()] == [(3, 1), (1, 4)]  # the last 2 kept
    assert scaler.counts() == {("hold", "queue_depth"): 3, ("up", "queue_depth"): 2, ("down", "queue_depth"): 1}


def test_state_is_json_with_what_the_admin_view_promises() -> None:
    scaler = Autoscaler(Scripted(3), ScaleBounds(1, 5), name="predictive")
    assert scaler.state()["desired"] is None
    scaler.tick(signals(5.0, 2, starting=0, draining=1, held=0, p99_s=0.2))
    state = json.loads(json.dumps(scaler.state()))
    assert {"rule", "min_replicas", "max_replicas", "desired", "ready", "starting", "draining", "held", "signals",
            "decisions"} <= set(state)
    assert (state["rule"], state["desired"], state["ready"], state["draining"]) == ("predictive", 3, 2, 1)
    assert state["signals"]["p99_s"] == 0.2
    assert state["decisions"] == [{"at_s": 5.0, "from": 2, "to": 3, "reason": "queue_depth", "detail": "scripted",
                                   "signals": state["signals"]}]


def test_build_rule_refuses_off() -> None:
    with pytest.raises(ValueError, match="off"):
        build_rule(AutoscaleConfig())


@pytest.mark.parametrize("rule", ["hpa", "predictive"])
def test_the_real_rules_scale_from_zero_and_back(rule: str) -> None:
    scaler = Autoscaler.from_config(AutoscaleConfig(rule=rule, min_replicas=0, max_replicas=4, idle_to_zero_s=30.0))
    assert scaler.tick(signals(0.0, 0)).desired == 0
    first = scaler.tick(signals(1.0, 0, held=2, request_rate=2.0))
    assert (first.desired, first.reason) == (1, "scale_from_zero")
    assert scaler.tick(signals(2.0, 0, starting=1, held=2, request_rate=2.0)).desired == 1
    for t in range(3, 20):  # served, then quiet
        assert scaler.tick(signals(float(t), 1, request_rate=1.0 if t < 10 else 0.0, p99_s=0.05)).desired == 1
    last = scaler.tick(signals(40.0, 1))
    assert (last.desired, last.reason) == (0, "idle")
