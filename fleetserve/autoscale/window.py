"""Sliding windows over what the gateway sees, turned into one :class:`FleetSignals` snapshot per tick.

The gateway calls :meth:`SignalWindow.arrival` for every request that reaches it and :meth:`SignalWindow.observe`
for every answered one (its latency, whether it succeeded, and the replica's load report, if any). Both are O(1):
events are counted into one-second slots of a ring, and latencies into a sparse log-scale histogram per slot
(buckets 2% wide, so a percentile read from them is within 1% of the exact one). Memory is bounded by the
window lengths and the number of replicas, never by the request rate. :meth:`SignalWindow.snapshot` merges the
slots of each window once per tick.

Percentiles from log-bucketed histograms are the approach of HdrHistogram and DDSketch (Masson, Rim and Lee,
"DDSketch: a fast and fully-mergeable quantile sketch with relative-error guarantees", VLDB 2019): a bucket
index is ``ceil(log(x) / log(gamma))``, so merging windows is adding counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fleetserve.autoscale.signals import FleetSignals, ReplicaSignals
from fleetserve.wire import LoadReport

SLOT_S = 1.0  # the ring's resolution: a window of w seconds spans its last ceil(w) slots plus the current one
_GAMMA = 1.02  # ratio of neighbouring histogram bucket bounds: relative error <= 1%
_LOG_GAMMA = math.log(_GAMMA)
_MIN_LATENCY_S = 1e-6  # smaller latencies (and zero) count in the lowest bucket


@dataclass(frozen=True, slots=True)
class Membership:
    """The fleet as the actuator last told the gateway: routable, starting, and leaving replicas (URLs)."""

    ready: tuple[str, ...] = ()
    starting: tuple[str, ...] = ()
    draining: tuple[str, ...] = ()


def _bucket(latency_s: float) -> int:
    return math.ceil(math.log(max(latency_s, _MIN_LATENCY_S)) / _LOG_GAMMA)


def _bucket_value(index: int) -> float:
    """A representative latency of bucket ``index`` (the middle of its bounds, in log space)."""
    return float(_GAMMA ** (index - 0.5))


def percentile(histogram: dict[int, int], total: int, q: float) -> float | None:
    """The ``q``-th percentile (0 < q <= 100) of a bucket histogram holding ``total`` latencies; None when empty."""
    if total <= 0:
        return None
    rank = max(1, math.ceil(q / 100.0 * total))
    seen = 0
    for index in sorted(histogram):
        seen += histogram[index]
        if seen >= rank:
            return _bucket_value(index)
    return _bucket_value(max(histogram))


class _Slot:
    """Counts of one second: arrivals, answers, and the answered requests' latency histogram."""

    __slots__ = ("answered", "arrivals", "latencies", "latency_count", "second")

    def __init__(self, second: int) -> None:
        self.second = second
        self.arrivals = 0
        self.answered = 0
        self.latencies: dict[int, int] = {}
        self.latency_count = 0


class _Ring:
    """The last ``size`` one-second slots, reused in place as time moves on."""

    __slots__ = ("_size", "_slots")

    def __init__(self, size: int) -> None:
        self._size = size
        self._slots: list[_Slot | None] = [None] * size

    def slot(self, second: int) -> _Slot:
        i = second % self._size
        slot = self._slots[i]
        if slot is None or slot.second != second:
            slot = self._slots[i] = _Slot(second)
        return slot

    def since(self, first_second: int, last_second: int) -> Iterable[_Slot]:
        for slot in self._slots:
            if slot is not None and first_second <= slot.second <= last_second:
                yield slot


class _Replica:
    """What the window knows of one replica: its answers over time and its latest load report."""

    __slots__ = ("report", "ring")

    def __init__(self, size: int) -> None:
        self.ring = _Ring(size)
        self.report: LoadReport | None = None


