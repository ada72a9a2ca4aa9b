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

Replicas also report their own load on every response, in ORCA's ``endpoint-load-metrics`` form
(:mod:`fleetserve.wire`). A report fades linearly to nothing over ``report_max_age_s``;
:meth:`ReportedLoad.freshness` tells policies how much to trust it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleetserve.gateway.balance.slowstart import SlowStartConfig, SlowStartRamp
from fleetserve.wire import LoadReport, parse_load_report

_EWMA_FLOOR_S = 1e-4
_NO_REPORT = LoadReport()


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


class ReportedLoad:
    """The replica's own view of its load, from the last response that carried a valid report."""

    __slots__ = ("_max_age", "last", "reported_at")

    def __init__(self, max_age_s: float) -> None:
        self._max_age = max_age_s
        self.last = _NO_REPORT
        self.reported_at: float | None = None

    def update(self, text: str, now: float) -> bool:
        """Take the ``endpoint-load-metrics`` value ``text``; False when it is not a valid report."""
        report = parse_load_report(text)
        if report is None:
            return False
        self.last = report
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

    def report(self, text: str, now: float) -> None:
        """Take the load report (``endpoint-load-metrics`` value) a response carried."""
        if self.reported.update(text, now):
            self.sent_since_report = 0

    def describe(self, now: float) -> dict[str, object]:
        """The load fields of an endpoint's row in ``GET /gateway/backends``."""
        age = self.reported.age(now)
        has_report = age is not None
        reported = self.reported.last
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
