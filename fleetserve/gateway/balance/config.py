"""Every knob of balancing in one validated config; each component (health checks, outlier ejection, slow
start, retry budget, load signals) gets its own validated part of it."""

from __future__ import annotations

from dataclasses import dataclass

from fleetserve.gateway.balance.health import HealthConfig
from fleetserve.gateway.balance.load import LoadConfig
from fleetserve.gateway.balance.outlier import OutlierConfig
from fleetserve.gateway.balance.policies import DEFAULT_POLICY, POLICIES
from fleetserve.gateway.balance.retry import RetryBudgetConfig
from fleetserve.gateway.balance.slowstart import SlowStartConfig
from fleetserve.options import option


@dataclass(frozen=True)
class BalancerConfig:
    """Every knob of balancing, flat for the CLI; each component gets its own validated part.

    ``replica_max_inflight`` caps the attempts in flight to one replica (Envoy's per-cluster ``max_requests``
    circuit breaker): a replica at its cap is no candidate for :meth:`Balancer.pick`. It is set from the edge
    guards' shedding section (``--replica-max-inflight``); None means no cap.
    """

    policy: str = option(DEFAULT_POLICY, "balancing policy", choices=POLICIES.names)
    health_interval_s: float = option(2.0, "seconds between readiness probes of each backend",
                                      flag="--health-interval")
    health_timeout_s: float = option(3.0, "a readiness probe slower than this fails")
    unhealthy_threshold: int = option(3, "failed probes in a row that take a backend out")
    healthy_threshold: int = option(2, "passed probes in a row that bring it back")
    consecutive_errors: int = option(5, "5xx answers in a row that eject a backend (outlier detection)")
    consecutive_connect_errors: int = 2
    base_ejection_s: float = option(5.0, "first ejection's length; each later one is longer")
    max_ejection_s: float = 300.0
    max_ejection_percent: float = option(50.0, "never eject more than this share of the backends")
    ejection_decay_s: float = 30.0
    panic_threshold_percent: float = option(50.0, "below this share of routable backends, route over all of them")
    slow_start_s: float = option(0.0, "ramp a new or recovered backend's share of traffic up over this long")
    slow_start_aggression: float = 1.0
    slow_start_min_weight_percent: float = 10.0
    retry_budget_percent: float = option(20.0, "retries at most this share of the requests in flight")
    retry_min_concurrency: int = 3
    ewma_tau_s: float = 10.0
    ewma_default_rtt_s: float = 0.05
    report_max_age_s: float = 5.0
    replica_max_inflight: int | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown balancing policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        cap = self.replica_max_inflight
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"replica_max_inflight must be an integer >= 1, got {cap!r}")
        if not 0 <= self.panic_threshold_percent <= 100:
            raise ValueError(f"panic_threshold_percent must be in 0..100, got {self.panic_threshold_percent}")
        self.health_config()
        self.outlier_config()
        self.slow_start_config()
        self.retry_budget_config()
        self.load_config()

    def health_config(self) -> HealthConfig:
        return HealthConfig(
            self.health_interval_s, self.health_timeout_s, self.unhealthy_threshold, self.healthy_threshold
        )

    def outlier_config(self) -> OutlierConfig:
        return OutlierConfig(
            self.consecutive_errors,
            self.consecutive_connect_errors,
            self.base_ejection_s,
            self.max_ejection_s,
            self.max_ejection_percent,
            self.ejection_decay_s,
        )

    def slow_start_config(self) -> SlowStartConfig:
        return SlowStartConfig(self.slow_start_s, self.slow_start_aggression, self.slow_start_min_weight_percent)

    def retry_budget_config(self) -> RetryBudgetConfig:
        return RetryBudgetConfig(self.retry_budget_percent, self.retry_min_concurrency)

    def load_config(self) -> LoadConfig:
        return LoadConfig(self.ewma_tau_s, self.ewma_default_rtt_s, self.report_max_age_s)
