"""Power of two choices (P2C), the one load-aware policy, parameterised by a cost.

Pick two distinct candidates uniformly at random and send the request to the one that costs less
(Mitzenmacher, "The Power of Two Choices in Randomized Load Balancing"; tower's ``balance::p2c``, which is
generic over ``load::Load`` the same way). Two samples get almost all the benefit of scanning the whole fleet
at O(1) cost, and avoid the herd that "always the global minimum" causes when several gateways (or workers
of one) share a fleet and its load reports. Ties go to the first draw.

The registered policies differ only in their cost (:mod:`fleetserve.gateway.balance.load`):

- ``least-pending``: requests in flight from this gateway (:func:`~.load.pending_cost`);
- ``p2c-peak-ewma`` (default): peak-EWMA latency × outstanding work (:func:`~.load.peak_ewma_cost`);
- ``queue-aware``: the replica's reported queue, in-flight rows and GPU state (:func:`~.load.reported_cost`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.load import Cost, peak_ewma_cost, pending_cost, reported_cost
from fleetserve.gateway.balance.policies.base import Clock, LoadSignals, RequestContext, StatelessPolicy, two_distinct


class PowerOfTwoChoices(StatelessPolicy):
    def __init__(self, signals: LoadSignals, *, clock: Clock, rng: random.Random, cost: Cost) -> None:
        self._signals = signals
        self._clock = clock
        self._rng = rng
        self._cost = cost

    def choose(self, candidates: Sequence[Endpoint], ctx: RequestContext) -> Endpoint:
        if len(candidates) == 1:
            return candidates[0]
        i, j = two_distinct(self._rng, len(candidates))
        a, b = candidates[i], candidates[j]
        load_a, load_b = self._signals.load(a), self._signals.load(b)
        now = self._clock()
        cost = self._cost
        return b if cost(load_b, load_a, now) < cost(load_a, load_b, now) else a


class LeastPending(PowerOfTwoChoices):
    """``least-pending``: P2C over this gateway's requests in flight."""

    def __init__(self, signals: LoadSignals, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(signals, clock=clock, rng=rng, cost=pending_cost)


class PeakEwmaP2C(PowerOfTwoChoices):
    """``p2c-peak-ewma``: P2C over peak-EWMA latency × outstanding work (Finagle's and Linkerd's default)."""

    def __init__(self, signals: LoadSignals, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(signals, clock=clock, rng=rng, cost=peak_ewma_cost)


class QueueAware(PowerOfTwoChoices):
    """``queue-aware``: P2C over the load the replicas report (queue, in-flight rows, GPU state)."""

    def __init__(self, signals: LoadSignals, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(signals, clock=clock, rng=rng, cost=reported_cost)
