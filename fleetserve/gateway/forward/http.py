"""HTTP forwarding: the aiohttp handler behind every proxied route, and the exchange that carries a request to
a replica over the upstream keep-alive pool (:mod:`.upstream`).

The handler reads the deadline (``X-Fleetserve-Timeout-Ms``, else the configured default; a bad value is a
400), the body (already read and bounded by the edge guards: no I/O here) and the headers to send on
(:mod:`.headers`), and hands the request to the forwarding core (:mod:`.core`). Each attempt carries what is
left of the deadline in ``X-Fleetserve-Timeout-Ms``, so the replica can drop work nobody waits for. The pool
types its failures by how far the exchange got, and that decides what the core may retry: no connection
(not sent, retried without the retry budget), our pool to that replica full (the same), a reset before any
answer and a replica's 503 (retried within the budget); a timeout, or an answer that broke after it
started (a 502), never. A cancelled attempt (client gone, hedge lost) closes its upstream connection.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable
from typing import Generic, TypeVar

from aiohttp import web
from multidict import CIMultiDict

from fleetserve.gateway.access import ATTEMPTS_KEY, BACKEND_KEY, SPAN_KEY
from fleetserve.gateway.balance import Endpoint, RequestContext
from fleetserve.gateway.balance.health import Probe
from fleetserve.gateway.config import GatewayConfig
from fleetserve.gateway.edge import identity_headers
from fleetserve.gateway.forward.core import Forwarder, Outcome
from fleetserve.gateway.forward.headers import DROP_RESPONSE, forward_headers
from fleetserve.gateway.forward.upstream import (
    ConnectError,
    PoolExhausted,
    ResetBeforeResponse,
    UpstreamError,
    UpstreamPools,
    UpstreamResponse,
    UpstreamTimeout,
)
from fleetserve.gateway.metrics import NO_BACKEND, GatewayMetrics
from fleetserve.gateway.tracing import ForwardSpans
from fleetserve.telemetry import otel
from fleetserve.telemetry.tracing import IdGenerator, request_id
from fleetserve.wire import LOAD_REPORT_HEADER, REQUEST_ID_HEADER, RETRY_AFTER, TIMEOUT_HEADER, error_response

READY_PATH = "/v2/health/ready"
_LOAD_REPORT = LOAD_REPORT_HEADER.lower()
A = TypeVar("A")


class UpstreamExchange(ABC, Generic[A]):
    """One client request as the forwarding core carries it over the upstream pools; a front's subclass says
    what an answer is in its server's terms (:meth:`_answer`)."""

    __slots__ = ("_body", "_headers", "_method", "_pools", "_target", "_traceparent", "sends")

    def __init__(self, pools: UpstreamPools, method: str, target: str, headers: list[tuple[str, str]],
                 body: bytes, traceparent: str) -> None:
        self._pools = pools
        self._method = method
        self._target = target
        self._headers = headers
        self._body = body
        self._traceparent = traceparent
        self.sends = 0  # attempts, hedges included, for the access log

    def send(self, ep: Endpoint, timeout_s: float, traceparent: str | None) -> Awaitable[UpstreamResponse]:
        # The pool's own coroutine, not one wrapped around it: no extra coroutine layer per attempt.
        self.sends += 1
        headers = [*self._headers, ("traceparent", traceparent or self._traceparent),
                   (TIMEOUT_HEADER, str(max(1, int(timeout_s * 1000))))]
        return self._pools.get(ep.url).request(self._method, self._target, headers, self._body, timeout_s=timeout_s)

    @abstractmethod
    def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> A:
        """The response to send the client."""

    def answered(self, ep: Endpoint, reply: UpstreamResponse) -> Outcome[A]:
        status = reply.status
        headers = [(k, v) for k, v in reply.headers if k.lower() not in DROP_RESPONSE]
        report = next((v for k, v in headers if k.lower() == _LOAD_REPORT), None)
        return Outcome(status, self._answer(status, headers, reply.body), backend=ep.url, verdict=status,
                       retryable=status == 503, report=report)

    def failed(self, ep: Endpoint, error: Exception) -> Outcome[A]:
        message = str(error)
        if isinstance(error, ConnectError):  # before UpstreamTimeout: a connect timeout sent nothing
            return Outcome(502, failure=message, backend=ep.url, connect_error=True, retryable=True, sent=False)
        if isinstance(error, ResetBeforeResponse):
            return Outcome(502, failure=message, backend=ep.url, verdict=502, retryable=True)
        if isinstance(error, PoolExhausted):  # our side is saturated, not the replica: no verdict on it
            return Outcome(503, failure=message, backend=ep.url, retryable=True, sent=False)
        if isinstance(error, UpstreamTimeout):
            return Outcome(504, failure=message, backend=ep.url, verdict=504)
        if isinstance(error, UpstreamError):  # the response started, then broke: too late to retry
            return Outcome(502, failure=message, backend=ep.url, verdict=502)
        if isinstance(error, ValueError):  # a request target or header the pool refuses to put on the wire
            return Outcome(400, failure=message)
        raise error