class SignalWindow:
    """Request rates over the last ``rate_window_s`` and latency percentiles over the last ``latency_window_s``,
    for the fleet and per replica, read from the injected ``clock`` (seconds).

    One thread only (the gateway's event loop), like the gateway's other hot-path counters.
    """

    def __init__(self, clock: Callable[[], float], rate_window_s: float = 1.0, latency_window_s: float = 5.0) -> None:
        for name, value in (("rate_window_s", rate_window_s), ("latency_window_s", latency_window_s)):
            if not (math.isfinite(value) and value >= SLOT_S):
                raise ValueError(f"{name} must be >= {SLOT_S} s, got {value}")
        self._clock = clock
        self.rate_window_s = rate_window_s
        self.latency_window_s = latency_window_s
        self._rate_slots = math.ceil(rate_window_s / SLOT_S)
        self._latency_slots = math.ceil(latency_window_s / SLOT_S)
        self._size = max(self._rate_slots, self._latency_slots) + 1
        self._fleet = _Ring(self._size)
        self._replicas: dict[str, _Replica] = {}

    def arrival(self) -> None:
        """A request reached the gateway (counted whether or not a replica is ready to take it)."""
        self._fleet.slot(int(self._clock() // SLOT_S)).arrivals += 1

    def observe(self, url: str, latency_s: float, ok: bool, report: LoadReport | None) -> None:
        """Replica ``url`` answered a request after ``latency_s``; a failed answer counts toward its rate, not
        toward the latency percentiles. ``report`` (the answer's load report) replaces the replica's last one."""
        second = int(self._clock() // SLOT_S)
        replica = self._replicas.get(url)
        if replica is None:
            replica = self._replicas[url] = _Replica(self._size)
        if report is not None:
            replica.report = report
        rslot = replica.ring.slot(second)
        rslot.answered += 1
        fslot = self._fleet.slot(second)
        fslot.answered += 1
        if ok:
            index = _bucket(latency_s)
            rslot.latencies[index] = rslot.latencies.get(index, 0) + 1
            rslot.latency_count += 1
            fslot.latencies[index] = fslot.latencies.get(index, 0) + 1
            fslot.latency_count += 1

    def snapshot(self, members: Membership, held: int = 0, startup_s: float | None = None) -> FleetSignals:
        """The fleet now: counts from ``members``, ``held`` requests waiting for a first replica, the measured
        replica start-up time ``startup_s`` (if the actuator reported one), and the windows' rates and
        percentiles. Replicas no longer in ``members`` are forgotten."""
        now = self._clock()
        second = int(now // SLOT_S)
        # Each window spans its whole slots plus the current, partial one, and divides by exactly that span.
        rate_span = self._rate_slots * SLOT_S + (now - second * SLOT_S)
        rate_first = second - self._rate_slots
        latency_first = second - self._latency_slots
        known = set(members.ready) | set(members.draining)
        for url in [u for u in self._replicas if u not in known]:
            del self._replicas[url]

        arrivals = sum(s.arrivals for s in self._fleet.since(rate_first, second))
        p50, p99 = _percentiles(self._fleet.since(latency_first, second))
        ready = set(members.ready)
        replicas: list[ReplicaSignals] = []
        for url in (*members.ready, *members.draining):
            state = self._replicas.get(url)
            report = state.report if state is not None else None
            answered = sum(s.answered for s in state.ring.since(rate_first, second)) if state is not None else 0
            rp50, rp99 = _percentiles(state.ring.since(latency_first, second)) if state is not None else (None, None)
            replicas.append(ReplicaSignals(
                url=url, ready=url in ready, request_rate=answered / rate_span,
                queue_depth=report.queue_depth if report is not None else 0.0,
                inflight=report.inflight if report is not None else 0.0,
                p50_s=rp50, p99_s=rp99,
                utilization=report.application_utilization if report is not None else None,
                gpu_utilization=report.gpu_utilization if report is not None else None,
                gpu_throttled=report.gpu_throttled if report is not None else False))
        routable = [r for r in replicas if r.ready]
        gpu = [r.gpu_utilization for r in routable if r.gpu_utilization is not None]
        busy = [r.utilization for r in routable if r.utilization is not None]
        return FleetSignals(
            at_s=now, ready=len(members.ready), starting=len(members.starting), draining=len(members.draining),
            request_rate=arrivals / rate_span,
            queue_depth=sum(r.queue_depth for r in routable), inflight=sum(r.inflight for r in routable),
            p50_s=p50, p99_s=p99, held=held,
            gpu_utilization=sum(gpu) / len(gpu) if gpu else None,
            gpu_throttled=sum(1 for r in routable if r.gpu_throttled),
            utilization=sum(busy) / len(busy) if busy else None,
            startup_s=startup_s, replicas=tuple(replicas))


def _percentiles(slots: Iterable[_Slot]) -> tuple[float | None, float | None]:
    merged: dict[int, int] = {}
    total = 0
    for slot in slots:
        total += slot.latency_count
        for index, count in slot.latencies.items():
            merged[index] = merged.get(index, 0) + count
    return percentile(merged, total, 50.0), percentile(merged, total, 99.0)
