"""All load signals of one endpoint, its weight and slow-start ramp; and the :class:`Cost` protocol.

Signals are small objects the balancer updates when a request starts or finishes; policies only read
them, passing the current time in (the clock is injected, never read here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from fleetserve.gateway.balance.load.peak_ewma import PeakEwma
from fleetserve.gateway.balance.load.reported import ReportedLoad
from fleetserve.gateway.balance.slowstart import SlowStartConfig, SlowStartRamp


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


class Cost(Protocol):
    """What sending the next request to ``load``'s endpoint costs (lower is better), compared with ``rival``'s;
    only peak-EWMA looks at the rival (to stand in for an estimate not measured yet)."""

    def __call__(self, load: EndpointLoad, rival: EndpointLoad, now: float) -> float: ...


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
            "reported_utilization": reported.application_utilization if has_report else None,
            "reported_gpu_utilization": reported.gpu_utilization if has_report else None,
            "reported_gpu_throttled": reported.gpu_throttled if has_report else None,
            "report_age_s": None if age is None else round(age, 3),
        }
