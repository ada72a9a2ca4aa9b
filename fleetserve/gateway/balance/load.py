"""Load signals the balancing policies read: pending count, peak-EWMA latency, replica-reported load.

Each signal is a small object the balancer updates when a request starts or finishes; policies only
read them, passing the current time in (the clock is injected, never read here).

Peak-EWMA follows Finagle's ``PeakEwma`` as ported to tower (``tower/src/load/peak_ewma.rs``): a
sample above the estimate replaces it at once (the peak), a lower one pulls the estimate towards
itself by ``1 - exp(-elapsed / tau)``, and between samples the estimate decays towards zero so an
endpoint that went quiet becomes attractive again. Cost = estimate × (pending + 1). Unlike tower,
reading never mutates the estimate, the first real sample replaces the default outright (so a new
fast replica is not held back for several tau), and the decay stops at a small floor: an estimate
that decayed to ~0 would make ``pending + 1`` irrelevant and send a whole burst to one idle replica.

Failures are penalised: a failed request (5xx or connect error) counts as a sample of at least twice
the current estimate, so a replica that fails fast looks slower with every failure instead of looking
like the fastest one in the fleet.

Replicas also report their own load on every response (headers below). A report fades linearly to
nothing over ``report_max_age_s``; :meth:`ReportedLoad.freshness` tells policies how much to trust it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from fleetserve.gateway.balance.slowstart import SlowStartConfig, SlowStartRamp

HEADER_QUEUE_DEPTH = "X-Fleetserve-Queue-Depth"
HEADER_INFLIGHT = "X-Fleetserve-Inflight"
HEADER_GPU_UTILIZATION = "X-Fleetserve-Gpu-Utilization"
HEADER_GPU_THROTTLED = "X-Fleetserve-Gpu-Throttled"

# Reported counts above this are treated as this: a garbage header must not overflow a score.
_MAX_REPORTED_COUNT = 1_000_000
_EWMA_FLOOR_S = 1e-4


@dataclass(frozen=True)
class LoadConfig:
    ewma_tau_s: float = 10.0
    ewma_default_rtt_s: float = 0.05
    report_max_age_s: float = 5.0

    def __post_init__(self) -> None:
        if self.ewma_tau_s <= 0:
            raise ValueError(f"ewma_tau_s must be > 0, got {self.ewma_tau_s}")
        if self.ewma_default_rtt_s <= 0:
            raise ValueError(f"ewma_default_rtt_s must be > 0, got {self.ewma_default_rtt_s}")
        if self.report_max_age_s <= 0:
            raise ValueError(f"report_max_age_s must be > 0, got {self.report_max_age_s}")


class PeakEwma:
    """Peak-sensitive, time-decayed latency estimate in seconds."""

    __slots__ = ("_estimate", "_measured", "_tau", "_updated_at")

    def __init__(self, tau_s: float, initial_s: float, now: float) -> None:
        self._tau = tau_s
        self._estimate = initial_s
        self._updated_at = now
        self._measured = False

    @property
    def measured(self) -> bool:
        """Whether any real sample has replaced the default since creation or the last reset."""
        return self._measured

    def estimate(self, now: float) -> float:
        """The estimate decayed to ``now`` (towards zero, never below a small floor)."""
        elapsed = now - self._updated_at
        if elapsed <= 0:
            return self._estimate
        return max(_EWMA_FLOOR_S, self._estimate * math.exp(-elapsed / self._tau))

    def observe(self, latency_s: float, now: float) -> None:
        current = self._estimate
        if latency_s > current or not self._measured:
            # The default only stands in until the first measurement, which replaces it outright.
            self._measured = True
            self._estimate = latency_s
        else:
            decay = math.exp(-max(0.0, now - self._updated_at) / self._tau)
            self._estimate = current * decay + latency_s * (1.0 - decay)
        self._updated_at = now

    def observe_failure(self, latency_s: float, now: float) -> None:
        self.observe(max(latency_s, 2.0 * self.estimate(now)), now)

    def reset(self, initial_s: float, now: float) -> None:
        """Forget all samples: back to ``initial_s`` until the next measurement."""
        self._estimate = initial_s
        self._updated_at = now
        self._measured = False


def _header(headers: Mapping[str, str], name: str) -> str | None:
    # aiohttp's CIMultiDict matches any case; a plain dict from tests or gRPC metadata is lowercase.
    value = headers.get(name)
    return value if value is not None else headers.get(name.lower())


def _parse_count(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        return None
    return min(value, _MAX_REPORTED_COUNT) if value >= 0 else None


def _parse_ratio(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return min(1.0, max(0.0, value)) if math.isfinite(value) else None


def _parse_flag(text: str | None) -> bool | None:
    if text is None:
        return None
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes"):
        return True
    if lowered in ("0", "false", "no"):
        return False
    return None


class ReportedLoad:
    """The replica's own view of its load, from the last response that carried it."""

    __slots__ = (
        "_max_age",
        "gpu_throttled",
        "gpu_utilization",
        "inflight",
        "queue_depth",
        "reported_at",
    )

    def __init__(self, max_age_s: float) -> None:
        self._max_age = max_age_s
        self.queue_depth = 0
        self.inflight = 0
        self.gpu_utilization = 0.0
        self.gpu_throttled = False
        self.reported_at: float | None = None

    def update(self, headers: Mapping[str, str], now: float) -> bool:
        """Take whatever valid load headers ``headers`` carries; False when it carried none."""
        queue = _parse_count(_header(headers, HEADER_QUEUE_DEPTH))
        inflight = _parse_count(_header(headers, HEADER_INFLIGHT))
        util = _parse_ratio(_header(headers, HEADER_GPU_UTILIZATION))
        throttled = _parse_flag(_header(headers, HEADER_GPU_THROTTLED))
        if queue is None and inflight is None and util is None and throttled is None:
            return False
        if queue is not None:
            self.queue_depth = queue
        if inflight is not None:
            self.inflight = inflight
        if util is not None:
            self.gpu_utilization = util
        if throttled is not None:
            self.gpu_throttled = throttled
        self.reported_at = now
        return True

    def age(self, now: float) -> float | None:
        return None if self.reported_at is None else max(0.0, now - self.reported_at)

    def freshness(self, now: float) -> float:
        """1.0 for a report taken just now, fading linearly to 0.0 at ``max_age_s`` (and for none)."""
        if self.reported_at is None:
            return 0.0
        return max(0.0, 1.0 - (now - self.reported_at) / self._max_age)


