"""The fleet as the dashboard shows it: one frame per second, built from the gateway's own state.

Nothing here is on the request path. Once per :meth:`FleetSampler.tick` the sampler reads the gateway's
cumulative counts, the very ones ``/metrics`` exposes (latency histograms as their plain per-bucket counts,
counters through ``prometheus_client``'s ``collect()``), and the balancer's per-replica snapshot (health,
ejections, pending requests, the load each replica last reported). Rates and quantiles come from the
difference between this reading and the one ``window_s`` earlier, the way Prometheus' ``rate()`` and
``histogram_quantile()`` compute them over that range, so the dashboard and a Grafana panel agree.
Quantiles interpolate linearly inside a bucket (``histogram_quantile``'s rule); the gateway's buckets are
at most 1.5x apart between 1 and 100 ms.

The last ``history_s`` frames are kept as compact chart points, so a page opened now draws the last
minutes at once; a poll passes the time of the newest point it has and gets only newer ones.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client.metrics_core import Metric

from fleetserve.gateway.metrics import NO_BACKEND, GatewayMetrics

_REJECTED = "fleetserve_gateway_rejected_total"
# The mode the page shows for a gateway without an autoscaler.
AUTOSCALE_OFF = "off"


class FleetState(Protocol):
    """What the sampler reads of the balancer (``Balancer`` satisfies it)."""

    @property
    def panic(self) -> bool: ...

    @property
    def active_requests(self) -> int: ...

    def snapshot(self) -> list[dict[str, object]]: ...


class AutoscaleView(Protocol):
    """What the sampler reads of the gateway's autoscaler (``GatewayAutoscaler`` satisfies it)."""

    def summary(self) -> dict[str, object]:
        """``rule``, ``desired`` (None before the first tick), ``ready``, ``starting``, ``draining``, ``held``."""
        ...


def quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float | None:
    """The ``q`` quantile of a histogram given as cumulative counts per upper bound (the last one +Inf),
    interpolated linearly inside its bucket; the highest finite bound when it falls in the +Inf bucket;
    None without observations. Prometheus' ``histogram_quantile`` rule."""
    total = cumulative[-1] if cumulative else 0.0
    if total <= 0:
        return None
    rank = q * total
    for i, count in enumerate(cumulative):
        if count >= rank:
            if math.isinf(bounds[i]):
                return bounds[i - 1] if i > 0 else None
            lower, below = (bounds[i - 1], cumulative[i - 1]) if i > 0 else (0.0, 0.0)
            inside = count - below
            return bounds[i] if inside <= 0 else lower + (bounds[i] - lower) * (rank - below) / inside
    return None


@dataclass
class Reading:
    """The gateway's cumulative counts at one moment (monotonic ``at``, ``wall`` for display)."""

    at: float
    wall: float
    requests: dict[str, float] = field(default_factory=dict)  # backend -> answers
    errors: dict[str, float] = field(default_factory=dict)  # backend -> 5xx answers
    upstream: dict[str, list[int]] = field(default_factory=dict)  # backend -> observations per bucket
    end_to_end: list[int] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)  # fleet-wide: retries, hedges_won, ...


def _total(families: Iterable[Metric], by: str | None = None) -> dict[str, float]:
    """Counter families summed, by the value of label ``by`` (or all under ``""``); ``_total`` samples only."""
    sums: dict[str, float] = {}
    for family in families:
        for s in family.samples:
            if s.name.endswith("_total"):
                key = s.labels.get(by, "") if by else ""
                sums[key] = sums.get(key, 0.0) + s.value
    return sums


def read(metrics: GatewayMetrics, at: float, wall: float) -> Reading:
    """One :class:`Reading` of ``metrics`` (on the gateway's event-loop thread)."""
    reading = Reading(at, wall)
    for family in metrics.requests.collect():
        for s in family.samples:
            if s.name.endswith("_total"):
                backend = s.labels["backend"]
                reading.requests[backend] = reading.requests.get(backend, 0.0) + s.value
                if s.labels["code"].startswith("5"):
                    reading.errors[backend] = reading.errors.get(backend, 0.0) + s.value
    reading.upstream = {labels[0]: list(series.counts) for labels, series in metrics.upstream_duration.items()}
    reading.end_to_end = list(metrics.request_duration.series().counts)
    hedges = _total(metrics.hedges.collect(), "outcome")
    reading.counters = {
        "retries": _total(metrics.retries.collect()).get("", 0.0),
        "retry_budget_exhausted": _total(metrics.retry_budget_exhausted.collect()).get("", 0.0),
        "hedges_won": hedges.get("won", 0.0),
        "hedges_lost": hedges.get("lost", 0.0),
        "hedges_skipped": sum(_total(metrics.hedges_skipped.collect()).values()),
        "rejected": sum(_total(metrics.registry.restricted_registry([_REJECTED]).collect()).values()),
    }
    return reading


def _delta(now: float, then: float | None) -> float:
    # A counter that went down was reset (the backend left and came back): count from zero.
    return now if then is None or now < then else now - then


def _cumulative_delta(now: Sequence[int], then: Sequence[int] | None) -> list[int]:
    """Cumulative counts per bucket of the observations between two readings of one series."""
    if then is not None and len(then) == len(now):
        deltas = [n - t for n, t in zip(now, then, strict=True)]
        if min(deltas) >= 0:
            return list(itertools.accumulate(deltas))
    return list(itertools.accumulate(now))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _rate(count: float, seconds: float) -> float:
    return round(count / seconds, 3) if seconds > 0 else 0.0


