"""Hedged requests: when an inference call is slower than usual, send a copy to another replica.

Dean and Barroso, "The Tail at Scale" (CACM 56(2), 2013): defer a second, *hedged* copy of a request
until the first has been outstanding longer than the 95th-percentile expected latency, take whichever
answer comes first and cancel the other. That caps the extra load near 5% while cutting the tail a
stalled server (a throttling GPU, a GC pause, a SIGSTOPped process) would otherwise set. Finagle's
``BackupRequestFilter`` does the same with a sliding-window latency percentile and a budget of extra
load (``maxExtraLoad``), and Envoy's ``hedge_policy`` races a second try after a per-try timeout.

Hedging is on by default at the 99th percentile, toward idle replicas only (``--hedge-spare-only``);
``--hedge-percentile 0`` turns it off (Envoy's is opt-in). On the throttled-replica scenario of
``benchmarks/gateway.py`` on a quiet 2-core box (BENCHMARKS.md §4.5, three runs) it kept the throttled
p99.9 at 0.97–1.08× the all-healthy p99.9, against 2.3–3.55× without it, and moved the all-healthy p99 at
60% load by +6% and −1%; hedging toward any replica instead cost up to +33% there, which is why a hedge
goes only to a replica with nothing outstanding: near saturation there is none, and hedging stops by
itself. Earlier runs, before that rule and before losers were penalised (see
:meth:`~fleetserve.gateway.balance.load.EndpointLoad.outpaced`), varied from run to run and raised the p99
at higher load, which is why it used to be opt-in.

Here:

- :class:`LatencyWindow` keeps the last ``window`` successful attempt latencies of one route (one
  model's infer path) and recomputes their ``percentile`` every ``window // 8`` observations, so the
  threshold follows the fleet's current speed at amortised O(1) cost per request. No hedging before
  ``min_samples`` latencies are known: a cold gateway does not guess.
- :class:`HedgeBudget` is a token bucket counted in requests, not time: each request deposits
  ``max_extra_percent / 100`` of a token, each hedge takes one, so hedges stay within that share of
  traffic however the latency distribution shifts; ``burst`` bounds what a quiet spell saves up. Hedges
  do not draw on the retry budget: retries are what keeps a crash from failing requests, and hedges
  competing for the same few slots made some of them fail.
- :func:`race` runs the first attempt in the caller's own task (no task, no ``asyncio.wait`` on the
  common path where no hedge is due: a timer is all it costs) and, once the delay passes, the hedge as
  a task beside it; a winning hedge interrupts the caller the way ``asyncio.timeout`` does, by
  cancelling it and taking the cancellation back with ``Task.uncancel``.
- Only inference calls are hedged (``.../infer`` and ``/inference`` over HTTP, ``ModelInfer`` over gRPC):
  they are pure functions of their input, so running one twice is safe. Everything else is sent once.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from fleetserve.options import option

T = TypeVar("T")

HEDGED_PATH_SUFFIXES = ("/infer", "/ModelInfer")  # KServe v2 over HTTP, and its gRPC method
HEDGED_PATHS = frozenset({"/inference"})
_MAX_ROUTES = 64  # distinct paths with a window of their own; any further ones share one window


def hedgeable(method: str, path: str) -> bool:
    """Whether a request may be sent twice (an idempotent inference call)."""
    return method == "POST" and (path in HEDGED_PATHS or path.endswith(HEDGED_PATH_SUFFIXES))


@dataclass(frozen=True)
class HedgeConfig:
    """``percentile`` 99 (the default) is the setting measured best; 0 turns hedging off."""

    percentile: float = option(99.0, "hedge an inference call on another replica once it is slower than this "
                               "percentile of the route's recent latencies, e.g. 99; 0: never",
                               flag="--hedge-percentile")
    min_delay_ms: float = 1.0
    max_extra_percent: float = option(10.0, "hedges at most this share of requests", flag="--hedge-max-extra-percent")
    spare_only: bool = option(True, "hedge only to a replica with nothing outstanding (its last load report and "
                              "this gateway's count): near saturation there is none, and hedging stops by itself",
                              flag="--hedge-spare-only")
    burst: float = 20.0
    window: int = 1000
    min_samples: int = 100

    def __post_init__(self) -> None:
        if not (self.percentile == 0 or 50 <= self.percentile < 100):
            raise ValueError(f"hedge percentile must be 0 (off) or in 50..<100, got {self.percentile}")
        if not 0 <= self.min_delay_ms <= 60_000:
            raise ValueError(f"hedge min_delay_ms must be in 0..60000, got {self.min_delay_ms}")
        if not 0 < self.max_extra_percent <= 100:
            raise ValueError(f"hedge max_extra_percent must be in (0, 100], got {self.max_extra_percent}")
        if self.burst < 1:
            raise ValueError(f"hedge burst must be >= 1, got {self.burst}")
        if not 8 <= self.window <= 100_000:
            raise ValueError(f"hedge window must be in 8..100000 latencies, got {self.window}")
        if not 1 <= self.min_samples <= self.window:
            raise ValueError(f"hedge min_samples must be in 1..window ({self.window}), got {self.min_samples}")

    @property
    def enabled(self) -> bool:
        return self.percentile > 0


class LatencyWindow:
    """The ``percentile`` of the last ``size`` latencies, refreshed every ``size // 8`` observations."""

    __slots__ = ("_every", "_min_samples", "_next", "_percentile", "_samples", "_since", "_size", "threshold")

    def __init__(self, size: int, percentile: float, min_samples: int) -> None:
        self._samples: list[float] = []
        self._next = 0
        self._size = size
        self._percentile = percentile
        self._min_samples = min_samples
        self._every = max(1, size // 8)
        self._since = 0
        self.threshold: float | None = None  # seconds; None until min_samples latencies are in

    def observe(self, latency_s: float) -> None:
        samples = self._samples
        if len(samples) < self._size:
            samples.append(latency_s)
        else:
            samples[self._next] = latency_s
            self._next = (self._next + 1) % self._size
        self._since += 1
        if len(samples) >= self._min_samples and (self.threshold is None or self._since >= self._every):
            self._since = 0
            ordered = sorted(samples)
            rank = min(len(ordered) - 1, math.ceil(self._percentile / 100.0 * len(ordered)) - 1)
            self.threshold = ordered[max(0, rank)]


class HedgeBudget:
    """Hedges allowed as a share of requests: a token bucket filled per request, not per second."""

    __slots__ = ("_burst", "_per_request", "tokens")

    def __init__(self, max_extra_percent: float, burst: float) -> None:
        self._per_request = max_extra_percent / 100.0
        self._burst = burst
        self.tokens = 0.0

    def deposit(self) -> None:
        """One request arrived: it earns a fraction of a hedge."""
        self.tokens = min(self._burst, self.tokens + self._per_request)

    def available(self) -> bool:
        return self.tokens >= 1.0 - 1e-9  # ten deposits of 0.1 add up to 0.999...

    def take(self) -> None:
        """Spend one hedge; only after :meth:`available` said there is one."""
        self.tokens -= 1.0


class Hedger:
    """The hedging state of one gateway process: a latency window per inference route and one budget."""

    def __init__(self, config: HedgeConfig) -> None:
        self.config = config
        self.budget = HedgeBudget(config.max_extra_percent, config.burst)
        self._windows: dict[str, LatencyWindow] = {}
        self._min_delay_s = config.min_delay_ms / 1000.0

    def _window(self, path: str) -> LatencyWindow:
        window = self._windows.get(path)
        if window is None:
            key = path if len(self._windows) < _MAX_ROUTES else ""
            window = self._windows.get(key)
            if window is None:
                cfg = self.config
                window = self._windows[key] = LatencyWindow(cfg.window, cfg.percentile, cfg.min_samples)
        return window

    def delay_s(self, method: str, path: str) -> float | None:
        """How long to wait before hedging this request, or None when it must not be hedged.

        Counts the request towards the hedge budget, so call it once per client request.
        """
        if not self.config.enabled or not hedgeable(method, path):
            return None
        self.budget.deposit()
        threshold = self._window(path).threshold
        if threshold is None:
            return None
        return max(self._min_delay_s, threshold)

    def observe(self, method: str, path: str, latency_s: float) -> None:
        """The latency of one attempt that a replica answered without a server error."""
        if self.config.enabled and hedgeable(method, path):
            self._window(path).observe(latency_s)


async def race(first: Awaitable[T], delay_s: float,
               start_hedge: Callable[[], Coroutine[Any, Any, T] | None],
               final: Callable[[T], bool]) -> tuple[T, bool]:
    """Await ``first``; if it is still running after ``delay_s``, call ``start_hedge`` and run what it
    returns (None: no hedge) beside it. The first result ``final`` accepts wins and the other attempt is
    cancelled; when ``first`` ends with a result ``final`` refuses while the hedge runs, the hedge's result
    is returned whatever it is. Returns the result and whether it came from the hedge.
    """
    loop = asyncio.get_running_loop()
    caller = asyncio.current_task()
    if caller is None:
        raise RuntimeError("race() must run in a task")
    hedge: asyncio.Task[T] | None = None
    first_running = True
    interrupted = False  # the hedge won while ``first`` was running: we cancelled the caller

    def hedge_done(task: asyncio.Task[T]) -> None:
        nonlocal interrupted
        if first_running and not task.cancelled() and task.exception() is None and final(task.result()):
            interrupted = True
            caller.cancel()

    def launch() -> None:
        nonlocal hedge
        attempt = start_hedge()
        if attempt is not None:
            hedge = loop.create_task(attempt)
            hedge.add_done_callback(hedge_done)

    timer = loop.call_later(delay_s, launch)
    try:
        try:
            result = await first
        except asyncio.CancelledError:
            if interrupted and caller.uncancel() == 0:
                assert hedge is not None
                return hedge.result(), True
            raise
        finally:
            first_running = False
            timer.cancel()
        if hedge is None or final(result):
            return result, False
        return await hedge, True
    finally:
        if hedge is not None and not hedge.done():
            hedge.cancel()
