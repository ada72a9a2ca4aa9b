"""Load shedding: a global cap on in-flight requests.

Beyond ``max_inflight`` concurrent requests the gateway answers 503 with ``Retry-After`` at once
instead of queueing: a queue in front of saturated replicas only adds latency until clients time out
and retry, while a fast refusal lets them back off or go elsewhere (Envoy's overload manager and
circuit breakers' ``max_requests`` work the same way). The per-replica cap is the balancer's
(:class:`~fleetserve.gateway.balance.BalancerConfig` ``replica_max_inflight``).
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web
from aiohttp.typedefs import Handler

from fleetserve.gateway.edge.config import ShedConfig
from fleetserve.gateway.edge.metrics import NullObserver, RejectionObserver
from fleetserve.gateway.edge.rejection import Rejection
from fleetserve.wire import RETRY_AFTER, retry_after


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
        self.exempt = frozenset(exempt_paths)
        self._observer = observer or NullObserver()
        self._retry_after = {RETRY_AFTER: retry_after(config.retry_after_s)}

    def enter(self) -> Rejection | None:
        """Count one more request in flight, or refuse it at the cap (then nothing is counted)."""
        if self.inflight >= self.max_inflight:
            self._observer.rejected("overloaded")
            return Rejection(503, "overloaded", f"gateway overloaded: {self.inflight} requests in flight",
                             self._retry_after)
        self.inflight += 1
        return None

    def leave(self) -> None:
        self.inflight -= 1

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in self.exempt:
            return await handler(request)
        rejection = self.enter()
        if rejection is not None:
            return rejection.response()
        try:
            return await handler(request)
        finally:
            self.inflight -= 1
