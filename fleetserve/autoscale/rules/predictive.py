"""The ``predictive`` rule: size the fleet for the request rate expected when a replica started now is ready.

Each tick it

1. fits a robust linear trend to the request rate of the last ``trend_window_s`` (Theil–Sen: the median of the
   slopes between every pair of points, Theil 1950 / Sen 1968; it tolerates up to 29% outliers, so Poisson noise
   and single bursts barely move it) and forecasts the rate ``lead`` seconds ahead, ``lead`` being the replica
   start-up time the actuator measured (``FleetSignals.startup_s``; until then ``startup_s`` configured) plus one
   tick. A slope within twice its standard error of zero is noise and not projected; the slope used is the
   lower of the whole window's and its last third's, so a ramp that stopped is not projected further. A step
   or the start of a ramp (the median of the last three rates above the fitted line by more than four standard
   deviations of a Poisson count and 10%) restarts the history from the points above it; until it holds
   ``min_samples`` again, the forecast is the median of the last three rates, not projected;
2. learns the capacity of one replica online: the highest request rate per ready replica (the lower of the
   trend's level and the tick's rate, so neither a noisy second nor a stale level counts) at which p99 held the
   SLO, then and for ``capacity_confirm_s`` after (latency lags load while a queue builds). It is evidence, not
   an extrapolation: the engines' busy share is not used, because batching makes throughput far from
   proportional to it (padding a full batch to its longest text can halve a CPU replica's throughput, as the
   simulator's profiles show);
3. asks for ``ceil(forecast / (capacity x target_load_percent))`` replicas, and, as a second trigger, for 10% more
   ready replicas (at least one) when the Theil–Sen level of p99 over the last ``latency_window_s`` is above
   ``latency_trigger_percent`` of the SLO and its trend reaches the SLO within ``lead``, while no replica is
   already starting and the forecast leaves no replica spare (before any capacity is learned, it always may).

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
from dataclasses import dataclass

import numpy as np

from fleetserve.autoscale.config import AutoscaleConfig
from fleetserve.autoscale.rules.base import Recommendation
from fleetserve.autoscale.rules.hpa import HpaRule
from fleetserve.autoscale.signals import FleetSignals

_STEP_SIGMAS = 4.0
_STEP_FRACTION = 0.10
_RECENT = 3  # samples whose median tests for a step, and the fewest a line is fitted through
_SIGNIFICANT = 2.0  # standard errors a trend's slope must exceed to be projected
_SHORT_SPAN = 1 / 3  # share of the trend window that must show the same growth


def theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(slope, intercept) of the Theil–Sen line through the points: the median of the pairwise slopes, and the
    median of ``y - slope * x``."""
    dx = x[None, :] - x[:, None]
    dy = y[None, :] - y[:, None]
    upper = dx > 0
    slope = float(np.median(dy[upper] / dx[upper])) if upper.any() else 0.0
    return slope, float(np.median(y - slope * x))


