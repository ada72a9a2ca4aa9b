"""Collects a run's outcomes on the hot path; :class:`RawResult` is the mergeable, picklable result.

Counts are exact: every request in the measured window is counted once, as ok or as an error of one
kind (``http_<status>``, ``timeout``, ``connect``, ``connection``, ``protocol``, ``dropped``), in total
and per second. Latencies of ok responses are kept as samples (from the scheduled and from the
actual send time, with the completion time: 24 bytes each), at most ``max_samples`` of them; past
that the recorder keeps a uniform random subset (reservoir sampling, "Algorithm R", J. S. Vitter,
"Random Sampling with a Reservoir", ACM TOMS 1985), so percentiles stay unbiased over the whole
run instead of describing only its beginning.

Offsets are seconds from the start of the measured window: ``sent`` per second is counted by
scheduled send time, ok and errors by completion time.
"""

from __future__ import annotations

import random
from array import array
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from fleetserve.bench.client import DROPPED


@dataclass
class RawResult:
    duration_s: float = 0.0
    requests: int = 0
    sent: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latency_s: np.ndarray = field(default_factory=lambda: np.empty(0))
    service_s: np.ndarray = field(default_factory=lambda: np.empty(0))
    done_s: np.ndarray = field(default_factory=lambda: np.empty(0))
    sent_per_s: dict[int, int] = field(default_factory=dict)
    ok_per_s: dict[int, int] = field(default_factory=dict)
    errors_per_s: dict[int, int] = field(default_factory=dict)
    lag_sum_s: float = 0.0
    lag_count: int = 0
    lag_max_s: float = 0.0
    cpu_s: float = 0.0


K = TypeVar("K", int, str)


def _add(counters: Iterable[dict[K, int]]) -> dict[K, int]:
    total: Counter[K] = Counter()
    for c in counters:
        total.update(c)
    return dict(total)


def merge(results: list[RawResult]) -> RawResult:
    """Combine the results of processes that ran side by side over the same window."""
    if not results:
        raise ValueError("nothing to merge")
    return RawResult(
        duration_s=max(r.duration_s for r in results),
        requests=sum(r.requests for r in results),
        sent=sum(r.sent for r in results),
        ok=sum(r.ok for r in results),
        errors=_add(r.errors for r in results),
        latency_s=np.concatenate([r.latency_s for r in results]),
        service_s=np.concatenate([r.service_s for r in results]),
        done_s=np.concatenate([r.done_s for r in results]),
        sent_per_s=_add(r.sent_per_s for r in results),
        ok_per_s=_add(r.ok_per_s for r in results),
        errors_per_s=_add(r.errors_per_s for r in results),
        lag_sum_s=sum(r.lag_sum_s for r in results),
        lag_count=sum(r.lag_count for r in results),
        lag_max_s=max(r.lag_max_s for r in results),
        cpu_s=sum(r.cpu_s for r in results),
    )


class Recorder:
    def __init__(self, max_samples: int, rng: random.Random) -> None:
        if max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {max_samples}")
        self._cap = max_samples
        self._rng = rng
        self._latency = array("d")
        self._service = array("d")
        self._done = array("d")
        self.requests = 0
        self.sent = 0
        self.ok = 0
        self.errors: Counter[str] = Counter()
        self._sent_per_s: Counter[int] = Counter()
        self._ok_per_s: Counter[int] = Counter()
        self._errors_per_s: Counter[int] = Counter()
        self._lag_sum = 0.0
        self._lag_count = 0
        self._lag_max = 0.0

    def record_sent(self, scheduled: float, lag: float = 0.0) -> None:
        """A request left (or started to leave) ``lag`` seconds after its scheduled time."""
        self.requests += 1
        self.sent += 1
        self._sent_per_s[int(scheduled)] += 1
        self._lag_sum += lag
        self._lag_count += 1
        if lag > self._lag_max:
            self._lag_max = lag

    def record_dropped(self, scheduled: float) -> None:
        self.requests += 1
        self.errors[DROPPED] += 1
        self._errors_per_s[int(scheduled)] += 1

    def record_ok(self, done: float, latency: float, service: float) -> None:
        """``latency`` from the scheduled send time, ``service`` from the actual one."""
        self.ok += 1
        self._ok_per_s[int(done)] += 1
        if self.ok <= self._cap:
            self._latency.append(latency)
            self._service.append(service)
            self._done.append(done)
            return
        slot = self._rng.randrange(self.ok)
        if slot < self._cap:
            self._latency[slot] = latency
            self._service[slot] = service
            self._done[slot] = done

    def record_error(self, kind: str, done: float) -> None:
        self.errors[kind] += 1
        self._errors_per_s[int(done)] += 1

    def result(self, duration_s: float, cpu_s: float) -> RawResult:
        return RawResult(
            duration_s=duration_s,
            requests=self.requests,
            sent=self.sent,
            ok=self.ok,
            errors=dict(self.errors),
            latency_s=np.frombuffer(self._latency, dtype=np.float64).copy(),
            service_s=np.frombuffer(self._service, dtype=np.float64).copy(),
            done_s=np.frombuffer(self._done, dtype=np.float64).copy(),
            sent_per_s=dict(self._sent_per_s),
            ok_per_s=dict(self._ok_per_s),
            errors_per_s=dict(self._errors_per_s),
            lag_sum_s=self._lag_sum,
            lag_count=self._lag_count,
            lag_max_s=self._lag_max,
            cpu_s=cpu_s,
        )
