"""How the edge guards report what they turn away: one small observer protocol, a Prometheus one.

Guards call :meth:`RejectionObserver.rejected` with one of :data:`REASONS` on their hot path, so an
implementation must be quick and must not raise. The Prometheus counter is created once by the caller
(``PrometheusRejections.create(registry)``) and passed to :func:`build_middlewares`.
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client import CollectorRegistry, Counter

REASONS = (
    "body_too_large",
    "body_timeout",
    "headers_too_large",
    "header_timeout",
    "json_too_deep",
    "json_too_many_elements",
    "max_connections",
    "overloaded",
    "concurrency_limited",
    "missing_token",
    "invalid_token",
    "insufficient_scope",
    "rate_limited",
)


class RejectionObserver(Protocol):
    def rejected(self, reason: str) -> None:
        """A request or connection was turned away for ``reason`` (one of :data:`REASONS`)."""


class NullObserver:
    """Observes nothing; the default when no observer is given."""

    def rejected(self, reason: str) -> None:
        pass


class PrometheusRejections:
    """Counts rejections in ``fleetserve_gateway_rejected_total{reason}``."""

    def __init__(self, counter: Counter) -> None:
        # Resolving label children once keeps .labels() (a lock and a dict lookup) off the hot path,
        # and makes every reason visible at 0 before it first happens.
        self._counter = counter
        self._children = {reason: counter.labels(reason=reason) for reason in REASONS}

    @classmethod
    def create(cls, registry: CollectorRegistry) -> PrometheusRejections:
        counter = Counter(
            "fleetserve_gateway_rejected_total",
            "Requests and connections the gateway's edge guards turned away, by reason.",
            ["reason"],
            registry=registry,
        )
        return cls(counter)

    def rejected(self, reason: str) -> None:
        child = self._children.get(reason)
        if child is None:
            child = self._children[reason] = self._counter.labels(reason=reason)
        child.inc()
