"""Load shedding: a global cap on in-flight requests, and per-key concurrency caps for the proxy.

Beyond ``max_inflight`` concurrent requests the gateway answers 503 with ``Retry-After`` at once
instead of queueing: a queue in front of saturated replicas only adds latency until clients time out
and retry, while a fast refusal lets them back off or go elsewhere (Envoy's overload manager and
circuit breakers' ``max_requests`` work the same way). :class:`ConcurrencyLimiter` is the per-replica
version the proxy consults before forwarding (a replica at its cap is skipped or the request is
refused), the counterpart of Envoy's per-cluster circuit breaker.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager

from aiohttp import web
from aiohttp.typedefs import Handler

from fleetserve.gateway.edge.config import ShedConfig
from fleetserve.gateway.edge.metrics import NullObserver, RejectionObserver
from fleetserve.wire import error_response, retry_after


class LoadShedMiddleware:
    """Refuses requests beyond ``max_inflight`` concurrent ones (503 + Retry-After)."""

    __middleware_version__ = 1

    def __init__(
        self,
        config: ShedConfig,
        exempt_paths: Sequence[str] = (),
        observer: RejectionObserver | None = None,
    ) -> None:
        self.max_inflight = config.max_inflight
        self.inflight = 0
        self._exempt = frozenset(exempt_paths)
        self._observer = observer or NullObserver()
        self._retry_after = {"Retry-After": retry_after(config.retry_after_s)}

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in self._exempt:
            return await handler(request)
        if self.inflight >= self.max_inflight:
            self._observer.rejected("overloaded")
            return error_response(503, f"gateway overloaded: {self.inflight} requests in flight", self._retry_after)
        self.inflight += 1
        try:
            return await handler(request)
        finally:
            self.inflight -= 1


class ConcurrencyLimiter:
    """At most ``limit`` concurrent holders per key (e.g. per replica); keys at zero are forgotten."""

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
        self.limit = limit
        self._counts: dict[Hashable, int] = {}

    @classmethod
    def from_config(cls, config: ShedConfig) -> ConcurrencyLimiter | None:
        """The per-replica limiter a config asks for, if any."""
        limit = config.replica_max_inflight
        return None if limit is None else cls(limit)

    def try_acquire(self, key: Hashable) -> bool:
        count = self._counts.get(key, 0)
        if count >= self.limit:
            return False
        self._counts[key] = count + 1
        return True

    def release(self, key: Hashable) -> None:
        count = self._counts.get(key, 0)
        if count <= 0:
            raise RuntimeError(f"release of {key!r} without a matching try_acquire")
        if count == 1:
            del self._counts[key]
        else:
            self._counts[key] = count - 1

    def inflight(self, key: Hashable) -> int:
        return self._counts.get(key, 0)

    def available(self, key: Hashable) -> bool:
        return self._counts.get(key, 0) < self.limit

    @contextmanager
    def hold(self, key: Hashable) -> Iterator[bool]:
        """``with limiter.hold(replica) as ok:`` acquires if possible and always releases what it took."""
        acquired = self.try_acquire(key)
        try:
            yield acquired
        finally:
            if acquired:
                self.release(key)
