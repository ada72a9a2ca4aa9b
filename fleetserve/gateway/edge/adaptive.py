"""Adaptive concurrency: a limit on requests in flight that follows the fleet's measured latency.

Sans-IO: no timers, tasks or sockets. :meth:`GradientController.try_acquire` admits a request (a token) or
refuses it, :meth:`GradientController.release` returns the slot with the request's latency; the clock
(injected) is read on each call and the due updates happen then, so a test drives every rule with a fake
clock and a seeded RNG.

The algorithm is Envoy's ``adaptive_concurrency`` gradient controller (envoyproxy/envoy,
``source/extensions/filters/http/adaptive_concurrency/controller/gradient_controller.cc``; the filter's
architecture docs), with changes taken from Netflix's concurrency-limits (Netflix/concurrency-limits,
``limit/GradientLimit.java``, ``limit/Gradient2Limit.java``) and TCP's congestion window validation (RFC 7661):

- **Start.** Envoy starts at ``min_concurrency`` and refuses everything beyond it until ``min_rtt_samples``
  requests have measured minRTT, so a cold gateway refuses most of a normal load. Here the limit starts at
  ``initial_concurrency``, as Gradient2Limit starts at its ``initialLimit`` and measures as it goes.
- **minRTT** is the latency without queueing. It follows the latest ``min_rtt_samples`` requests that were
  admitted with fewer than ``min_concurrency`` others in flight — the condition Envoy's measuring window
  creates by refusing, taken whenever it happens by itself (GradientLimit, likewise, keeps tracking the RTT it
  sees at no load): downwards at once, upwards only once the limit has sat within twice its floor for
  ``LOW_LIMIT_UPDATES`` updates (Envoy re-measures after 5 updates at the floor), because under overload such
  requests arrive right behind a batch the replicas just started. A fleet that got slower pushes the limit
  down to there, and its new minRTT is taken. Until that many low-load requests have finished (a gateway
  that starts busy), the lowest latency seen so far, of the few low-load requests or of an update, stands
  in. Envoy's forced windows, which refuse beyond ``min_concurrency`` while they last, with up to
  ``jitter_percent`` random delay so that gateways do not measure in lockstep, are kept as an option
  (``min_rtt_interval_s`` > 0; the first window then opens at start, as in Envoy).
- Every ``update_interval_s`` outside a window, once at least ``min_update_samples`` requests finished since
  the last update (Netflix's ``WindowedLimit`` waits for enough samples likewise: a percentile of a handful of
  latencies is noise, and noise alone would walk the limit down at low rates), their latencies give
  **sampleRTT** (their ``sample_percentile``), and the limit becomes
  ``limit * gradient + sqrt(limit * gradient)`` with
  ``gradient = clamp(max(minRTT * (1 + rtt_buffer_percent / 100), latency_floor) / sampleRTT, 0.5, 2)``, kept within
  ``[min_concurrency, max_concurrency]``: it halves at most per update while latency rises, grows by a
  quarter plus the square-root headroom while latency stays at minRTT, and settles where the headroom
  balances the gradient, a limit of ``g / (1 - g)^2`` for a steady gradient ``g`` below 1. A gradient above 1
  counts only while Little's law (L = λW) accounts for the requests in flight: when more are in flight than
  twice the finished requests' rate times their mean latency, those latencies are of requests that started
  before a queue did (an overload's first update), and the limit grows by the square-root headroom alone,
  as Gradient2Limit always grows. Without this and the "used, never reached" rule below, a 3x burst's
  first updates doubled the limit on the calm phase's latencies, and the burst's admitted p99 was 2.1-4.2x
  the unloaded p99 where it is 2.0-2.5x with them (BENCHMARKS.md §4.4). The default buffer, 100%, is what a
  batching replica needs: a request that arrives while a batch runs waits for it and then for its own, up to
  twice the no-load latency, without any queue beyond the next batch (Envoy's 25% takes that wait for
  queueing and keeps fewer in flight than such a replica needs to fill its batches).
- **A latency floor** (``latency_floor_ms``, 50 ms by default; not in Envoy or Netflix's limits): a median
  latency at or below it is never a reason to shrink the limit, the way CoDel (Nichols and Jacobson,
  "Controlling Queue Delay", ACM Queue 2012; RFC 8289) drops nothing while the queue delay stays under its
  absolute target: below it the gradient grows the limit, up to 2× per update (the app-limited rule below still
  brings an unused limit down to what demand needs). A
  batching GPU replica answers faster alone than with company, yet serves more per second with fuller
  batches: a limit that follows its no-load latency alone held 256 clients near twice that latency and cost
  a quarter of the throughput (BENCHMARKS.md §4.4). Under a real overload latency leaves any floor behind
  within an update, and the gradient applies in full.
- **Demand, not the fleet, keeps in-flight low** when the highest in-flight count of the last
  ``APP_LIMITED_UPDATES`` updates stayed below half the limit (Gradient2Limit's "app-limited" rule, over a
  window so a quiet second between two bursts does not count as no demand). The limit then does not grow
  past what was used (Gradient2Limit); if latency is within the buffer it moves to just over twice that
  peak, but not below ``initial_concurrency`` (RFC 7661 likewise brings an unused congestion window down
  toward what was used); if latency rose, it shrinks by the gradient but not below just over twice the peak.
  Otherwise a calm hour leaves the limit wherever the last peak lifted it and the next burst queues at the
  replicas for the several updates the limit needs to halve its way down; after an overload the limit
  comes back up to its initial value at once instead of by a quarter per update; and a fleet that is slower
  but not overloaded (a stalled or draining replica, at a load the others absorb) is not refused: refusing
  requests the limit is not even holding back cannot shorten the queue. Under a real overload the queue
  grows in-flight (Little's law) past half the limit within the window, and the gradient applies in full.
- **A limit that was used but never reached does not shrink, and grows by its headroom alone** (RFC 7661's
  validation again: a window that was not the constraint says nothing about the right one): when in-flight
  peaked between half the limit and the limit within the window and nothing was refused, a latency above the
  buffer holds the limit where it is, and a latency within it adds the square-root headroom only, as
  Netflix's AIMDLimit adds one request per sample from half its limit on. Shrinking there refuses the next
  burst without shortening any queue: a degraded fleet at a load it carries, one replica stalling while the
  others absorb its share, shows latency up by half while bursts of requests wait on the stalled replica.
  Growing by the gradient there, up to twice per update, lets the next burst queue that much deeper before
  its latency can show. An overload reaches the limit within an update, and from then on the gradient
  applies in full.

- **While the fleet grows** (``try_acquire(unlimited)`` with ``unlimited()`` true: the gateway's autoscaler is
  adding replicas) a request at the limit is admitted all the same. An update after such admissions never
  shrinks the limit and lifts it to the in-flight count the fleet carried, so once the fleet stops growing the
  limit takes over from there and the gradient brings it down, instead of refusing all but a few.

Requests that fail (``ok=False``: errors, refusals by inner guards, disconnects) return their slot without a
latency sample, and samples of requests started before the current window are discarded, as in Envoy.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from fleetserve.gateway.edge.config import AdaptiveConcurrencyConfig

# Latency samples kept per update interval at most; later ones are dropped until the next update, which bounds
# memory and the cost of taking a percentile at any request rate.
MAX_SAMPLES = 4096
# Updates over which the peak in-flight count is taken for the app-limited rule (one second at the default).
APP_LIMITED_UPDATES = 10
# Updates in a row with the limit near its floor after which minRTT may rise (Envoy's "5 at the floor").
LOW_LIMIT_UPDATES = 5


@dataclass(eq=False, slots=True)
class Token:
    """One admitted request's slot; hand it back exactly once with :meth:`GradientController.release`."""

    started_at: float
    epoch: int
    low_load: bool  # admitted with fewer than min_concurrency others in flight: its latency estimates minRTT
    released: bool = False


