"""The fleet as the dashboard shows it: one frame per second, built from the gateway's own state.

Nothing here is on the request path. Once per :meth:`FleetSampler.tick` the sampler reads the gateway's
cumulative Prometheus counters and histograms (the same ones ``/metrics`` exposes, through
``prometheus_client``'s public ``collect()``) and the balancer's per-replica snapshot (health, ejection,
pending requests, the load each replica last reported). Rates and quantiles come from the difference
between this reading and the one ``window_s`` earlier, the way Prometheus' ``rate()`` and
``histogram_quantile()`` would compute them over that range: the dashboard and a Grafana panel agree, and
the per-request cost of the dashboard is nil. Quantiles interpolate linearly inside a bucket
(``histogram_quantile``'s rule); the gateway's buckets are at most 1.5x apart between 1 and 100 ms.

The last ``history_s`` frames are kept as compact chart points, so a page opened now draws the last
minutes at once; a poll passes the time of the newest point it has and gets only newer ones.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from fleetserve.gateway.metrics import NO_BACKEND, GatewayMetrics

_REQUESTS = "fleetserve_gateway_requests_total"
_UPSTREAM = "fleetserve_gateway_upstream_duration_seconds_bucket"
_END_TO_END = "fleetserve_gateway_request_duration_seconds_bucket"
_EJECTIONS = "fleetserve_gateway_ejections_total"
_HEDGES = "fleetserve_gateway_hedges_total"
_HEDGES_SKIPPED = "fleetserve_gateway_hedges_skipped_total"
_RETRIES = "fleetserve_gateway_retries_total"
_RETRY_BUDGET = "fleetserve_gateway_retry_budget_exhausted_total"
_REJECTED = "fleetserve_gateway_rejected_total"
_SAMPLES = (_REQUESTS, _UPSTREAM, _END_TO_END, _EJECTIONS, _HEDGES, _HEDGES_SKIPPED, _RETRIES, _RETRY_BUDGET,
            _REJECTED)
# What the page shows until an autoscaler reports to the gateway.
AUTOSCALE_OFF = "off"


class FleetState(Protocol):
    """What the sampler reads of the balancer (``Balancer`` satisfies it)."""

    @property
    def panic(self) -> bool: ...

    @property
    def active_requests(self) -> int: ...

    def snapshot(self) -> list[dict[str, object]]: ...


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
    """The gateway's cumulative counters at one moment (monotonic ``at``, ``wall`` for display)."""

    at: float
    wall: float
    requests: dict[str, float] = field(default_factory=dict)  # backend -> answers
    errors: dict[str, float] = field(default_factory=dict)  # backend -> 5xx answers
    upstream: dict[str, list[float]] = field(default_factory=dict)  # backend -> cumulative bucket counts
    end_to_end: list[float] = field(default_factory=list)
    ejections: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)  # fleet-wide: retries, hedges_won, ...


def read(registry: CollectorRegistry, at: float, wall: float) -> Reading:
    """One :class:`Reading` of the gateway metrics in ``registry``."""
    reading = Reading(at, wall)
    counters = reading.counters
    for name in ("retries", "retry_budget_exhausted", "hedges_won", "hedges_lost", "hedges_skipped", "rejected"):
        counters[name] = 0.0
    for family in registry.restricted_registry(_SAMPLES).collect():
        for s in family.samples:
            name, labels, value = s.name, s.labels, s.value
            if name == _REQUESTS:
                backend = labels["backend"]
                reading.requests[backend] = reading.requests.get(backend, 0.0) + value
                if labels["code"].startswith("5"):
                    reading.errors[backend] = reading.errors.get(backend, 0.0) + value
            elif name == _UPSTREAM:
                reading.upstream.setdefault(labels["backend"], []).append(value)
            elif name == _END_TO_END:
                reading.end_to_end.append(value)
            elif name == _EJECTIONS:
                reading.ejections[labels["backend"]] = value
            elif name == _HEDGES:
                counters[f"hedges_{labels['outcome']}"] = counters.get(f"hedges_{labels['outcome']}", 0.0) + value
            elif name == _HEDGES_SKIPPED:
                counters["hedges_skipped"] += value
            elif name == _RETRIES:
                counters["retries"] += value
            elif name == _RETRY_BUDGET:
                counters["retry_budget_exhausted"] += value
            elif name == _REJECTED:
                counters["rejected"] += value
    return reading


