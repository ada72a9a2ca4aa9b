"""Autoscaling in the simulator: a rule sees a fleet snapshot every interval and names the replica count.

The protocol is the smallest a rule needs: ``desired(snapshot) -> replicas``, where the snapshot holds what a
metrics pipeline would show at that simulated time (arrival rate, p99 and engine utilisation over the last
interval, queue depth and replicas ready or starting). The simulator clamps the answer to
``[min_replicas, max_replicas]``, starts new replicas (ready, and announced to the gateway, after the cold
start) or retires replicas still starting, then the newest ready ones (as a Kubernetes ReplicaSet does); a
retired replica leaves the gateway at once and finishes the work it holds. :class:`FixedSize` keeps the fleet as it is;
:class:`ProductRule` runs the product's own autoscaler (:mod:`fleetserve.autoscale`: ``hpa``, ``predictive``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from fleetserve.autoscale.config import AutoscaleConfig
from fleetserve.autoscale.controller import Autoscaler
from fleetserve.autoscale.signals import FleetSignals


@dataclass(frozen=True)
class FleetSnapshot:
    at_s: float
    ready: int
    starting: int
    arrival_rate: float  # requests/s over the last interval
    p99_s: float | None  # of the requests answered in the last interval
    utilisation: float  # mean busy share of the ready replicas' engine instances over the last interval
    queue_depth: int  # rows queued across the fleet now
    inflight: int  # rows in running batches now


class ScalingRule(Protocol):
    def desired(self, snapshot: FleetSnapshot) -> int: ...


class FixedSize:
    """Never scale: the fleet keeps the size it has."""

    def desired(self, snapshot: FleetSnapshot) -> int:
        return snapshot.ready + snapshot.starting


@dataclass
class ProductRule:
    """The product's :class:`~fleetserve.autoscale.controller.Autoscaler` as a simulator rule.

    Each snapshot becomes a :class:`FleetSignals`: the interval's arrival rate, p99, engine utilisation (also
    offered as GPU utilisation when ``engine_as_gpu``, for the hpa rule's GPU target), queue depth and rows in
    flight; ``startup_s`` is the start-up time the rule is told was measured (the simulator's cold start).
    ``timeline`` keeps (at_s, ready, starting, desired) per tick and ``replica_seconds`` the replicas (ready or
    starting) integrated over the ticks.
    """

    autoscaler: Autoscaler
    startup_s: float | None = None
    engine_as_gpu: bool = False
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)
    replica_seconds: float = 0.0

    @classmethod
    def from_config(cls, config: AutoscaleConfig, startup_s: float | None = None,
                    engine_as_gpu: bool = False) -> ProductRule:
        return cls(Autoscaler.from_config(config), startup_s, engine_as_gpu)

    def desired(self, snapshot: FleetSnapshot) -> int:
        if self.timeline:
            last_at, ready, starting, _ = self.timeline[-1]
            self.replica_seconds += (ready + starting) * (snapshot.at_s - last_at)
        signals = FleetSignals(
            at_s=snapshot.at_s, ready=snapshot.ready, starting=snapshot.starting, draining=0,
            request_rate=snapshot.arrival_rate, queue_depth=float(snapshot.queue_depth),
            inflight=float(snapshot.inflight), p50_s=None, p99_s=snapshot.p99_s,
            gpu_utilization=snapshot.utilisation if self.engine_as_gpu else None,
            utilization=snapshot.utilisation, startup_s=self.startup_s)
        desired = self.autoscaler.tick(signals).desired
        self.timeline.append((snapshot.at_s, snapshot.ready, snapshot.starting, desired))
        return desired


@dataclass(frozen=True)
class ScalingConfig:
    rule: ScalingRule
    interval_s: float = 15.0
    min_replicas: int = 1
    max_replicas: int = 10_000
    cold_start_s: float | None = None  # None: the profile's measured cold start

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"scaling interval_s must be > 0, got {self.interval_s}")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError("scaling needs 1 <= min_replicas <= max_replicas")
        if self.cold_start_s is not None and self.cold_start_s < 0:
            raise ValueError("cold_start_s must be >= 0")
