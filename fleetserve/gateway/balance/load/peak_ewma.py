"""Peak-EWMA latency: a peak-sensitive, time-decayed estimate of an endpoint's response time.

Follows Finagle's ``PeakEwma`` as ported to tower (``tower/src/load/peak_ewma.rs``): a sample above the
estimate replaces it at once (the peak), a lower one pulls the estimate towards itself by
``1 - exp(-elapsed / tau)``, and between samples the estimate decays towards zero so an endpoint that
went quiet becomes attractive again. Unlike tower, reading never mutates the estimate, the first real
sample replaces the default outright (so a new fast replica is not held back for several tau), and the
decay stops at a small floor: an estimate that decayed to ~0 would make the work factor irrelevant and
send a whole burst to one idle replica.

Failures are penalised: a failed request (5xx or connect error) counts as a sample of at least twice the
current estimate, so a replica that fails fast looks slower with every failure instead of looking like
the fastest one in the fleet.

Cost = estimate × (outstanding work + 1) / effective weight, the expected time until a new request would
complete there. Outstanding work is the replica's own report (ORCA queue depth and in-flight rows, which
include every gateway's requests) blended with this gateway's pending count as the report ages
(:func:`~fleetserve.gateway.balance.load.reported.outstanding`). An endpoint without a latency sample yet
(new, or just re-admitted) borrows its rival's estimate, so the pair is compared on work alone: a fixed
default would make it look either far slower than a warm fleet (starved until the default decays) or far
faster (a burst).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fleetserve.gateway.balance.load.reported import outstanding

if TYPE_CHECKING:
    from fleetserve.gateway.balance.load.endpoint import EndpointLoad

_EWMA_FLOOR_S = 1e-4


class PeakEwma:
    """Peak-sensitive, time-decayed latency estimate in seconds."""

    __slots__ = ("_estimate", "_tau", "_updated_at", "measured")

    def __init__(self, tau_s: float, initial_s: float, now: float) -> None:
        self._tau = tau_s
        self._estimate = initial_s
        self._updated_at = now
        # Whether any real sample has replaced the default since creation or the last reset (a plain
        # attribute, not a property: the P2C cost reads it twice per pick).
        self.measured = False

    def estimate(self, now: float) -> float:
        """The estimate decayed to ``now`` (towards zero, never below a small floor)."""
        elapsed = now - self._updated_at
        if elapsed <= 0:
            return self._estimate
        decayed = self._estimate * math.exp(-elapsed / self._tau)
        return decayed if decayed > _EWMA_FLOOR_S else _EWMA_FLOOR_S  # max() without the call: P2C reads two per pick

    def observe(self, latency_s: float, now: float) -> None:
        current = self._estimate
        if latency_s > current or not self.measured:
            # The default only stands in until the first measurement, which replaces it outright.
            self.measured = True
            self._estimate = latency_s
        else:
            elapsed = now - self._updated_at
            decay = math.exp(-(elapsed if elapsed > 0.0 else 0.0) / self._tau)
            self._estimate = current * decay + latency_s * (1.0 - decay)
        self._updated_at = now

    def observe_failure(self, latency_s: float, now: float) -> None:
        self.observe(max(latency_s, 2.0 * self.estimate(now)), now)

    def reset(self, initial_s: float, now: float) -> None:
        """Forget all samples: back to ``initial_s`` until the next measurement."""
        self._estimate = initial_s
        self._updated_at = now
        self.measured = False


def peak_ewma_cost(load: EndpointLoad, rival: EndpointLoad, now: float) -> float:
    ewma = load.ewma if load.ewma.measured or not rival.ewma.measured else rival.ewma
    return ewma.estimate(now) * (outstanding(load, now) + 1.0) / load.effective_weight(now)
