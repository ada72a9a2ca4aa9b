"""The ``predictive`` rule: size the fleet for the request rate expected when a replica started now is ready.

Each tick it

1. fits a robust linear trend to the request rate of the last ``trend_window_s`` (Theil–Sen: the median of the
   slopes between every pair of points, Sen 1968 / Theil 1950; it tolerates up to 29% outliers, so Poisson noise
   and single bursts barely move it) and forecasts the rate ``lead`` seconds ahead, ``lead`` being the replica
   start-up time the actuator measured (``FleetSignals.startup_s``; until then ``startup_s`` configured) plus one
   tick. The slope used is the lower of the whole window's and its last third's, so a ramp that stopped is not
   projected further. A step or the start of a ramp (the median of the last three rates above the fitted line by
   more than four standard deviations of a Poisson count and 10%) restarts the fit from the points above it;
2. learns the capacity of one replica online: on ticks whose p99 held the SLO, the throughput per ready replica
   divided by the replicas' engine busy share (ORCA ``application_utilization``) estimates what a fully busy
   replica serves, smoothed by an exponential moving average; without utilisation reports, the highest
   throughput per replica seen within the SLO is used;
3. asks for ``ceil(forecast / (capacity x target_load_percent))`` replicas, and, as a second trigger, for 10% more
   ready replicas (at least one) when p99 is above ``latency_trigger_percent`` of the SLO and its Theil–Sen trend
   over the last ``latency_window_s`` rises, while no replica is already starting.

The answer is ``max(hpa, predictive)``, the ``hpa`` rule run beside it with the same settings. The predictive
count is held at the highest of its recommendations over the hpa scale-down stabilisation window, so the fleet
never shrinks faster than ``hpa`` alone would let it, and noise cannot make it flap.

The rule is the article's "when the average latency of the last 30 s keeps rising and QPS growth passes a
threshold, add pods before the CPU is saturated", with the threshold replaced by a forecast over the fleet's own
start-up time.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from fleetserve.autoscale.config import AutoscaleConfig
from fleetserve.autoscale.rules.base import Recommendation
from fleetserve.autoscale.rules.hpa import HpaRule
from fleetserve.autoscale.signals import FleetSignals

_STEP_SIGMAS = 4.0
_STEP_FRACTION = 0.10
_RECENT = 3  # samples whose median tests for a step, and the fewest a line is fitted through
_SHORT_SPAN = 1 / 3  # share of the trend window that must show the same growth


def theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(slope, intercept) of the Theil–Sen line through the points: the median of the pairwise slopes, and the
    median of ``y - slope * x``."""
    dx = x[None, :] - x[:, None]
    dy = y[None, :] - y[:, None]
    upper = dx > 0
    slope = float(np.median(dy[upper] / dx[upper])) if upper.any() else 0.0
    return slope, float(np.median(y - slope * x))


