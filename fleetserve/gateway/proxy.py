"""Forward one client request to a replica: pick, send, retry elsewhere when that is safe, answer.

Retry rules, after Envoy's ``retry_on: connect-failure,reset,retriable-status-codes`` with a retry
budget: a request is retried when the replica could not be connected to, closed the connection
before any byte of its response, or answered 503 (overloaded); at most ``max_retries`` times, each
time on a replica not tried yet, only while the balancer's retry budget allows and the deadline
leaves time. Never after a response started to arrive (the pool returns only whole responses, so a
broken one is a 502) and never on a 4xx, which is the client's to see unchanged.

The deadline (``X-Fleetserve-Timeout-Ms``, else the configured default) bounds the whole request,
body upload and retries included (504 past it); what is left of it is forwarded in the same header
so the replica can drop work nobody waits for. When no replica can take the request the answer is
a quick 503 with ``Retry-After``, never a hang.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDict

from fleetserve.gateway.balancer import Balancer, RequestContext
from fleetserve.gateway.config import GatewayConfig
from fleetserve.gateway.endpoint import Endpoint
from fleetserve.gateway.health import Probe
from fleetserve.gateway.metrics import NO_BACKEND, GatewayMetrics
from fleetserve.gateway.tracing import IdGenerator, next_hop, parse_traceparent, request_id
from fleetserve.gateway.upstream import (
    ConnectError,
    PoolExhausted,
    ResetBeforeResponse,
    UpstreamError,
    UpstreamPools,
    UpstreamTimeout,
)
from fleetserve.telemetry import logs

TIMEOUT_HEADER = "X-Fleetserve-Timeout-Ms"
REQUEST_ID_HEADER = "X-Request-ID"
READY_PATH = "/v2/health/ready"
# Hop-by-hop headers (RFC 9110 §7.6.1) and those this proxy sets itself.
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "transfer-encoding", "upgrade", "host", "content-length", "expect",
})
_SET_HERE = frozenset({"traceparent", "tracestate", "x-request-id", "x-forwarded-for", TIMEOUT_HEADER.lower()})
_DROP_REQUEST = _HOP_BY_HOP | _SET_HERE
_DROP_RESPONSE = _HOP_BY_HOP | {"x-request-id"}


def error_response(status: int, message: str, rid: str, retry_after_s: int | None = None) -> web.Response:
    headers = {REQUEST_ID_HEADER: rid}
    if retry_after_s is not None:
        headers["Retry-After"] = str(retry_after_s)
    return web.Response(status=status, body=json.dumps({"error": message}).encode(),
                        content_type="application/json", headers=headers)


@dataclass(slots=True)
class _Outcome:
    response: web.Response
    backend: str
    retryable: bool  # nothing reached the client yet and another replica may do better
    failure: str | None = None  # set when the gateway wrote this answer, not a replica


def _connection_tokens(headers: Mapping[str, str]) -> frozenset[str]:
    value = headers.get("Connection")
    if not value:
        return frozenset()
    return frozenset(token.strip().lower() for token in value.split(","))


class Proxy:
    """The handler behind every proxied route."""

    def __init__(self, config: GatewayConfig, balancer: Balancer, upstreams: UpstreamPools,
                 metrics: GatewayMetrics, *, ids: IdGenerator | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._balancer = balancer
        self._upstreams = upstreams
        self._metrics = metrics
        self._ids = ids if ids is not None else IdGenerator()
        self._clock = clock

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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        limit = self._config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return error_response(413, f"request body of {request.content_length} bytes exceeds the "
                                       f"limit of {limit} bytes", rid), NO_BACKEND
        try:
            async with asyncio.timeout_at(deadline):
                body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return error_response(413, f"request body exceeds the limit of {limit} bytes", rid), NO_BACKEND
        except TimeoutError:
            return error_response(408, f"request body not received within {timeout_s * 1000:.0f} ms",
                                  rid), NO_BACKEND
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
        return error_response(503, message, rid, retry_after_s=self._config.retry_after_s)

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
        for attempt in range(self._config.max_retries + 1):
            ep = balancer.pick(ctx, exclude=tried)
            if ep is None:
                break
            if loop.time() >= deadline:
                return self._deadline_passed(timeout_s, ctx.request_id)
            if attempt == 0:
                outcome = await self._attempt(ep, ctx, target, headers, body, deadline)
            elif balancer.retry_budget.try_acquire():
                self._metrics.retries.inc()
                try:
                    outcome = await self._attempt(ep, ctx, target, headers, body, deadline)
                finally:
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
            return _Outcome(self._no_replica(ctx.request_id, "no healthy replica is available"),
                            NO_BACKEND, retryable=False)
        return outcome

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
            outcome = _Outcome(error_response(502, str(exc), rid), ep.url, True, str(exc))
        except ResetBeforeResponse as exc:
            status = 502
            outcome = _Outcome(error_response(502, str(exc), rid), ep.url, True, str(exc))
        except PoolExhausted as exc:  # our side is saturated, not the replica: no verdict on it
            outcome = _Outcome(error_response(503, str(exc), rid), ep.url, True, str(exc))
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
            # Also when the client went away (cancelled): status None tells the balancer "no verdict".
            latency = self._clock() - started
            ticket.finish(status=status, connect_error=connect_error, latency_s=latency, headers=reply_headers)
            self._metrics.observe_attempt(ep.url, latency)
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
