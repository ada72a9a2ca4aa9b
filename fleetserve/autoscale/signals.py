"""What a scaling rule sees: one snapshot of the fleet per tick.

A snapshot is built from what the gateway already observes (every answered request's latency and the load
report on its response) and from its membership (replicas ready, starting, draining); no agent of its own.
Rates and latency percentiles are over sliding windows ending at ``at_s``; counts are "now".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReplicaSignals:
    """One replica's part of a snapshot."""

    url: str
    ready: bool  # routable now (healthy and not draining)
    request_rate: float  # requests/s answered over the last rate window
    queue_depth: float  # rows queued, from its latest load report
    inflight: float  # rows running, from its latest load report
    p50_s: float | None  # over the latency window; None: nothing answered in it
    p99_s: float | None
    utilization: float | None = None  # ORCA application_utilization: engine busy share of the last second
    gpu_utilization: float | None = None  # None: no GPU reported
    gpu_throttled: bool = False


@dataclass(frozen=True, slots=True)
class FleetSignals:
    """The fleet at ``at_s`` (the injected clock's seconds)."""

    at_s: float
    ready: int  # replicas routable now
    starting: int  # asked for, not yet ready
    draining: int  # leaving: no new requests, finishing what they hold
    request_rate: float  # requests/s arriving at the gateway over the last rate window
    queue_depth: float  # rows queued across ready replicas (sum of their latest reports)
    inflight: float  # rows running across ready replicas
    p50_s: float | None  # fleet-wide, over the latency window
    p99_s: float | None
    held: int = 0  # requests the gateway holds waiting for a first replica (scale from zero)
    gpu_utilization: float | None = None  # mean over replicas reporting one; None: no GPU
    gpu_throttled: int = 0  # replicas reporting throttling
    utilization: float | None = None  # mean engine busy share (ORCA application_utilization) over ready replicas
    startup_s: float | None = None  # a replica's measured start-up time (decision to ready); None: not measured yet
    replicas: tuple[ReplicaSignals, ...] = ()

    @property
    def current(self) -> int:
        """The replica count a rule scales from: ready + starting (what has been asked for)."""
        return self.ready + self.starting
