"""Adaptive concurrency: a limit on requests in flight that follows the fleet's measured latency.

Sans-IO: no timers, tasks or sockets. :meth:`GradientController.try_acquire` admits a request (a token) or
refuses it, :meth:`GradientController.release` returns the slot with the request's latency; the clock
(injected) is read on each call and the due updates happen then, so a test drives every rule with a fake
clock and a seeded RNG.

The algorithm is Envoy's ``adaptive_concurrency`` gradient controller (envoyproxy/envoy,
``source/extensions/filters/http/adaptive_concurrency/controller/gradient_controller.cc``; the filter's
architecture docs):

- **minRTT**, the latency without queueing, is measured in a *window* during which the limit drops to
  ``min_concurrency``: the window ends once ``min_rtt_samples`` requests that started inside it have
  finished, and minRTT is their ``sample_percentile``. A window opens at start, every
  ``min_rtt_interval_s`` plus up to ``jitter_percent`` (so that gateways do not measure in lockstep), and
  whenever the limit has sat at ``min_concurrency`` for 5 updates in a row (the minRTT is probably stale:
  the fleet got slower).
- Every ``update_interval_s`` outside a window, the latencies of the requests finished since the last update
  give **sampleRTT** (their ``sample_percentile``), and the limit becomes
  ``limit * gradient + sqrt(limit * gradient)`` with
  ``gradient = clamp(minRTT * (1 + rtt_buffer_percent / 100) / sampleRTT, 0.5, 2)``, kept within
  ``[min_concurrency, max_concurrency]``: it halves at most while latency rises, doubles at most while it
  falls, and the square root is headroom for bursts.
  With sampleRTT at minRTT the limit grows by a quarter plus the headroom per update.
- From Netflix's concurrency-limits (Netflix/concurrency-limits, ``limit/GradientLimit.java`` tracks the
  minimum RTT it observes; ``limit/Gradient2Limit.java`` does not grow an "app-limited" limit): an update
  whose sampleRTT is below minRTT lowers minRTT to it, so a minRTT measured too high (a cold start, a fleet
  that got faster) corrects itself without a window; and the limit does not grow while the interval's peak
  in-flight count stayed below half of it, so a quiet period does not leave a limit so high that the next
  burst queues for several updates before the limit comes down.

Requests that fail (``ok=False``: 5xx, disconnects) release their slot without a latency sample, and samples
of requests started before the current window are discarded, as in Envoy.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from fleetserve.gateway.edge.config import AdaptiveConcurrencyConfig

# Updates in a row at the floor after which the minRTT is re-measured (Envoy's constant).
_FLOOR_UPDATES_BEFORE_REMEASURE = 5
# Latency samples kept per update interval (or minRTT window) at most; later ones are dropped until the next
# update, which bounds memory and the cost of taking a percentile at any request rate.
MAX_SAMPLES = 4096


@dataclass(eq=False)
class Token:
    """One admitted request's slot; hand it back exactly once with :meth:`GradientController.release`."""

    started_at: float
    epoch: int
    released: bool = False


def percentile(samples: list[float], pct: float) -> float:
    """Nearest-rank ``pct`` percentile of a non-empty list."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(pct / 100 * len(ordered)) - 1))]


class GradientController:
    """The concurrency limit and its inputs; see the module docstring for the algorithm."""

    def __init__(self, config: AdaptiveConcurrencyConfig, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self._config = config
        self._clock = clock
        self._rng = rng or random.Random()
        self._limit = config.min_concurrency
        self._inflight = 0
        self._peak_inflight = 0  # since the last update
        self._samples: list[float] = []
        self._epoch = 0
        self._measuring = False
        self._deferred_limit = config.min_concurrency
        self._at_floor = 0
        self._min_rtt: float | None = None
        self._sample_rtt: float | None = None
        now = clock()
        self._next_update = now + config.update_interval_s
        self._next_min_rtt = math.inf
        self._enter_min_rtt_window()

    def now(self) -> float:
        """The controller's clock, for measuring a request's latency from ``Token.started_at``."""
        return self._clock()

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def min_rtt(self) -> float | None:
        """The latency without queueing (seconds); None until the first window completes."""
        return self._min_rtt

    @property
    def sample_rtt(self) -> float | None:
        """The latency of the last update interval (seconds)."""
        return self._sample_rtt

    @property
    def measuring_min_rtt(self) -> bool:
        return self._measuring

    def try_acquire(self) -> Token | None:
        """A slot for one request, or None when the limit is reached (answer it 503 at once)."""
        now = self._clock()
        self._advance(now)
        if self._inflight >= self._limit:
            return None
        self._inflight += 1
        self._peak_inflight = max(self._peak_inflight, self._inflight)
        return Token(now, self._epoch)

    def release(self, token: Token, latency_s: float, ok: bool) -> None:
        """Return ``token``'s slot; ``latency_s`` counts only when ``ok`` and the token is of this epoch."""
        if token.released:
            raise RuntimeError("token released twice")
        token.released = True
        self._inflight -= 1
        if ok and token.epoch == self._epoch and len(self._samples) < MAX_SAMPLES:
            self._samples.append(latency_s)
        now = self._clock()
        if self._measuring and len(self._samples) >= self._config.min_rtt_samples:
            self._finish_min_rtt_window(now)
        self._advance(now)

    def _advance(self, now: float) -> None:
        if self._measuring:
            return
        if now >= self._next_min_rtt:
            self._enter_min_rtt_window()
            return
        if now >= self._next_update:
            self._next_update = now + self._config.update_interval_s
            self._update_limit()

    def _enter_min_rtt_window(self) -> None:
        self._measuring = True
        self._deferred_limit = self._limit
        self._set_limit(self._config.min_concurrency)
        self._samples.clear()
        self._epoch += 1

    def _finish_min_rtt_window(self, now: float) -> None:
        self._min_rtt = percentile(self._samples, self._config.sample_percentile)
        self._samples.clear()
        self._set_limit(self._deferred_limit)
        self._measuring = False
        self._peak_inflight = self._inflight
        self._next_update = now + self._config.update_interval_s
        interval = self._config.min_rtt_interval_s
        if interval > 0:
            self._next_min_rtt = now + interval + self._rng.uniform(0, interval * self._config.jitter_percent / 100)
        else:
            self._next_min_rtt = math.inf

    def _update_limit(self) -> None:
        if not self._samples or self._min_rtt is None:
            return
        sample = percentile(self._samples, self._config.sample_percentile)
        self._samples.clear()
        self._sample_rtt = sample
        self._min_rtt = min(self._min_rtt, sample)
        buffered = self._min_rtt * (1 + self._config.rtt_buffer_percent / 100)
        gradient = min(2.0, max(0.5, buffered / sample)) if sample > 0 else 2.0
        limit = self._limit * gradient
        new = int(limit + math.sqrt(limit))
        peak, self._peak_inflight = self._peak_inflight, self._inflight
        if new > self._limit and 2 * peak < self._limit:
            return  # app-limited: demand, not the fleet, kept in-flight low
        self._set_limit(min(self._config.max_concurrency, max(self._config.min_concurrency, new)))

    def _set_limit(self, new: int) -> None:
        floor = self._config.min_concurrency
        if not self._measuring and self._limit == floor and new == floor:
            self._at_floor += 1
        else:
            self._at_floor = 0
        self._limit = new
        if self._at_floor >= _FLOOR_UPDATES_BEFORE_REMEASURE:
            self._at_floor = 0
            self._next_min_rtt = self._clock()
