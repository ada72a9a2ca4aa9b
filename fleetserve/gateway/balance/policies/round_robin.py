"""Round-robin: each candidate in turn, ignoring weights, load and slow start.

The simplest fair policy and a baseline for benchmarks. The position is a running counter taken
modulo the current number of candidates, so retries (which exclude endpoints) and fleet changes
shift the rotation rather than breaking it. Use ``weighted-round-robin`` for weights and slow start.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.policies.base import Clock, LoadSignals, RequestContext, StatelessPolicy


class RoundRobin(StatelessPolicy):
    def __init__(self, signals: LoadSignals, *, clock: Clock, rng: random.Random) -> None:
        # Start at a random offset so several gateways do not hit the same replica in lockstep.
        self._next = rng.randrange(1 << 16)

    def choose(self, candidates: Sequence[Endpoint], ctx: RequestContext) -> Endpoint:
        index = self._next % len(candidates)
        self._next = index + 1
        return candidates[index]