class HttpExchange(UpstreamExchange[web.Response]):
    """The exchange of the aiohttp front: answers are ``web.Response``."""

    __slots__ = ()

    def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> web.Response:
        return web.Response(status=status, body=body, headers=CIMultiDict(headers))


def timeout_of(header: str | None, default_s: float, max_ms: int) -> float:
    """The request's deadline in seconds from its ``X-Fleetserve-Timeout-Ms`` (``default_s`` without one);
    ValueError naming the header when it is not a whole number of milliseconds in 1..``max_ms``."""
    if header is None:
        return default_s
    try:
        value = int(header.strip())
    except ValueError:
        value = 0
    if not 1 <= value <= max_ms:
        raise ValueError(f"{TIMEOUT_HEADER} must be a whole number of milliseconds in 1..{max_ms}, "
                         f"got {header[:32]!r}")
    return value / 1000.0


class HttpForwarding:
    """The handler behind every proxied route."""

    def __init__(self, forwarder: Forwarder, pools: UpstreamPools, metrics: GatewayMetrics, config: GatewayConfig,
                 ids: IdGenerator, tracing: otel.Tracing | None = None) -> None:
        self._forwarder = forwarder
        self._pools = pools
        self._metrics = metrics
        self._default_timeout_s = config.request_timeout_ms / 1000.0
        self._max_timeout_ms = config.max_request_timeout_ms
        self._ids = ids
        self._tracing = tracing
        self._policy = config.balancer.policy

    async def handle(self, request: web.Request) -> web.StreamResponse:
        metrics = self._metrics
        metrics.inflight.inc()
        try:
            response, backend = await self._handle(request)
        finally:
            metrics.inflight.dec()
        metrics.observe_request(backend, response.status)
        return response

    async def _handle(self, request: web.Request) -> tuple[web.Response, str]:
        rid = request_id(request.headers.get(REQUEST_ID_HEADER), self._ids)
        try:
            timeout_s = timeout_of(request.headers.get(TIMEOUT_HEADER), self._default_timeout_s,
                                   self._max_timeout_ms)
        except ValueError as exc:
            return error_response(400, str(exc), {REQUEST_ID_HEADER: rid}), NO_BACKEND
        forwarder = self._forwarder
        deadline = forwarder.clock() + timeout_s
        body = await request.read()  # already read and bounded by the edge's body limits: no I/O here
        span = None if self._tracing is None else request.get(SPAN_KEY)
        headers, traceparent = forward_headers(request.headers, rid, self._ids,
                                               None if span is None else otel.traceparent(span),
                                               identity_headers(request), request.remote)
        ctx = RequestContext(request.method, request.path, len(body), request.headers, rid)
        exchange = HttpExchange(self._pools, request.method, request.raw_path, headers, body, traceparent)
        spans = ForwardSpans.of(self._tracing, span, self._policy, "http", request.method)
        outcome = await forwarder.forward(ctx, exchange, deadline, timeout_s, spans)
        request[ATTEMPTS_KEY] = exchange.sends
        request[BACKEND_KEY] = outcome.backend
        response = outcome.answer
        if response is None:
            answer = {REQUEST_ID_HEADER: rid}
            if outcome.retry_after is not None:
                answer[RETRY_AFTER] = outcome.retry_after
            return error_response(outcome.status, outcome.failure, answer), outcome.backend
        response.headers[REQUEST_ID_HEADER] = rid
        return response, outcome.backend


def readiness_probe(pools: UpstreamPools) -> Probe:
    """The health probe: ``GET /v2/health/ready`` through the pool; ready means 200."""

    async def probe(ep: Endpoint) -> bool:
        reply = await pools.get(ep.url).request("GET", READY_PATH, [("Accept", "application/json")])
        return reply.status == 200

    return probe

