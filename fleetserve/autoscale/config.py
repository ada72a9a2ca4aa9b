"""How a fleet autoscales: the rule, the replica range, the SLO and each rule's targets.

The gateway (which runs the rules) and ``fleetserve up`` (which runs the local actuator) both embed
:class:`AutoscaleConfig`, so the flags are the same in both. The ``hpa`` defaults are Kubernetes' HPA v2 defaults
(10% tolerance; scale up by at most max(+100%, +4 replicas) per 15 s; 300 s scale-down stabilisation); see
https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from fleetserve.autoscale.rules.base import ScaleBounds
from fleetserve.options import option, section

RULE_NAMES = ("off", "hpa", "predictive")


def _finite(name: str, value: float, minimum: float = 0.0, *, strict: bool = False) -> None:
    ok = math.isfinite(value) and (value > minimum if strict else value >= minimum)
    if not ok:
        raise ValueError(f"autoscale {name} must be {'>' if strict else '>='} {minimum:g}, got {value}")


@dataclass(frozen=True)
class ScalingPolicy:
    """At most ``value`` replicas (``kind="pods"``) or ``value`` percent of the count at the period's start
    (``kind="percent"``) added or removed per ``period_s`` seconds (an HPA ``HPAScalingPolicy``)."""

    kind: Literal["pods", "percent"]
    value: float
    period_s: float

    def __post_init__(self) -> None:
        if self.kind not in ("pods", "percent"):
            raise ValueError(f"scaling policy kind must be 'pods' or 'percent', got {self.kind!r}")
        _finite("policy value", self.value, strict=True)
        _finite("policy period_s", self.period_s, strict=True)


@dataclass(frozen=True)
class HpaConfig:
    """The ``hpa`` rule's metric targets (0: not a target) and its scaling behaviour.

    ``select`` picks among the policies as HPA's ``selectPolicy`` does: ``max`` allows the largest change,
    ``min`` the smallest, ``disabled`` no change in that direction.
    """

    target_queue_depth: float = option(4.0, "rows queued per ready replica the hpa rule aims for (0: not a target)",
                                       flag="--hpa-target-queue-depth")
    target_gpu_utilization: float = option(70.0, "mean GPU utilisation percent the hpa rule aims for, where "
                                           "replicas report one (0: not a target)",
                                           flag="--hpa-target-gpu-utilization")
    target_inflight: float = option(0.0, "rows running per ready replica the hpa rule aims for, e.g. on CPU "
                                    "(0: not a target)", flag="--hpa-target-inflight")
    tolerance: float = option(0.1, "no change while metric/target is within this fraction of 1",
                              flag="--hpa-tolerance")
    scale_up_stabilization_s: float = option(0.0, "scale up only to the lowest recommendation of this window",
                                             flag="--hpa-scale-up-stabilization-s")
    scale_down_stabilization_s: float = option(300.0, "scale down only to the highest recommendation of this "
                                               "window", flag="--hpa-scale-down-stabilization-s")
    scale_up_policies: tuple[ScalingPolicy, ...] = (ScalingPolicy("percent", 100, 15), ScalingPolicy("pods", 4, 15))
    scale_up_select: Literal["max", "min", "disabled"] = "max"
    scale_down_policies: tuple[ScalingPolicy, ...] = (ScalingPolicy("percent", 100, 15),)
    scale_down_select: Literal["max", "min", "disabled"] = "max"

    def __post_init__(self) -> None:
        for name in ("target_queue_depth", "target_gpu_utilization", "target_inflight", "tolerance",
                     "scale_up_stabilization_s", "scale_down_stabilization_s"):
            _finite(name, getattr(self, name))
        if self.target_gpu_utilization > 100:
            raise ValueError(f"autoscale target_gpu_utilization is a percentage, got {self.target_gpu_utilization}")
        if not (self.target_queue_depth or self.target_gpu_utilization or self.target_inflight):
            raise ValueError("the hpa rule needs at least one target (queue depth, GPU utilisation or in-flight)")
        for select in (self.scale_up_select, self.scale_down_select):
            if select not in ("max", "min", "disabled"):
                raise ValueError(f"scaling policy select must be max, min or disabled, got {select!r}")


@dataclass(frozen=True)
class PredictiveConfig:
    """The ``predictive`` rule's settings; capacity per replica is learned, not configured."""

    trend_window_s: float = option(30.0, "fit the request-rate trend over this many seconds",
                                   flag="--predictive-trend-window-s")
    startup_s: float = option(5.0, "replica start-up time assumed until the actuator reports a measured one",
                              flag="--predictive-startup-s")
    target_load_percent: float = option(100.0, "plan replicas to run at this percent of the highest request rate "
                                        "per replica that held the SLO", flag="--predictive-target-load-percent")
    latency_trigger_percent: float = option(80.0, "p99 above this percent of the SLO and rising adds replicas",
                                            flag="--predictive-latency-trigger-percent")
    latency_window_s: float = 10.0  # fit the p99 trend over this many seconds
    min_samples: int = 5  # ticks of history before a trend is trusted
    capacity_confirm_s: float = 5.0  # p99 must hold the SLO this long after a rate for it to count as capacity
    latency_step_percent: float = 10.0  # the latency trigger adds this share of the ready replicas (at least one)

    def __post_init__(self) -> None:
        _finite("trend_window_s", self.trend_window_s, strict=True)
        _finite("startup_s", self.startup_s)
        _finite("latency_window_s", self.latency_window_s, strict=True)
        for name in ("target_load_percent", "latency_trigger_percent"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= 100):
                raise ValueError(f"autoscale {name} must be in (0, 100], got {value}")
        if self.min_samples < 3:
            raise ValueError(f"autoscale min_samples must be >= 3, got {self.min_samples}")
        _finite("latency_step_percent", self.latency_step_percent, strict=True)
        _finite("capacity_confirm_s", self.capacity_confirm_s)