@dataclass(frozen=True, slots=True)
class Forecast:
    """The request rate now (``level``, denoised), its trend, the rate expected ``lead`` ahead, and whether the
    history restarted at a step this tick."""

    level: float
    slope: float
    rate: float
    step: bool


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
        """Keep only the trailing samples above ``threshold`` (at least the last one)."""
        kept = 0
        for _, value in reversed(self.points):
            if value <= threshold:
                break
            kept += 1
        while len(self.points) > max(kept, 1):
            self.points.popleft()

    def fit(self, now: float, span_s: float | None = None) -> tuple[float, float, float]:
        """(slope, level at ``now``, the slope's standard error) of the Theil–Sen line through the samples of the
        last ``span_s`` (all). The error is least squares' for that spread of times, with the residuals' scale
        taken robustly (1.4826 x their median absolute deviation)."""
        points = [(t, v) for t, v in self.points if span_s is None or now - t <= span_s]
        if len(points) < 2:  # no line: flat at the last value
            return 0.0, points[-1][1] if points else 0.0, math.inf
        x = np.fromiter((t - now for t, _ in points), float, len(points))
        y = np.fromiter((v for _, v in points), float, len(points))
        slope, level = theil_sen(x, y)  # x is relative to now: the intercept is the level now
        residuals = y - (level + slope * x)
        scale = 1.4826 * float(np.median(np.abs(residuals - np.median(residuals))))
        spread = float(np.sum((x - x.mean()) ** 2))
        return slope, level, scale / math.sqrt(spread) if spread > 0 else math.inf

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
        self._latencies = _Series(self.config.latency_window_s)
        self._held: deque[tuple[float, int]] = deque()  # (at_s, predictive count) over the scale-down window
        self._hold_s = config.hpa.scale_down_stabilization_s
        self._pending: deque[tuple[float, float]] = deque()  # (at_s, rate per replica) awaiting confirmation
        self.capacity: float | None = None  # requests/s per replica that held the SLO, learned

    def lead_s(self, signals: FleetSignals) -> float:
        """How far ahead to forecast: a replica's measured start-up time plus one tick."""
        startup = signals.startup_s if signals.startup_s is not None else self.config.startup_s
        return startup + self._interval_s

    def forecast(self, signals: FleetSignals) -> Forecast:
        """The rate expected ``lead`` ahead, after adding the snapshot's rate to the history."""
        now = signals.at_s
        lead = self.lead_s(signals)
        self._rates.add(now, signals.request_rate)
        recent = self._rates.recent_median(_RECENT)
        step = False
        if len(self._rates.points) >= self.config.min_samples:
            slope, level, error = self._rates.fit(now)
            noise = math.sqrt(max(level, 1.0) / self._rate_window_s)
            threshold = level + max(_STEP_SIGMAS * noise, _STEP_FRACTION * level)
            if recent <= threshold:
                # Only a trend beyond noise counts (its slope over twice its standard error), and growth must show
                # over the last third of the window too, so a ramp that stopped stops being projected; the forecast
                # starts from the lower of the line and the recent rates for the same reason.
                short_slope, _, _ = self._rates.fit(now, self.config.trend_window_s * _SHORT_SPAN)
                slope = min(slope, short_slope) if abs(slope) > _SIGNIFICANT * error else 0.0
                base = min(level, recent)
                return Forecast(base, slope, max(base, base + slope * lead), False)
            self._rates.keep_above(threshold)  # a new regime: fit from the step on
            step = True
        return Forecast(self._rates.recent_median(_RECENT), 0.0, self._rates.recent_median(_RECENT), step)

    def learn(self, signals: FleetSignals, level: float) -> None:
        """Raise the capacity estimate to a per-replica rate (see the module docstring) once p99
        held the SLO at it and for ``capacity_confirm_s`` after (latency lags load: a queue takes seconds to build);
        a tick above the SLO discards the rates still waiting for confirmation."""
        if signals.p99_s is None:
            return
        if signals.p99_s > self._slo_s:
            self._pending.clear()
            return
        served = min(level, signals.request_rate)  # the level lags a fall in the rate; never credit more than came
        if signals.ready > 0 and served > 0:
            self._pending.append((signals.at_s, served / signals.ready))
        while self._pending and signals.at_s - self._pending[0][0] >= self.config.capacity_confirm_s:
            _, rate = self._pending.popleft()
            self.capacity = max(self.capacity or 0.0, rate)

    def latency_rising(self, signals: FleetSignals) -> bool:
        """The p99 trend's level above the trigger share of the SLO, and its forecast ``lead`` ahead above the
        SLO."""
        if signals.p99_s is None:
            return False
        self._latencies.add(signals.at_s, signals.p99_s)
        if len(self._latencies.points) < self.config.min_samples:
            return False
        slope, level, _ = self._latencies.fit(signals.at_s)
        trigger = self.config.latency_trigger_percent / 100.0 * self._slo_s
        return level >= trigger and level + slope * self.lead_s(signals) > self._slo_s

    def recommend(self, signals: FleetSignals) -> Recommendation:
        c = self.config
        hpa = self.hpa.recommend(signals)
        f = self.forecast(signals)
        self.learn(signals, f.level)
        lead = self.lead_s(signals)
        want, reason, detail = 0, "", ""
        if self.capacity:
            plan = self.capacity * c.target_load_percent / 100.0
            want = math.ceil(f.rate / plan - 1e-9)
            reason = "step" if f.step else "forecast"
            detail = (f"rate {f.level:.1f}/s, trend {f.slope:+.2f}/s per s, lead {lead:.1f} s -> {f.rate:.1f}/s; "
                      f"capacity {self.capacity:.1f}/s x {c.target_load_percent:g}% -> {want}")
        # Rising latency adds replicas unless some are starting or the forecast already leaves spare replicas (a
        # backlog queued before a scale-up keeps p99 rising while it drains).
        if (self.latency_rising(signals) and signals.starting == 0
                and (self.capacity is None or want >= signals.ready)):
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
