"""Synthetic fleet snapshots for the autoscaling rules' unit tests."""

from __future__ import annotations

from typing import Any

from fleetserve.autoscale.signals import FleetSignals


def signals(at_s: float, ready: int, **fields: Any) -> FleetSignals:
    """A snapshot at ``at_s`` with ``ready`` replicas; every other field defaults to an idle fleet."""
    base: dict[str, Any] = {"starting": 0, "draining": 0, "request_rate": 0.0, "queue_depth": 0.0,
                            "inflight": 0.0, "p50_s": None, "p99_s": None}
    base.update(fields)
    return FleetSignals(at_s=at_s, ready=ready, **base)


class ToyFleet:
    """A fluid model of a fleet for rule tests: each replica serves ``capacity`` requests/s, one at a time (so
    in-flight per replica is its busy share); a new replica is ready ``startup_s`` after it is asked for; excess
    requests queue. p99 is a base latency grown by the busy share (an M/M/1-like ``u / (1 - u)``) plus the queue's
    wait. Deterministic for a given rate sequence."""

    def __init__(self, ready: int, capacity: float = 50.0, startup_s: float = 5.0, base_s: float = 0.02) -> None:
        self.ready = ready
        self.capacity = capacity
        self.startup_s = startup_s
        self.base_s = base_s
        self.starting: list[float] = []  # when each starting replica becomes ready
        self.queue = 0.0
        self.replica_seconds = 0.0

    def step(self, at_s: float, rate: float) -> FleetSignals:
        """One second of ``rate`` requests/s ending at ``at_s``: the snapshot a gateway would take."""
        self.ready += sum(1 for t in self.starting if t <= at_s)
        self.starting = [t for t in self.starting if t > at_s]
        self.replica_seconds += self.ready + len(self.starting)
        full = self.capacity * self.ready
        served = min(rate + self.queue, full)
        self.queue = max(0.0, self.queue + rate - full)
        u = served / full if full else 1.0
        p99 = self.base_s * (1 + min(u, 0.95) / (1 - min(u, 0.95))) + (self.queue / full if full else 10.0)
        return FleetSignals(at_s=at_s, ready=self.ready, starting=len(self.starting), draining=0,
                            request_rate=rate, queue_depth=self.queue, inflight=u * self.ready, p50_s=p99 / 2,
                            p99_s=p99, utilization=u, startup_s=self.startup_s)

    def apply(self, at_s: float, desired: int) -> None:
        """The actuator: start replicas up to ``desired``, or remove starting ones first, then ready ones."""
        current = self.ready + len(self.starting)
        self.starting += [at_s + self.startup_s] * max(0, desired - current)
        for _ in range(max(0, current - desired)):
            if self.starting:
                self.starting.pop()
            else:
                self.ready -= 1
