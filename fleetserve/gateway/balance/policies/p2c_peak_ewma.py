"""P2C over peak-EWMA cost: the default policy.

Two distinct random candidates, the one with the lower cost wins (tower ``balance::p2c`` over
``load::PeakEwma``; Finagle/Linkerd's default). Cost = peak-EWMA latency × (pending + 1), the
expected time until a new request would complete there, so a replica that got slow (a GC pause, a
throttled GPU, a noisy neighbour) loses traffic at once and regains it as its estimate decays; failed
requests raise the estimate (see :mod:`fleetserve.gateway.balance.load`).

The cost is divided by the effective weight, so weights and slow start shift the comparison the same
way they shift ``least-pending``. An endpoint without a latency sample yet (new, or just re-admitted)
borrows its rival's estimate, so the pair is compared on pending work alone: a fixed default would make
it look either far slower than a warm fleet (starved until the default decays) or far faster (a burst).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.policies.base import Clock, LoadSignals, RequestContext, StatelessPolicy, two_distinct


class P2CPeakEwma(StatelessPolicy):
    def __init__(self, signals: LoadSignals, *, clock: Clock, rng: random.Random) -> None:
        self._signals = signals
        self._clock = clock
        self._rng = rng

    def _cost(self, ep: Endpoint, rival: Endpoint, now: float) -> float:
        load = self._signals.load(ep)
        other = self._signals.load(rival).ewma
        if load.ewma.measured or not other.measured:
            cost = load.ewma_cost(now)
        else:
            cost = other.estimate(now) * (load.pending + 1)
        return cost / load.effective_weight(now)

    def choose(self, candidates: Sequence[Endpoint], ctx: RequestContext) -> Endpoint:
        if len(candidates) == 1:
            return candidates[0]
        i, j = two_distinct(self._rng, len(candidates))
        a, b = candidates[i], candidates[j]
        now = self._clock()
        return b if self._cost(b, a, now) < self._cost(a, b, now) else a
