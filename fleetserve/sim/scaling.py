"""Autoscaling in the simulator: a rule sees a fleet snapshot every interval and names the replica count.

The protocol is the smallest a rule needs: ``desired(snapshot) -> replicas``, where the snapshot holds what a
metrics pipeline would show at that simulated time (arrival rate, p99 and engine utilisation over the last
interval, queue depth and replicas ready or starting). The simulator clamps the answer to
``[min_replicas, max_replicas]``, starts new replicas (ready, and announced to the gateway, after the cold
start) or retires replicas still starting, then the newest ready ones (as a Kubernetes ReplicaSet does); a
retired replica leaves the gateway at once and finishes the work it holds. :class:`FixedSize` keeps the fleet as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


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