def _delta(now: float, then: float | None) -> float:
    # A counter that went down was reset (the backend left and came back): count from zero.
    return now if then is None or now < then else now - then


def _bucket_delta(now: Sequence[float], then: Sequence[float] | None) -> list[float]:
    if then is None or len(then) != len(now) or any(n < t for n, t in zip(now, then, strict=True)):
        return list(now)
    return [n - t for n, t in zip(now, then, strict=True)]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _rate(count: float, seconds: float) -> float:
    return round(count / seconds, 3) if seconds > 0 else 0.0


class FleetSampler:
    """Takes a reading per :meth:`tick`, keeps the frames' chart points, and answers the dashboard's polls."""

    def __init__(self, metrics: GatewayMetrics, fleet: FleetState, policy: str, *, bounds: Iterable[float],
                 window_s: float = 5.0, history_s: float = 120.0, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        if not 0 < interval_s <= window_s <= history_s:
            raise ValueError("need 0 < interval_s <= window_s <= history_s")
        self._registry = metrics.registry
        self._fleet = fleet
        self._policy = policy
        self._bounds = [*bounds, math.inf]
        self._window = window_s
        self.interval_s = interval_s
        self._clock, self._wall = clock, wall
        self._readings: deque[Reading] = deque(maxlen=int(window_s / interval_s) + 2)
        self._points: deque[dict[str, Any]] = deque(maxlen=int(history_s / interval_s))
        self._frame: dict[str, object] | None = None

    def tick(self) -> dict[str, object]:
        """Read the gateway now and build the current frame (also returned)."""
        reading = read(self._registry, self._clock(), self._wall())
        base = self._base(reading.at)
        self._readings.append(reading)
        rows, fleet = self._replicas(reading, base), self._totals(reading, base)
        self._frame = {
            "t": round(reading.wall, 3),
            "window_s": round(reading.at - base.at, 3) if base is not None else 0.0,
            "pid": os.getpid(),
            "policy": self._policy,
            "panic": self._fleet.panic,
            "active_requests": self._fleet.active_requests,
            "fleet": fleet,
            "replicas": rows,
            "autoscale": {"mode": AUTOSCALE_OFF, "desired": None, "actual": len(rows),
                          "healthy": sum(1 for row in rows if row["state"] == "healthy")},
        }
        self._points.append({"t": self._frame["t"], "rps": fleet["rps"], "p50_ms": fleet["p50_ms"],
                             "p99_ms": fleet["p99_ms"], "replicas": {row["url"]: row["rps"] for row in rows}})
        return self._frame

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
            buckets = _bucket_delta(now.upstream[url], then.upstream.get(url)) if url in now.upstream else []
            rows.append({
                **row,
                "rps": _rate(count, span),
                "share": round(count / total, 4) if total else 0.0,
                "error_rps": _rate(_delta(now.errors.get(url, 0.0), then.errors.get(url)), span),
                "p50_ms": _ms(quantile(0.5, self._bounds, buckets)),
                "p99_ms": _ms(quantile(0.99, self._bounds, buckets)),
                "ejections": now.ejections.get(url, 0.0),
            })
        return rows

    def _totals(self, now: Reading, base: Reading | None) -> dict[str, float | None]:
        span = now.at - base.at if base is not None else 0.0
        then = base if base is not None else Reading(now.at, now.wall)
        end_to_end = _bucket_delta(now.end_to_end, then.end_to_end or None)
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

