"""What a simulation run measured: latencies of the answered requests, errors, throughput, utilisation."""

from __future__ import annotations

import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleetserve.sim.request import CONNECT_ERROR, EXPIRED, LIMITED, NO_REPLICA, OK, OVERLOADED, RESET

STATUS_NAMES = {OK: "ok", OVERLOADED: "overloaded_503", RESET: "reset_502", EXPIRED: "expired_504",
                CONNECT_ERROR: "connect_error", NO_REPLICA: "no_replica_503", LIMITED: "limited_503"}
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


class Recorder:
    """Collects outcomes of requests that arrived inside the measurement window; with ``split_tokens``, the
    latencies of requests up to that many tokens (``short``) and longer (``long``) apart as well."""

    __slots__ = ("answered_at", "errors", "latencies", "long", "short", "split_tokens", "window_start")

    def __init__(self, window_start: float, split_tokens: int | None = None) -> None:
        self.window_start = window_start
        self.split_tokens = split_tokens
        self.latencies = array.array("d")
        self.answered_at = array.array("d")
        self.short = array.array("d")
        self.long = array.array("d")
        self.errors: Counter[int] = Counter()

    def record(self, arrived_at: float, now: float, status: int, tokens: int = 0) -> None:
        if arrived_at < self.window_start:
            return
        if status == OK:
            self.latencies.append(now - arrived_at)
            self.answered_at.append(now)
            if self.split_tokens is not None:
                (self.long if tokens > self.split_tokens else self.short).append(now - arrived_at)
        else:
            self.errors[status] += 1

    def by_length(self) -> dict[str, dict[str, float]]:
        """Latency statistics of the short and the long requests; empty without ``split_tokens``."""
        if self.split_tokens is None:
            return {}
        return {"short": latency_stats(self.short), "long": latency_stats(self.long)}

    def answered_by(self, t: float) -> int:
        """OK answers given by time ``t``."""
        return int(np.count_nonzero(np.frombuffer(self.answered_at, dtype=np.float64) <= t)) if self.answered_at else 0


@dataclass(frozen=True)
class SimResult:
    offered_rps: float
    window_s: float
    ok: int  # OK answers to the requests that arrived in the window, however late (as the load generator counts)
    ok_in_window: int  # of those, answered before the window closed (an overloaded fleet falls behind here)
    errors: dict[str, int]
    latency_s: dict[str, float]  # "p50", "p90", "p99", "p99.9", "mean", "max"
    utilisation: float  # mean over the replicas' engine instances
    utilisation_by_group: dict[str, float]
    mean_batch: float
    retries: int
    replicas: int
    requests: int  # simulated arrivals in all, warm-up included
    wall_s: float
    events: int
    notes: tuple[str, ...] = field(default=())
    # Mean time a request's batch spent on its engine instance, from start to finish (processor sharing
    # included), as a replica's ``fleetserve_request_duration_seconds{stage="compute"}`` counts it.
    engine_s_per_request: float = float("nan")
    # "short" and "long" latency statistics when SimConfig.split_tokens asked for them.
    latency_by_length: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def throughput_rps(self) -> float:
        return self.ok / self.window_s if self.window_s > 0 else 0.0

    @property
    def goodput_rps(self) -> float:
        """OK answers given inside the window per second: below the offered load when the fleet falls behind."""
        return self.ok_in_window / self.window_s if self.window_s > 0 else 0.0

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def p(self, name: str) -> float:
        return self.latency_s[name]

    def to_json(self) -> dict[str, Any]:
        return {
            "offered_rps": self.offered_rps, "throughput_rps": self.throughput_rps,
            "goodput_rps": self.goodput_rps, "window_s": self.window_s,
            "ok": self.ok, "errors": self.errors,
            "latency_ms": {k: v * 1e3 for k, v in self.latency_s.items()},
            "utilisation": self.utilisation, "utilisation_by_group": self.utilisation_by_group,
            "mean_batch": self.mean_batch, "retries": self.retries, "replicas": self.replicas,
            "requests": self.requests, "wall_s": self.wall_s, "events": self.events, "notes": list(self.notes),
            "engine_ms_per_request": self.engine_s_per_request * 1e3,
            "latency_by_length_ms": {k: {q: v * 1e3 for q, v in stats.items()}
                                     for k, stats in self.latency_by_length.items()},
        }


def latency_stats(latencies: array.array[float]) -> dict[str, float]:
    if not latencies:
        return {**{_name(p): float("nan") for p in PERCENTILES}, "mean": float("nan"), "max": float("nan")}
    data = np.frombuffer(latencies, dtype=np.float64)
    values = np.percentile(data, PERCENTILES)
    stats = {_name(p): float(v) for p, v in zip(PERCENTILES, values, strict=True)}
    stats["mean"] = float(data.mean())
    stats["max"] = float(data.max())
    return stats


def _name(p: float) -> str:
    return f"p{p:g}"


def error_names(errors: Counter[int]) -> dict[str, int]:
    return {STATUS_NAMES.get(code, str(code)): n for code, n in sorted(errors.items())}