class EndpointLoad:
    """All load signals of one endpoint, plus its weight and slow-start ramp."""

    __slots__ = ("_default_rtt", "ewma", "pending", "ramp", "reported", "sent_since_report", "weight")

    def __init__(self, weight: float, config: LoadConfig, slow_start: SlowStartConfig, now: float) -> None:
        self._default_rtt = config.ewma_default_rtt_s
        self.weight = weight
        self.pending = 0
        # Requests started after the last report, which that report cannot contain yet.
        self.sent_since_report = 0
        self.ewma = PeakEwma(config.ewma_tau_s, config.ewma_default_rtt_s, now)
        self.reported = ReportedLoad(config.report_max_age_s)
        self.ramp = SlowStartRamp(slow_start)

    def admitted(self, now: float) -> None:
        """The endpoint (re)joins the routable set: restart slow start and forget stale latency.

        While it was out (ejected, unhealthy, waiting for a first probe) nothing refreshed its
        estimate, which decayed towards zero; kept, it would make the endpoint look far faster
        than the rest and draw a burst before its first answer came back.
        """
        self.ramp.restart(now)
        self.ewma.reset(self._default_rtt, now)

    def effective_weight(self, now: float) -> float:
        """Configured weight scaled by the slow-start ramp."""
        return self.weight * self.ramp.factor(now)

    def ewma_cost(self, now: float) -> float:
        """Peak-EWMA cost: estimated latency × (pending + 1), in seconds of queued work."""
        return self.ewma.estimate(now) * (self.pending + 1)

    def outpaced(self, latency_s: float, now: float) -> None:
        """A hedged copy on another replica answered while this one, asked ``latency_s`` ago, had not: its
        attempt was cancelled, so no real latency will ever arrive. Count it like a failure in the
        estimate (at least double), or the balancer would learn only the cancelled attempt's lower bound
        and keep sending traffic into the stall the hedge just escaped. Outlier ejection never sees it."""
        self.ewma.observe_failure(latency_s, now)

    def unreported_pending(self) -> int:
        """Requests in flight that the last report cannot contain (sent after it was taken)."""
        return min(self.sent_since_report, self.pending)

    def report(self, headers: Mapping[str, str], now: float) -> None:
        """Take the load a response reported, if it carried any."""
        if self.reported.update(headers, now):
            self.sent_since_report = 0

    def describe(self, now: float) -> dict[str, object]:
        """The load fields of an endpoint's row in ``GET /gateway/backends``."""
        reported = self.reported
        age = reported.age(now)
        has_report = age is not None
        return {
            "effective_weight": round(self.effective_weight(now), 4),
            "slow_start": self.ramp.active(now),
            "pending": self.pending,
            "ewma_ms": round(self.ewma.estimate(now) * 1000.0, 3),
            "reported_queue_depth": reported.queue_depth if has_report else None,
            "reported_inflight": reported.inflight if has_report else None,
            "reported_gpu_utilization": reported.gpu_utilization if has_report else None,
            "reported_gpu_throttled": reported.gpu_throttled if has_report else None,
            "report_age_s": None if age is None else round(age, 3),
        }
