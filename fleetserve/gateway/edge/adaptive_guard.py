"""The adaptive concurrency guard: admits requests while the :class:`GradientController` has a slot, answers
the rest 503 + ``Retry-After`` at once, and feeds each admitted request's latency back to the controller.

A request counts as a latency sample when it is answered below 400; a 4xx (a bad request, or one an inner
guard refused, answered without reaching a replica's queue), a 5xx or a client that went away returns its
slot without one (their latency says nothing about queueing). The controller's state is exported at scrape
time: ``fleetserve_gateway_concurrency_limit``, ``fleetserve_gateway_concurrency_inflight`` and
``fleetserve_gateway_min_rtt_seconds``; refusals count in ``fleetserve_gateway_rejected_total`` with reason
``concurrency_limited``. The gRPC listener's guards (:mod:`.grpc`) take their slots from the same controller
through :meth:`AdaptiveConcurrencyMiddleware.acquire` and :meth:`~AdaptiveConcurrencyMiddleware.release`, so
one limit covers the gateway's requests whichever listener they came through.

While ``unlimited()`` says so — the gateway's autoscaler can still add replicas, or requests wait for a first
one at a fleet scaled to zero — a request at the limit is admitted all the same: capacity is on its way, and a
refusal would fail a request that scaling is about to serve (Knative's activator buffers during scale-up
likewise; the hold queue bounds what waits at zero). Such requests take slots like any other, so the limit
keeps following demand and latency, and applies as soon as the fleet is at its maximum; while it stands aside
the limit does not shrink (:mod:`.adaptive`).

The gateway's own API and dashboard (``/gateway/…``, ``/dashboard``) are not limited: they answer from the
gateway's state without a replica, and the autoscaler's actuator long-polls there for seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fleetserve.gateway.edge.adaptive import GradientController, Token
from fleetserve.gateway.edge.metrics import NullObserver, RejectionObserver
from fleetserve.gateway.edge.rejection import Rejection
from fleetserve.wire import RETRY_AFTER, retry_after

# Paths under these prefixes are the gateway's own (admin, autoscaler, dashboard): never limited.
OWN_PREFIXES = ("/gateway/", "/dashboard")


class AdaptiveConcurrencyMiddleware:
    """Holds one controller slot per request in progress; see the module docstring."""

    __middleware_version__ = 1

    def __init__(self, controller: GradientController, retry_after_s: float, exempt_paths: Sequence[str] = (),
                 observer: RejectionObserver | None = None, unlimited: Callable[[], bool] | None = None) -> None:
        self.controller = controller
        self.unlimited = unlimited
        self.exempt = frozenset(exempt_paths)
        self._observer = observer or NullObserver()
        self._retry_after = {RETRY_AFTER: retry_after(retry_after_s)}

    def acquire(self) -> Token | Rejection:
        """A slot for one request, or the 503 that refuses it (counted as ``concurrency_limited``)."""
        controller = self.controller
        token = controller.try_acquire(self.unlimited)
        if token is None:
            self._observer.rejected("concurrency_limited")
            return Rejection(503, "concurrency_limited", f"gateway overloaded: {controller.inflight} requests in "
                             "flight, at its adaptive concurrency limit", self._retry_after)
        return token

    def release(self, token: Token, ok: bool) -> None:
        """Give ``token``'s slot back; its latency is a sample only when ``ok`` (answered below 400)."""
        controller = self.controller
        controller.release(token, controller.now() - token.started_at, ok)

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in self.exempt or path.startswith(OWN_PREFIXES):
            return await handler(request)
        token = self.acquire()
        if isinstance(token, Rejection):
            return token.response()
        ok = False
        try:
            response = await handler(request)
            ok = response.status < 400
            return response
        finally:
            self.release(token, ok)


class AdaptiveConcurrencyGauges(Collector):
    """The controller's limit, in-flight count and minRTT, read when scraped (no work on the request path)."""

    def __init__(self, controller: GradientController) -> None:
        self._controller = controller

    def collect(self) -> Iterator[GaugeMetricFamily]:
        c = self._controller
        yield GaugeMetricFamily("fleetserve_gateway_concurrency_limit",
                                "Adaptive concurrency limit: requests admitted in flight at most", value=c.limit)
        yield GaugeMetricFamily("fleetserve_gateway_concurrency_inflight",
                                "Requests holding an adaptive concurrency slot", value=c.inflight)
        min_rtt = GaugeMetricFamily("fleetserve_gateway_min_rtt_seconds",
                                    "Latency without queueing, as the adaptive concurrency limit last measured it")
        if c.min_rtt is not None:  # no sample until the first measurement
            min_rtt.add_metric([], c.min_rtt)
        yield min_rtt
