"""Smooth weighted round-robin, as in NGINX's upstream module (``ngx_http_upstream_round_robin.c``).

Every pick, each candidate's running ``current`` grows by its effective weight; the candidate with
the highest ``current`` wins and gives back the sum of all weights. Over any window the picks are
proportional to the weights, and they are interleaved rather than bunched: weights 5, 1, 1 give
``a a b a c a a``. The effective weight is the configured weight times the slow-start factor, so a
ramping replica's share grows smoothly. Ties go to the earlier candidate, as in NGINX.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.policies.base import Clock, LoadSignals, RequestContext


class WeightedRoundRobin:
    def __init__(self, signals: LoadSignals, *, clock: Clock, rng: random.Random) -> None:
        self._signals = signals
        self._clock = clock
        self._current: dict[Endpoint, float] = {}

    def choose(self, candidates: Sequence[Endpoint], ctx: RequestContext) -> Endpoint:
        now = self._clock()
        current = self._current
        total = 0.0
        best = candidates[0]
        best_current = float("-inf")
        for ep in candidates:
            weight = self._signals.load(ep).effective_weight(now)
            value = current.get(ep, 0.0) + weight
            current[ep] = value
            total += weight
            if value > best_current:
                best, best_current = ep, value
        current[best] = best_current - total
        return best

    def forget(self, ep: Endpoint) -> None:
        self._current.pop(ep, None)