@dataclass(frozen=True)
class AutoscaleConfig:
    """Autoscaling of a fleet: off by default."""

    rule: str = option("off", "scale the fleet with this rule", flag="--autoscale", choices=RULE_NAMES)
    min_replicas: int = option(1, "fewest replicas (0: scale to zero when idle, hold requests while one starts)")
    max_replicas: int = option(10, "most replicas")
    slo_p99_ms: float = option(250.0, "the p99 latency the fleet must hold (the predictive rule's target)")
    interval_s: float = option(1.0, "evaluate the rule this often", flag="--autoscale-interval-s")
    idle_to_zero_s: float = option(60.0, "with --min-replicas 0: go to zero after this long without a request")
    rate_window_s: float = 1.0  # request rates over this window
    latency_window_s: float = 5.0  # latency percentiles over this window
    history: int = 100  # decisions kept for the admin view
    hpa: HpaConfig = section(HpaConfig, "autoscale: hpa rule")
    predictive: PredictiveConfig = section(PredictiveConfig, "autoscale: predictive rule")

    def __post_init__(self) -> None:
        if self.rule not in RULE_NAMES:
            raise ValueError(f"autoscale rule must be one of {', '.join(RULE_NAMES)}, got {self.rule!r}")
        ScaleBounds(self.min_replicas, self.max_replicas)
        _finite("slo_p99_ms", self.slo_p99_ms, strict=True)
        _finite("interval_s", self.interval_s, strict=True)
        _finite("idle_to_zero_s", self.idle_to_zero_s)
        _finite("rate_window_s", self.rate_window_s, 1.0)
        _finite("latency_window_s", self.latency_window_s, 1.0)
        if self.history < 1:
            raise ValueError(f"autoscale history must be >= 1, got {self.history}")

    @property
    def enabled(self) -> bool:
        return self.rule != "off"

    @property
    def bounds(self) -> ScaleBounds:
        return ScaleBounds(self.min_replicas, self.max_replicas)

    @property
    def slo_p99_s(self) -> float:
        return self.slo_p99_ms / 1000.0
