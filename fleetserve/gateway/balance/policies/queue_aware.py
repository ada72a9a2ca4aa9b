"""Queue-aware: route by the load replicas report about themselves (queue, in-flight, GPU state).

Modelled on the endpoint picker of the Kubernetes Gateway API Inference Extension, which scores
model servers by the queue depth and accelerator state they export and sends each request to the
best score. Replicas put their ORCA load report (queue depth, in-flight rows, GPU utilisation and
throttling; :mod:`fleetserve.wire`) on every response, so the view costs no polling and sees load from
every gateway, not just this one.

Score (lower wins), with f = freshness of the last report in [0, 1]:

    work  = f × (queue_weight × queue + inflight + sent_since_report) + (1 − f) × local_pending
    score = (work + 1) × (1 + gpu_weight × f × gpu_utilization)
                       × (throttle_factor if throttled, faded by f) / effective_weight

``sent_since_report`` is what this gateway sent after the report was taken, which the report cannot
contain yet; with no fresh report (f = 0) the score falls back to local pending alone. All candidates
are scored (O(n), fleets are small) and ties are broken uniformly at random; because every pick
raises the winner's local pending at once, a burst still spreads instead of herding.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.policies.base import Clock, LoadSignals, RequestContext, StatelessPolicy


@dataclass(frozen=True)
class QueueAwareConfig:
    queue_weight: float = 1.0
    gpu_weight: float = 1.0
    throttle_factor: float = 4.0

    def __post_init__(self) -> None:
        if self.queue_weight < 0 or self.gpu_weight < 0:
            raise ValueError("queue-aware queue_weight and gpu_weight must be >= 0")
        if self.throttle_factor < 1:
            raise ValueError(f"queue-aware throttle_factor must be >= 1, got {self.throttle_factor}")


class QueueAware(StatelessPolicy):
    def __init__(
        self,
        signals: LoadSignals,
        *,
        clock: Clock,
        rng: random.Random,
        config: QueueAwareConfig | None = None,
    ) -> None:
        self._signals = signals
        self._clock = clock
        self._rng = rng
        self._config = config or QueueAwareConfig()

    def score(self, ep: Endpoint, now: float) -> float:
        load = self._signals.load(ep)
        fresh = load.reported.freshness(now)
        if fresh <= 0.0:
            return (load.pending + 1) / load.effective_weight(now)
        cfg = self._config
        reported = load.reported.last
        remote = cfg.queue_weight * reported.queue_depth + reported.inflight + load.unreported_pending()
        work = fresh * remote + (1.0 - fresh) * load.pending
        score = (work + 1.0) * (1.0 + cfg.gpu_weight * fresh * reported.gpu_utilization)
        if reported.gpu_throttled:
            score *= 1.0 + (cfg.throttle_factor - 1.0) * fresh
        return score / load.effective_weight(now)

    def choose(self, candidates: Sequence[Endpoint], ctx: RequestContext) -> Endpoint:
        now = self._clock()
        best = candidates[0]
        best_score = self.score(best, now)
        ties = 1
        for i in range(1, len(candidates)):
            ep = candidates[i]
            s = self.score(ep, now)
            if s < best_score:
                best, best_score, ties = ep, s, 1
            elif s == best_score:
                # Reservoir sampling over the tied minimum: uniform without building a list.
                ties += 1
                if self._rng.randrange(ties) == 0:
                    best = ep
        return best