class FleetSampler:
    """Takes a reading per :meth:`tick`, keeps the frames' chart points, and answers the dashboard's polls."""

    def __init__(self, metrics: GatewayMetrics, fleet: FleetState, policy: str, *,
                 window_s: float = 5.0, history_s: float = 120.0, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 autoscale: AutoscaleView | None = None) -> None:
        if not 0 < interval_s <= window_s <= history_s:
            raise ValueError("need 0 < interval_s <= window_s <= history_s")
        self._metrics = metrics
        self._fleet = fleet
        self._policy = policy
        self._autoscale = autoscale
        # Both latency histograms share their bounds; the last bucket is +Inf.
        self._bounds = [*metrics.request_duration.bounds, math.inf]
        self._window = window_s
        self.interval_s = interval_s
        self._clock, self._wall = clock, wall
        self._readings: deque[Reading] = deque(maxlen=int(window_s / interval_s) + 2)
        self._points: deque[dict[str, Any]] = deque(maxlen=int(history_s / interval_s))
        self._frame: dict[str, object] | None = None

    def tick(self) -> dict[str, object]:
        """Read the gateway now and build the current frame (also returned)."""
        reading = read(self._metrics, self._clock(), self._wall())
        base = self._base(reading.at)
        self._readings.append(reading)
        rows, fleet = self._replicas(reading, base), self._totals(reading, base)
        scaling = self._scaling(rows)
        self._frame = {
            "t": round(reading.wall, 3),
            "window_s": round(reading.at - base.at, 3) if base is not None else 0.0,
            "pid": os.getpid(),
            "policy": self._policy,
            "panic": self._fleet.panic,
            "active_requests": self._fleet.active_requests,
            "fleet": fleet,
            "replicas": rows,
            "autoscale": scaling,
        }
        self._points.append({"t": self._frame["t"], "rps": fleet["rps"], "p50_ms": fleet["p50_ms"],
                             "p99_ms": fleet["p99_ms"], "replicas": {row["url"]: row["rps"] for row in rows},
                             "desired": scaling["desired"], "actual": scaling["actual"]})
        return self._frame

    def _scaling(self, rows: list[dict[str, object]]) -> dict[str, Any]:
        """Desired vs actual replicas: the autoscaler's count and the replicas it saw ready (without one, the
        replicas the balancer has)."""
        healthy = sum(1 for row in rows if row["state"] == "healthy")
        if self._autoscale is None:
            return {"mode": AUTOSCALE_OFF, "desired": None, "actual": len(rows), "healthy": healthy}
        summary = self._autoscale.summary()
        return {"mode": summary["rule"], "desired": summary["desired"], "actual": summary["ready"],
                "healthy": healthy, "starting": summary["starting"], "draining": summary["draining"],
                "held": summary["held"]}

    def _base(self, now: float) -> Reading | None:
        """The newest earlier reading about ``window_s`` old (half a tick of timer jitter allowed), else the
        oldest kept (a young sampler)."""
        for reading in reversed(self._readings):
            if now - reading.at >= self._window - self.interval_s / 2:
                return reading
        return self._readings[0] if self._readings else None

    def _replicas(self, now: Reading, base: Reading | None) -> list[dict[str, object]]:
        span = now.at - base.at if base is not None else 0.0
        then = base if base is not None else Reading(now.at, now.wall)
        answered = {b: _delta(v, then.requests.get(b)) for b, v in now.requests.items() if b != NO_BACKEND}
        total = sum(answered.values())
        rows = []
        for row in self._fleet.snapshot():
            url = str(row["url"])
            count = answered.get(url, 0.0)
            buckets = _cumulative_delta(now.upstream[url], then.upstream.get(url)) if url in now.upstream else []
            rows.append({
                **row,
                "rps": _rate(count, span),
                "share": round(count / total, 4) if total else 0.0,
                "error_rps": _rate(_delta(now.errors.get(url, 0.0), then.errors.get(url)), span),
                "p50_ms": _ms(quantile(0.5, self._bounds, buckets)),
                "p99_ms": _ms(quantile(0.99, self._bounds, buckets)),
            })
        return rows

    def _totals(self, now: Reading, base: Reading | None) -> dict[str, float | None]:
        span = now.at - base.at if base is not None else 0.0
        then = base if base is not None else Reading(now.at, now.wall)
        end_to_end = _cumulative_delta(now.end_to_end, then.end_to_end or None)
        errors = sum(_delta(v, then.errors.get(b)) for b, v in now.errors.items())
        totals: dict[str, float | None] = {
            "rps": _rate(end_to_end[-1] if end_to_end else 0.0, span),
            "error_rps": _rate(errors, span),
            "p50_ms": _ms(quantile(0.5, self._bounds, end_to_end)),
            "p99_ms": _ms(quantile(0.99, self._bounds, end_to_end)),
        }
        for name, value in now.counters.items():
            totals[f"{name}_ps"] = _rate(_delta(value, then.counters.get(name)), span)
        return totals

    def payload(self, since: float | None = None) -> dict[str, object]:
        """The latest frame and the chart points newer than ``since`` (all kept points when None)."""
        frame = self._frame if self._frame is not None else self.tick()
        points = [p for p in self._points if since is None or p["t"] > since]
        return {"frame": frame, "points": points, "interval_s": self.interval_s}

