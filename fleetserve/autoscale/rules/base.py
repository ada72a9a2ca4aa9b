"""The rule protocol: ``recommend(signals) -> Recommendation``, called once per tick with a fresh snapshot.

A rule keeps whatever history it needs (stabilisation windows, a rate trend, learned capacity) and reads
time only from the snapshots' ``at_s``, so a test drives it with synthetic snapshots and no sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from fleetserve.autoscale.signals import FleetSignals


@dataclass(frozen=True, slots=True)
class ScaleBounds:
    """The range every recommendation is clamped to (``--min-replicas`` / ``--max-replicas``); 0 allows
    scaling to zero."""

    min_replicas: int = 1
    max_replicas: int = 10

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError(f"autoscale needs 0 <= min_replicas <= max_replicas and max_replicas >= 1, "
                             f"got {self.min_replicas}..{self.max_replicas}")

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A rule's answer: the replica count it wants now and why (a short token for metrics labels, e.g.
    ``queue_depth``, ``forecast``, ``latency_trend``, ``stabilized``, ``idle``, ``tolerance``), with the
    numbers behind it for the decision log."""

    replicas: int
    reason: str
    detail: str = ""


class Rule(Protocol):
    def recommend(self, signals: FleetSignals) -> Recommendation: ...
