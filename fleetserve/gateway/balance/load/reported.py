"""Reported load: what a replica says about itself on every response, in ORCA form (:mod:`fleetserve.wire`).

A report covers the replica's queue and running rows from every gateway (and every worker of this one),
which this gateway's pending count cannot see; but it is a snapshot, so it fades linearly to nothing over
``report_max_age_s`` (:meth:`ReportedLoad.freshness`), and requests sent after it was taken are added on
top. :func:`outstanding` blends the two, with f the freshness of the last report:

    work = f × (queue_depth + inflight + sent_since_report) + (1 − f) × pending

The reported cost (the ``queue-aware`` policy) also weighs accelerator state, after the endpoint picker of
the Kubernetes Gateway API Inference Extension, which scores model servers by the queue depth and
accelerator state they export:

    cost = (work + 1) × (1 + f × gpu_utilization) × (4 if throttled, faded by f) / effective weight
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetserve.wire import LoadReport, parse_load_report

if TYPE_CHECKING:
    from fleetserve.gateway.balance.load.endpoint import EndpointLoad

_NO_REPORT = LoadReport()
# A throttling GPU runs its clocks down: count its work this many times over.
THROTTLE_FACTOR = 4.0


class ReportedLoad:
    """The replica's own view of its load, from the last response that carried a valid report."""

    __slots__ = ("last", "max_age_s", "reported_at")

    def __init__(self, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        self.last = _NO_REPORT
        self.reported_at: float | None = None

    def update(self, text: str, now: float) -> bool:
        """Take the ``endpoint-load-metrics`` value ``text``; False when it is not a valid report."""
        report = parse_load_report(text)
        if report is None:
            return False
        self.last = report
        self.reported_at = now
        return True

    def age(self, now: float) -> float | None:
        return None if self.reported_at is None else max(0.0, now - self.reported_at)

    def freshness(self, now: float) -> float:
        """1.0 for a report taken just now, fading linearly to 0.0 at ``max_age_s`` (and for none)."""
        if self.reported_at is None:
            return 0.0
        return max(0.0, 1.0 - (now - self.reported_at) / self.max_age_s)


def outstanding(load: EndpointLoad, now: float) -> float:
    """Work waiting at the endpoint: its fresh report plus what was sent since, else this gateway's pending."""
    fresh = load.reported.freshness(now)
    if fresh <= 0.0:
        return float(load.pending)
    last = load.reported.last
    remote = last.queue_depth + last.inflight + load.unreported_pending()
    return fresh * remote + (1.0 - fresh) * load.pending


def reported_cost(load: EndpointLoad, rival: EndpointLoad, now: float) -> float:
    score = outstanding(load, now) + 1.0
    fresh = load.reported.freshness(now)
    if fresh > 0.0:
        last = load.reported.last
        if last.gpu_utilization is not None:
            score *= 1.0 + fresh * last.gpu_utilization
        if last.gpu_throttled:
            score *= 1.0 + (THROTTLE_FACTOR - 1.0) * fresh
    return score / load.effective_weight(now)
