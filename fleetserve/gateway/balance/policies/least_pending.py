"""Least pending via the power of two random choices (P2C).

Pick two distinct candidates uniformly at random and send the request to the one with fewer requests
in flight from this gateway (Mitzenmacher, "The Power of Two Choices in Randomized Load Balancing";
tower's ``balance::p2c``). Two samples get almost all the benefit of scanning the whole fleet at O(1)
cost, and avoid the herd that "always the global minimum" causes when several gateways share a fleet.

Cost = (pending + 1) / effective weight: a weight-2 replica is allowed twice the queue, and a replica
in slow start looks proportionally busier (see :mod:`fleetserve.gateway.balance.slowstart`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.policies.base import Clock, LoadSignals, RequestContext, StatelessPolicy, two_distinct


class LeastPending(StatelessPolicy):
    def __init__(self, signals: LoadSignals, *, clock: Clock, rng: random.Random) -> None:
        self._signals = signals
        self._clock = clock
        self._rng = rng

    def _cost(self, ep: Endpoint, now: float) -> float:
        load = self._signals.load(ep)
        return (load.pending + 1) / load.effective_weight(now)

    def choose(self, candidates: Sequence[Endpoint], ctx: RequestContext) -> Endpoint:
        if len(candidates) == 1:
            return candidates[0]
        i, j = two_distinct(self._rng, len(candidates))
        a, b = candidates[i], candidates[j]
        now = self._clock()
        return b if self._cost(b, now) < self._cost(a, now) else a