class _Series:
    """(at_s, value) samples of the last ``window_s`` seconds."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.points: deque[tuple[float, float]] = deque()

    def add(self, at_s: float, value: float) -> None:
        self.points.append((at_s, value))
        while self.points and at_s - self.points[0][0] > self.window_s:
            self.points.popleft()

    def keep_above(self, threshold: float) -> None:
        """Keep only the trailing samples above ``threshold``."""
        kept = 0
        for _, value in reversed(self.points):
            if value <= threshold:
                break
            kept += 1
        while len(self.points) > kept:
            self.points.popleft()

    def fit(self, now: float, span_s: float | None = None) -> tuple[float, float]:
        """(slope, level at ``now``) of the Theil–Sen line through the samples of the last ``span_s`` (all)."""
        points = [(t, v) for t, v in self.points if span_s is None or now - t <= span_s]
        x = np.fromiter((t - now for t, _ in points), float, len(points))
        y = np.fromiter((v for _, v in points), float, len(points))
        return theil_sen(x, y)  # x is relative to now: the intercept is the level now

    def recent_median(self, n: int) -> float:
        return float(np.median([v for _, v in list(self.points)[-n:]]))


class PredictiveRule:
    """See the module docstring. Time comes only from ``FleetSignals.at_s``."""

    def __init__(self, config: AutoscaleConfig) -> None:
        self.config = config.predictive
        self.hpa = HpaRule(config.hpa)
        self._slo_s = config.slo_p99_s
        self._interval_s = config.interval_s
        self._rate_window_s = config.rate_window_s
        self._rates = _Series(self.config.trend_window_s)
        self._stepped = False  # the rate history restarted at a step and has fewer than min_samples points
        self._latencies = _Series(self.config.latency_window_s)
        self._held: deque[tuple[float, int]] = deque()  # (at_s, predictive count) over the scale-down window
        self._hold_s = config.hpa.scale_down_stabilization_s
        self.capacity: float | None = None  # requests/s one fully busy replica serves, learned

    def lead_s(self, signals: FleetSignals) -> float:
        """How far ahead to forecast: a replica's measured start-up time plus one tick."""
        startup = signals.startup_s if signals.startup_s is not None else self.config.startup_s
        return startup + self._interval_s

    def forecast(self, signals: FleetSignals) -> tuple[float, float, bool]:
        """(forecast rate ``lead`` ahead, the trend's slope, whether a step was detected) after adding the
        snapshot's rate to the history."""
        now = signals.at_s
        lead = self.lead_s(signals)
        self._rates.add(now, signals.request_rate)
        recent = self._rates.recent_median(_RECENT)
        step = False
        if len(self._rates.points) >= self.config.min_samples:
            self._stepped = False
            slope, level = self._rates.fit(now)
            noise = math.sqrt(max(level, 1.0) / self._rate_window_s)
            threshold = level + max(_STEP_SIGMAS * noise, _STEP_FRACTION * level)
            if recent <= threshold:
                # Growth must show over the last third of the window too, so a ramp that stopped stops being
                # projected; the forecast starts from the lower of the line and the recent rates for the same reason.
                short_slope, _ = self._rates.fit(now, self.config.trend_window_s * _SHORT_SPAN)
                slope = min(slope, short_slope)
                base = min(level, recent)
                return max(base, base + slope * lead), slope, False
            self._rates.keep_above(threshold)  # a new regime: fit from the step on
            self._stepped = step = True
            recent = self._rates.recent_median(_RECENT)
        if not self._stepped or len(self._rates.points) < _RECENT:
            return recent, 0.0, step
        # Just after a step, before the window refills: the line through the points since, never projected down.
        slope, level = self._rates.fit(now)
        base = min(level, recent)
        return base + max(slope, 0.0) * lead, slope, step

    def learn(self, signals: FleetSignals) -> None:
        """Update the capacity estimate from a tick whose p99 held the SLO."""
        if signals.ready <= 0 or signals.p99_s is None or signals.p99_s > self._slo_s:
            return
        ready = [r for r in signals.replicas if r.ready]
        served = sum(r.request_rate for r in ready) if ready else signals.request_rate
        per_replica = served / signals.ready
        if per_replica <= 0:
            return
        u = signals.utilization
        if u is not None and u >= 0.05:
            sample = per_replica / min(u, 1.0)
            a = self.config.capacity_smoothing
            self.capacity = sample if self.capacity is None else (1 - a) * self.capacity + a * sample
        elif u is None:
            self.capacity = max(self.capacity or 0.0, per_replica)

    def latency_rising(self, signals: FleetSignals) -> bool:
        """p99 above the trigger share of the SLO and trending up."""
        if signals.p99_s is None:
            return False
        self._latencies.add(signals.at_s, signals.p99_s)
        if signals.p99_s < self.config.latency_trigger_percent / 100.0 * self._slo_s:
            return False
        if len(self._latencies.points) < self.config.min_samples:
            return False
        slope, _ = self._latencies.fit(signals.at_s)
        return slope > 0

    def recommend(self, signals: FleetSignals) -> Recommendation:
        c = self.config
        hpa = self.hpa.recommend(signals)
        rate, slope, step = self.forecast(signals)
        self.learn(signals)
        lead = self.lead_s(signals)
        want, reason, detail = 0, "", ""
        if self.capacity:
            plan = self.capacity * c.target_load_percent / 100.0
            want = math.ceil(rate / plan - 1e-9)
            reason = "step" if step else "forecast"
            detail = (f"rate {signals.request_rate:.1f}/s, trend {slope:+.2f}/s per s, lead {lead:.1f} s -> "
                      f"{rate:.1f}/s; capacity {self.capacity:.1f}/s x {c.target_load_percent:g}% -> {want}")
        if self.latency_rising(signals) and signals.starting == 0:
            bump = signals.ready + max(1, math.ceil(signals.ready * c.latency_step_percent / 100.0))
            if bump > want:
                want, reason = bump, "latency_trend"
                detail = (f"p99 {signals.p99_s * 1000 if signals.p99_s else 0:.0f} ms rising toward the SLO "
                          f"{self._slo_s * 1000:.0f} ms -> {want}")
        now = signals.at_s
        self._held.append((now, want))
        while self._held and now - self._held[0][0] > self._hold_s:
            self._held.popleft()
        held = max(w for _, w in self._held)
        if held > want:
            reason, detail = "stabilized", f"{detail}; held at {held} (scale-down window)"
        if held > hpa.replicas:
            return Recommendation(held, reason, detail)
        return Recommendation(hpa.replicas, hpa.reason, f"{hpa.detail}; predictive {held}")
