"""Forward one client request to a replica: pick, send, retry elsewhere when that is safe, answer.

Retry rules, after Envoy's ``retry_on: connect-failure,reset,retriable-status-codes`` with a retry
budget: a request is retried when the replica could not be connected to, closed the connection
before any byte of its response, or answered 503 (overloaded); at most ``max_retries`` times, each
time on a replica not tried yet, while the deadline leaves time. A retry of a request some replica
received (a reset, a 503) also needs the balancer's retry budget, which keeps retries from multiplying
an overload; one that never reached a replica (connection refused, our pool to it full) did no work
anywhere, so it is retried without the budget: that is what keeps a crashed replica from failing the
requests routed to it before it is ejected. Never after a response started to arrive (the pool returns
only whole responses, so a broken one is a 502) and never on a 4xx, which is the client's to see
unchanged.

The deadline (``X-Fleetserve-Timeout-Ms``, else the configured default) bounds forwarding, retries
included (504 past it); what is left of it is forwarded in the same header so the replica can drop
work nobody waits for. The body was already read and bounded by the edge guards (size, upload time,
JSON shape) before this handler runs. When no replica can take the request the answer is a quick
503 with ``Retry-After``, never a hang.

With hedging on (:mod:`fleetserve.gateway.forward.hedge`, opt-in), an inference call whose first attempt is slower
than the route's recent latency percentile gets a copy on another replica within the hedge budget,
the first answer wins and the slower attempt is cancelled (its connection closed).

With a per-replica in-flight cap (``edge.shedding.replica_max_inflight``, enforced by the balancer), a
replica at its cap is no candidate; when every replica is at its cap the request is refused at once
with 503 + ``Retry-After`` rather than queued, so admitted requests keep their latency. Verified caller
identity (``X-Fleetserve-Subject`` / ``-Tenant``) is set here from the auth guard's result; client-sent
values never pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from fleetserve.gateway.balance import Balancer, RequestContext
from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.health import Probe
from fleetserve.gateway.config import GatewayConfig
from fleetserve.gateway.edge import IDENTITY_HEADERS, identity_headers
from fleetserve.gateway.edge.guards import EdgeGuards
from fleetserve.gateway.forward.hedge import Hedger, race
from fleetserve.gateway.forward.upstream import (
    ConnectError,
    PoolExhausted,
    ResetBeforeResponse,
    UpstreamError,
    UpstreamPools,
    UpstreamTimeout,
)
from fleetserve.gateway.metrics import NO_BACKEND, GatewayMetrics
from fleetserve.telemetry import logs
from fleetserve.telemetry.tracing import IdGenerator, next_hop, parse_traceparent, request_id
from fleetserve.wire import LOAD_REPORT_HEADER, REQUEST_ID_HEADER, RETRY_AFTER, TIMEOUT_HEADER
from fleetserve.wire import error_response as wire_error

READY_PATH = "/v2/health/ready"
# Hop-by-hop headers (RFC 9110 §7.6.1) and those this proxy sets itself.
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "transfer-encoding", "upgrade", "host", "content-length", "expect",
})
_SET_HERE = frozenset({"traceparent", "tracestate", "x-request-id", "x-forwarded-for", TIMEOUT_HEADER.lower(),
                       *(name.lower() for name in IDENTITY_HEADERS)})
_DROP_REQUEST = _HOP_BY_HOP | _SET_HERE
_DROP_RESPONSE = _HOP_BY_HOP | {"x-request-id"}


def error_response(status: int, message: str, rid: str, retry_after: str | int | None = None) -> web.Response:
    headers = {REQUEST_ID_HEADER: rid}
    if retry_after is not None:
        headers[RETRY_AFTER] = str(retry_after)
    return wire_error(status, message, headers)


@dataclass(slots=True)
class _Outcome:
    response: web.Response
    backend: str
    retryable: bool  # nothing reached the client yet and another replica may do better
    failure: str | None = None  # set when the gateway wrote this answer, not a replica
    sent: bool = True  # False: the request never reached a replica (no connection), so no work was done


def _answered(outcome: _Outcome) -> bool:
    """An outcome to give the client (not a failure another replica might do better on)."""
    return not outcome.retryable


def _connection_tokens(headers: Mapping[str, str]) -> frozenset[str]:
    value = headers.get("Connection")
    if not value:
        return frozenset()
    return frozenset(token.strip().lower() for token in value.split(","))


class Proxy:
    """The handler behind every proxied route."""

    def __init__(self, config: GatewayConfig, balancer: Balancer, upstreams: UpstreamPools,
                 metrics: GatewayMetrics, *, guards: EdgeGuards, ids: IdGenerator | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._balancer = balancer
        self._upstreams = upstreams
        self._metrics = metrics
        self._guards = guards
        self._ids = ids if ids is not None else IdGenerator()
        self._clock = clock
        self._hedger = Hedger(config.hedge)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        metrics = self._metrics
        metrics.inflight.inc()
        try:
            response, backend = await self._handle(request)
        finally:
            metrics.inflight.dec()
        metrics.observe_request(backend, response.status)
        return response

    def _timeout_s(self, header: str | None) -> float:
        if header is None:
            return self._config.request_timeout_ms / 1000.0
        limit = self._config.max_request_timeout_ms
        try:
            value = int(header.strip())
        except ValueError:
            value = 0
        if not 1 <= value <= limit:
            raise ValueError(f"{TIMEOUT_HEADER} must be a whole number of milliseconds in 1..{limit}, "
                             f"got {header[:32]!r}")
        return value / 1000.0

    async def _handle(self, request: web.Request) -> tuple[web.Response, str]:
        rid = request_id(request.headers.get(REQUEST_ID_HEADER), self._ids)
        try:
            timeout_s = self._timeout_s(request.headers.get(TIMEOUT_HEADER))
        except ValueError as exc:
            return error_response(400, str(exc), rid), NO_BACKEND
        deadline = asyncio.get_running_loop().time() + timeout_s
        body = await request.read()  # already read and bounded by the edge's body limits: no I/O here
        headers = self._forward_headers(request, rid)
        ctx = RequestContext(request.method, request.path, len(body), request.headers, rid)
        outcome = await self._forward(ctx, request.raw_path, headers, body, deadline, timeout_s)
        if outcome.retryable and outcome.failure is not None:
            # Every replica tried failed before answering: for the client, none was available.
            message = f"no healthy replica could take the request: {outcome.failure}"
            return self._no_replica(rid, message), NO_BACKEND
        outcome.response.headers[REQUEST_ID_HEADER] = rid
        return outcome.response, outcome.backend

    def _no_replica(self, rid: str, message: str) -> web.Response:
        return error_response(503, message, rid, retry_after=self._config.retry_after_s)

    def _forward_headers(self, request: web.Request, rid: str) -> list[tuple[str, str]]:
        incoming = request.headers
        drop = _DROP_REQUEST | _connection_tokens(incoming) if "Connection" in incoming else _DROP_REQUEST
        headers = [(k, v) for k, v in incoming.items() if k.lower() not in drop]
        parent = parse_traceparent(incoming.get("traceparent"))
        hop = next_hop(parent, self._ids)
        logs.trace_id_var.set(hop.trace_id)  # this request's log lines carry its trace id
        headers.append(("traceparent", hop.header()))
        state = incoming.get("tracestate")
        if parent is not None and state:
            headers.append(("tracestate", state))
        headers.append((REQUEST_ID_HEADER, rid))
        headers.extend(identity_headers(request).items())
        peer = request.remote
        if peer:
            prior = incoming.get("X-Forwarded-For")
            headers.append(("X-Forwarded-For", f"{prior}, {peer}" if prior else peer))
        return headers

    async def _forward(self, ctx: RequestContext, target: str, headers: list[tuple[str, str]], body: bytes,
                       deadline: float, timeout_s: float) -> _Outcome:
        balancer = self._balancer
        loop = asyncio.get_running_loop()
        tried: list[Endpoint] = []
        outcome: _Outcome | None = None
        saturated = False
        hedge_delay = self._hedger.delay_s(ctx.method, ctx.path)
        for _ in range(self._config.max_retries + 1):
            ep = balancer.pick(ctx, tried)
            if ep is None:
                saturated = balancer.capped(tried)
                break
            if loop.time() >= deadline:
                return self._deadline_passed(timeout_s, ctx.request_id)
            if outcome is None:
                outcome = await self._try(ep, ctx, target, headers, body, deadline, tried, hedge_delay)
            elif not outcome.sent or balancer.retry_budget.try_acquire():
                budgeted = outcome.sent
                self._metrics.retries.inc()
                try:
                    outcome = await self._attempt(ep, ctx, target, headers, body, deadline)
                finally:
                    if budgeted:
                        balancer.retry_budget.release()
            else:
                self._metrics.retry_budget_exhausted.inc()
                break
            if outcome.response.status == 504 and loop.time() >= deadline:
                return self._deadline_passed(timeout_s, ctx.request_id)
            if not outcome.retryable:
                break
            tried.append(ep)
        if outcome is None:
            if saturated:
                return self._saturated(ctx.request_id)
            return _Outcome(self._no_replica(ctx.request_id, "no healthy replica is available"),
                            NO_BACKEND, retryable=False)
        return outcome

    async def _try(self, ep: Endpoint, ctx: RequestContext, target: str, headers: list[tuple[str, str]],
                   body: bytes, deadline: float, tried: list[Endpoint], hedge_delay: float | None) -> _Outcome:
        """The first attempt, raced against a hedged copy on another replica if it is slower than
        ``hedge_delay``; the first answer that is not a retryable failure wins and the other attempt is
        cancelled. A hedge's replica joins ``tried``, so a retry after both failed goes elsewhere."""
        first = self._attempt(ep, ctx, target, headers, body, deadline)
        if hedge_delay is None:
            return await first
        hedge_ep: Endpoint | None = None
        sent_at = self._clock()

        def start_hedge() -> Coroutine[Any, Any, _Outcome] | None:
            nonlocal hedge_ep
            hedge_ep = self._hedge_target(ctx, [*tried, ep], deadline)
            if hedge_ep is None:
                return None
            tried.append(hedge_ep)
            return self._attempt(hedge_ep, ctx, target, headers, body, deadline)

        outcome, from_hedge = await race(first, hedge_delay, start_hedge, _answered)
        if hedge_ep is not None:
            self._metrics.hedges.labels("won" if from_hedge else "lost").inc()
        if from_hedge:
            self._outpaced(ep, sent_at)
        return outcome

    def _outpaced(self, ep: Endpoint, sent_at: float) -> None:
        now = self._clock()
        with contextlib.suppress(KeyError):  # KeyError: removed by discovery meanwhile
            self._balancer.load(ep).outpaced(now - sent_at, now)

    def _hedge_target(self, ctx: RequestContext, exclude: list[Endpoint], deadline: float) -> Endpoint | None:
        """Another replica for a hedge; None when no replica or no hedge budget is left."""
        if asyncio.get_running_loop().time() >= deadline:
            return None
        budget = self._hedger.budget
        if not budget.available():
            self._metrics.hedges_skipped.labels("budget").inc()
            return None
        ep = self._balancer.pick(ctx, exclude)
        if ep is None:
            self._metrics.hedges_skipped.labels("no_backend").inc()
            return None
        budget.take()
        return ep

    def _saturated(self, rid: str) -> _Outcome:
        self._guards.observer.rejected("overloaded")
        message = f"every replica is at its limit of {self._balancer.config.replica_max_inflight} requests in flight"
        return _Outcome(error_response(503, message, rid, retry_after=self._guards.retry_after), NO_BACKEND,
                        retryable=False)

    async def _attempt(self, ep: Endpoint, ctx: RequestContext, target: str, headers: list[tuple[str, str]],
                       body: bytes, deadline: float) -> _Outcome:
        remaining = deadline - asyncio.get_running_loop().time()
        sent = [*headers, (TIMEOUT_HEADER, str(max(1, int(remaining * 1000))))]
        rid = ctx.request_id
        ticket = self._balancer.start(ep)
        started = self._clock()
        status: int | None = None
        connect_error = False
        reply_headers: CIMultiDict[str] | None = None
        try:
            reply = await self._upstreams.get(ep.url).request(ctx.method, target, sent, body, timeout_s=remaining)
        except ConnectError as exc:  # before UpstreamTimeout: a connect timeout sent nothing
            connect_error = True
            outcome = _Outcome(error_response(502, str(exc), rid), ep.url, True, str(exc), sent=False)
        except ResetBeforeResponse as exc:
            status = 502
            outcome = _Outcome(error_response(502, str(exc), rid), ep.url, True, str(exc))
        except PoolExhausted as exc:  # our side is saturated, not the replica: no verdict on it
            outcome = _Outcome(error_response(503, str(exc), rid), ep.url, True, str(exc), sent=False)
        except UpstreamTimeout as exc:
            status = 504
            outcome = _Outcome(error_response(504, str(exc), rid), ep.url, False, str(exc))
        except UpstreamError as exc:  # the response started, then broke: too late to retry
            status = 502
            outcome = _Outcome(error_response(502, str(exc), rid), ep.url, False, str(exc))
        except ValueError as exc:  # a request target or header the pool refuses to put on the wire
            outcome = _Outcome(error_response(400, str(exc), rid), NO_BACKEND, False, str(exc))
        else:
            status = reply.status
            reply_headers = CIMultiDict((k, v) for k, v in reply.headers if k.lower() not in _DROP_RESPONSE)
            response = web.Response(status=status, body=reply.body, headers=reply_headers)
            outcome = _Outcome(response, ep.url, retryable=status == 503)
        finally:
            # Also when the client went away or a hedge won (cancelled): status None says "no verdict".
            latency = self._clock() - started
            report = None if reply_headers is None else reply_headers.get(LOAD_REPORT_HEADER)
            ticket.finish(status=status, connect_error=connect_error, latency_s=latency, report=report)
            self._metrics.observe_attempt(ep.url, latency)
            if status is not None and status < 500:
                self._hedger.observe(ctx.method, ctx.path, latency)
        return outcome

    def _deadline_passed(self, timeout_s: float, rid: str) -> _Outcome:
        message = f"deadline of {timeout_s * 1000:.0f} ms ({TIMEOUT_HEADER}) exceeded"
        return _Outcome(error_response(504, message, rid), NO_BACKEND, retryable=False)


def readiness_probe(upstreams: UpstreamPools) -> Probe:
    """The health probe: ``GET /v2/health/ready`` through the pool; ready means 200."""

    async def probe(ep: Endpoint) -> bool:
        reply = await upstreams.get(ep.url).request("GET", READY_PATH, [("Accept", "application/json")])
        return reply.status == 200

    return probe