def percentile(samples: list[float] | deque[float], pct: float) -> float:
    """Nearest-rank ``pct`` percentile of a non-empty sequence."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(pct / 100 * len(ordered)) - 1))]


class GradientController:
    """The concurrency limit and its inputs; see the module docstring for the algorithm."""

    def __init__(self, config: AdaptiveConcurrencyConfig, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self._config = config
        self._clock = clock
        self._rng = rng or random.Random()
        self._initial = min(config.max_concurrency, max(config.min_concurrency, config.initial_concurrency))
        self._limit = self._initial
        self._inflight = 0
        self._samples: list[float] = []
        self._low_load: deque[float] = deque(maxlen=config.min_rtt_samples)
        self._peaks: deque[int] = deque([0], maxlen=APP_LIMITED_UPDATES)
        self._refusals: deque[int] = deque([0], maxlen=APP_LIMITED_UPDATES)  # per update, beside the peaks
        self._beyond = 0  # admitted past the limit since the last update (the fleet was growing)
        self._epoch = 0
        self._measuring = False
        self._deferred_limit = self._initial
        self._min_rtt: float | None = None
        self._low_limit_updates = 0
        self._sample_rtt: float | None = None
        self._next_update = clock() + config.update_interval_s  # the last update was an interval before it
        self._finished = 0  # requests released since the last update, for Little's law
        self._next_window = math.inf
        if config.min_rtt_interval_s > 0:
            self._enter_window()

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
        """The latency without queueing (seconds); None until the first update or window completes."""
        return self._min_rtt

    @property
    def sample_rtt(self) -> float | None:
        """The latency of the last update interval (seconds)."""
        return self._sample_rtt

    @property
    def measuring_min_rtt(self) -> bool:
        return self._measuring

    def try_acquire(self, unlimited: Callable[[], bool] | None = None) -> Token | None:
        """A slot for one request, or None when the limit is reached (answer it 503 at once). At the limit, a
        slot all the same while ``unlimited()`` says so (the fleet is growing: :mod:`.adaptive_guard`), counted
        like any other, so the limit keeps following demand and latency meanwhile."""
        now = self._clock()
        self._advance(now)
        if self._inflight >= self._limit:
            if unlimited is None or not unlimited():
                self._refusals[-1] += 1
                return None
            self._beyond += 1
        token = Token(now, self._epoch, self._inflight < self._config.min_concurrency)
        self._inflight += 1
        if self._inflight > self._peaks[-1]:
            self._peaks[-1] = self._inflight
        return token

    def release(self, token: Token, latency_s: float, ok: bool) -> None:
        """Return ``token``'s slot; ``latency_s`` counts only when ``ok`` and the token is of this epoch."""
        if token.released:
            raise RuntimeError("token released twice")
        token.released = True
        self._inflight -= 1
        self._finished += 1
        if ok and token.epoch == self._epoch:
            if len(self._samples) < MAX_SAMPLES:
                self._samples.append(latency_s)
            if token.low_load:
                self._low_load.append(latency_s)
        now = self._clock()
        if self._measuring and len(self._low_load) >= self._config.min_rtt_samples:
            self._finish_window(now)
        self._advance(now)

    def _advance(self, now: float) -> None:
        if self._measuring:
            return
        if now >= self._next_window:
            self._enter_window()
        elif now >= self._next_update and len(self._samples) >= self._config.min_update_samples:
            since = now - (self._next_update - self._config.update_interval_s)
            self._next_update = now + self._config.update_interval_s
            self._update_limit(since)
            self._peaks.append(self._inflight)
            self._refusals.append(0)

    def _enter_window(self) -> None:
        self._measuring = True
        self._deferred_limit = self._limit
        self._limit = self._config.min_concurrency
        self._samples.clear()
        self._low_load.clear()
        self._epoch += 1

    def _finish_window(self, now: float) -> None:
        self._min_rtt = percentile(self._low_load, self._config.sample_percentile)
        self._samples.clear()
        self._limit = self._deferred_limit
        self._measuring = False
        self._peaks.append(self._inflight)
        self._refusals.append(0)
        self._next_update = now + self._config.update_interval_s
        self._finished = 0  # the window's answers say nothing of the rate after it
        interval = self._config.min_rtt_interval_s
        if interval > 0:
            self._next_window = now + interval + self._rng.uniform(0, interval * self._config.jitter_percent / 100)

    def _update_limit(self, since: float) -> None:
        """The limit for the next interval, from the requests finished in the ``since`` seconds since the last."""
        sample = percentile(self._samples, self._config.sample_percentile)
        # Little's law: the requests in flight that the finished ones' rate and mean latency account for.
        explained = self._finished / max(since, 1e-9) * sum(self._samples) / len(self._samples)
        self._finished = 0
        self._samples.clear()
        self._sample_rtt = sample
        buffered = max(self._follow_min_rtt(sample) * (1 + self._config.rtt_buffer_percent / 100),
                       self._config.latency_floor_s)
        gradient = min(2.0, max(0.5, buffered / sample)) if sample > 0 else 2.0
        peak = max(self._peaks)
        reached = peak >= self._limit or any(self._refusals)
        if gradient > 1 and (not reached or self._inflight > 2 * explained):
            gradient = 1.0  # grow by the headroom alone: see the module docstring
        limit = self._limit * gradient
        new = min(self._config.max_concurrency, max(self._config.min_concurrency, int(limit + math.sqrt(limit))))
        if 2 * peak < self._limit:  # app-limited: demand, not the fleet, kept in-flight low
            # Just over twice the peak, so the peak stays below half and this holds: the limit shrinks no
            # further while demand stays there, and comes back to the initial limit when latency is fine.
            floor = 2 * peak + 1
            new = max(floor, min(new, self._limit)) if gradient < 1 else max(self._initial, floor)
        elif gradient < 1 and not reached:
            new = self._limit  # used, never reached: nothing was held back, so nothing to shrink for
        if self._beyond:
            # Admitted past the limit while the fleet grew: follow what it carried, never shrink, so the limit
            # takes over from there (and then shrinks by the gradient) rather than refusing all but a few.
            new = max(new, self._limit, self._peaks[-1])
            self._beyond = 0
        self._limit = new

    def _follow_min_rtt(self, sample: float) -> float:
        """The minRTT for this update. It falls to the low-load requests' latency at once; it rises to it only
        after the limit sat near its floor for ``LOW_LIMIT_UPDATES`` updates, when so few requests in flight
        cannot explain the latency by queueing. (Under overload, low-load moments come right after a batch of
        answers, behind the replicas' next batch: their latency drifts up without the fleet getting slower.)
        Until ``min_rtt_samples`` low-load requests have finished, it is the lowest of the updates' ``sample``
        and the low-load requests' latency so far."""
        if self._limit <= 2 * self._config.min_concurrency:
            self._low_limit_updates += 1
        else:
            self._low_limit_updates = 0
        if len(self._low_load) < self._config.min_rtt_samples:
            if self._low_load:
                sample = min(sample, percentile(self._low_load, self._config.sample_percentile))
            if self._min_rtt is None or sample < self._min_rtt:
                self._min_rtt = sample
            return self._min_rtt
        low_load = percentile(self._low_load, self._config.sample_percentile)
        if self._min_rtt is None or low_load < self._min_rtt or self._low_limit_updates >= LOW_LIMIT_UPDATES:
            self._min_rtt = low_load
        return self._min_rtt
